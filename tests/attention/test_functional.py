"""dot_product_attention against jax.nn.dot_product_attention and torch's SDPA."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings

from research.attention import dot_product_attention
from research.attention.masks import Visibility, visit_lists

# Compared with jax.nn and torch SDPA within 2e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

IMPLEMENTATIONS = ("dense", "chunked", "banded")


def _inputs(seed, b, q_len, kv_len, heads, kv_heads, d, dtype=np.float32):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, q_len, heads, d))
  k = rng.standard_normal((b, kv_len, kv_heads, d))
  v = rng.standard_normal((b, kv_len, kv_heads, d))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _visible_rows(b, heads, q_len, kv_len, is_causal, window, mask):
  """[b, q_len, heads, 1]: does query i of head h see any key? (built from masks.py-free numpy)"""
  i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  visible = np.ones((q_len, kv_len), bool)
  if window is not None:
    left, right = (window, window) if isinstance(window, int) else window
    visible &= (j >= i - left) & (j <= i + right)
  if is_causal:
    visible &= j <= i
  visible = np.broadcast_to(visible, (b, heads, q_len, kv_len))
  if mask is not None:
    visible = visible & np.asarray(mask)
  return jnp.asarray(visible.any(-1).transpose(0, 2, 1)[..., None])


@st.composite
def attention_cases(draw):
  kv_heads = draw(st.sampled_from([1, 2]))
  return dict(
      seed=draw(st.integers(0, 2**16)),
      b=draw(st.integers(1, 2)),
      q_len=draw(st.integers(1, 40)),
      kv_len=draw(st.integers(1, 40)),
      kv_heads=kv_heads,
      heads=kv_heads * draw(st.sampled_from([1, 2])),
      d=draw(st.sampled_from([4, 8])),
      is_causal=draw(st.booleans()),
      window=draw(st.sampled_from([None, 0, 3, (2, 5), (6, 1)])),
      use_mask=draw(st.booleans()),
      use_bias=draw(st.booleans()),
      implementation=draw(st.sampled_from(IMPLEMENTATIONS)),
      block_size=draw(st.sampled_from([4, 7, 16])),
      dtype=draw(st.sampled_from([jnp.float32, jnp.bfloat16])),
  )


# Every example compiles new shapes: few examples, and no shrinking (it would recompile for minutes).
@pytest.mark.slow
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(attention_cases())
def test_matches_jax_nn(case):
  if case["implementation"] == "banded" and case["window"] is None:
    case["window"] = 4
  b, q_len, kv_len, heads = case["b"], case["q_len"], case["kv_len"], case["heads"]
  q, k, v = _inputs(case["seed"], b, q_len, kv_len, heads, case["kv_heads"], case["d"], case["dtype"])
  rng = np.random.default_rng(case["seed"] + 1)
  mask = jnp.asarray(rng.random((b, 1, q_len, kv_len)) > 0.25) if case["use_mask"] else None
  bias = jnp.asarray(rng.standard_normal((1, heads, q_len, kv_len)), jnp.float32) if case["use_bias"] else None
  window = case["window"]
  local = (window, window) if isinstance(window, int) else window

  def reference(q, k, v, bias):
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=case["is_causal"],
                                        local_window_size=local)

  def ours(q, k, v, bias):
    return dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=case["is_causal"],
                                 window=window, implementation=case["implementation"],
                                 block_size=case["block_size"])

  seen = _visible_rows(b, heads, q_len, kv_len, case["is_causal"], window, mask)
  out = jax.jit(ours)(q, k, v, bias)
  assert out.dtype == case["dtype"]
  # the reference runs in float32 on the same (possibly bfloat16-rounded) inputs
  expected = reference(*(x.astype(jnp.float32) for x in (q, k, v)), bias)
  atol = 2e-5 if case["dtype"] == jnp.float32 else 3e-2
  np.testing.assert_allclose(jnp.where(seen, out.astype(jnp.float32), 0), jnp.where(seen, expected, 0),
                             atol=atol)
  # jax.nn averages all values for a query that sees nothing; we return zeros
  np.testing.assert_array_equal(jnp.where(seen, 0, out.astype(jnp.float32)), 0)

  if bool(seen.all()) and case["dtype"] == jnp.float32:  # gradients agree wherever both definitions coincide
    cotangent = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
    argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    loss = lambda fn: lambda *a: jnp.vdot(fn(*a), cotangent)
    grads = jax.jit(jax.grad(loss(ours), argnums))(q, k, v, bias)
    expected_grads = jax.jit(jax.grad(loss(reference), argnums))(q, k, v, bias)
    for g, e in zip(grads, expected_grads):
      np.testing.assert_allclose(g, e, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_sdpa(implementation, is_causal):
  b, heads, length, d = 2, 4, 37, 16
  q, k, v = _inputs(3, b, length, length, heads, heads, d)
  window = 9 if implementation == "banded" else None
  rng = np.random.default_rng(4)
  padding = np.arange(length)[None, :] < np.array([length, 20])[:, None]       # [b, kv_len]
  visible = np.broadcast_to(padding[:, None, None, :], (b, 1, length, length)).copy()
  if window is not None:
    offset = np.arange(length)[None, :] - np.arange(length)[:, None]
    visible &= np.abs(offset) <= window
  if is_causal:
    visible &= np.tril(np.ones((length, length), bool))
  cotangent = rng.standard_normal((b, length, heads, d)).astype(np.float32)

  tq, tk, tv = (torch.tensor(np.asarray(x)).transpose(1, 2).requires_grad_() for x in (q, k, v))
  t_out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(visible))
  t_out.backward(torch.tensor(cotangent).transpose(1, 2))

  def ours(q, k, v):
    return dot_product_attention(q, k, v, is_causal=is_causal, window=window,
                                 key_value_seq_lengths=jnp.array([length, 20]),
                                 implementation=implementation, block_size=8)

  out, vjp = jax.vjp(ours, q, k, v)
  np.testing.assert_allclose(out, t_out.detach().transpose(1, 2).numpy(), atol=2e-5)
  for g, t in zip(vjp(jnp.asarray(cotangent)), (tq, tk, tv)):
    np.testing.assert_allclose(g, t.grad.transpose(1, 2).numpy(), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_query_without_visible_key_gives_zeros_and_finite_gradients(implementation):
  q, k, v = _inputs(5, 1, 12, 12, 2, 2, 8)
  mask = np.ones((1, 1, 12, 12), bool)
  mask[..., 3, :] = False                       # query 3 sees nothing
  mask = jnp.asarray(mask)
  fn = lambda q, k, v: dot_product_attention(q, k, v, mask=mask, window=4, implementation=implementation,
                                             block_size=4)
  out = fn(q, k, v)
  np.testing.assert_array_equal(out[:, 3], 0)
  for g in jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), (0, 1, 2))(q, k, v):
    assert bool(jnp.all(jnp.isfinite(g)))
  np.testing.assert_array_equal(jax.grad(lambda q: jnp.sum(fn(q, k, v) ** 2))(q)[:, 3], 0)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype,atol", [(jnp.bfloat16, 6e-2), (jnp.float16, 1e-2)])
def test_low_precision_inputs(implementation, dtype, atol):
  q, k, v = _inputs(6, 2, 33, 33, 4, 2, 16)
  fn = functools.partial(dot_product_attention, is_causal=True, window=8,
                         implementation=implementation, block_size=8)
  low = fn(q.astype(dtype), k.astype(dtype), v.astype(dtype))
  assert low.dtype == dtype
  np.testing.assert_allclose(low.astype(jnp.float32), fn(q, k, v), atol=atol)


def test_dense_returns_the_weights_of_jax_nn():
  q, k, v = _inputs(7, 2, 10, 14, 4, 4, 8)
  out, weights = dot_product_attention(q, k, v, return_weights=True)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
  np.testing.assert_allclose(weights, jax.nn.softmax(logits, axis=-1), atol=1e-6)
  np.testing.assert_allclose(out, jnp.einsum("bhqk,bkhd->bqhd", weights, v), atol=1e-5)


def _temp_bytes(implementation, length):
  x = jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32)
  fn = lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, window=32 if implementation == "banded" else None,
                                             implementation=implementation).sum()
  compiled = jax.jit(jax.grad(fn, (0, 1, 2))).lower(x, x, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["chunked", "banded"])
def test_forward_backward_memory_grows_linearly(implementation):
  small, large = _temp_bytes(implementation, 1024), _temp_bytes(implementation, 4096)
  assert large < 5 * small            # quadratic would be 16×
  assert _temp_bytes("dense", 4096) > 10 * _temp_bytes("dense", 1024)   # the check can fail


@pytest.mark.parametrize("kwargs,match", [
    (dict(implementation="flash"), "implementation must be one of"),
    (dict(window=-1), "window sizes must be >= 0"),
    (dict(window=(1, 2, 3)), "window must be None, an int"),
    (dict(implementation="chunked", return_weights=True), "return_weights=True needs"),
    (dict(implementation="banded"), "needs a window"),
    (dict(mask=jnp.ones((3, 1, 5, 5), bool)), "does not broadcast"),
    (dict(mask=jnp.ones((1, 1, 5, 5))), "mask must be boolean"),
    (dict(block_size=0), "block_size must be a positive int"),
    (dict(key_value_seq_lengths=jnp.array([5])), r"key_value_seq_lengths must have shape"),
])
def test_bad_arguments_are_named(kwargs, match):
  q, k, v = _inputs(8, 2, 5, 5, 4, 2, 8)
  with pytest.raises(ValueError, match=match):
    dot_product_attention(q, k, v, **kwargs)


def test_heads_must_divide():
  q, k, v = _inputs(9, 1, 5, 5, 3, 2, 8)
  with pytest.raises(ValueError, match="must divide query heads"):
    dot_product_attention(q, k, v)


def test_visit_lists_cover_exactly_the_visible_key_blocks():
  """The blocks chunked / banded / pallas_gpu loop over: per query block of 8, exactly the
  key blocks of 8 some query sees (partial ones first), the wholly visible ones last."""
  vis = Visibility.make(is_causal=True, window=(5, 3))
  dense = np.asarray(vis.dense(40, 40))[0]
  visits, counts = visit_lists(vis, (40, 40), (40, 40), (8, 8), False)
  for i in range(5):
    blocks = dense[8 * i:8 * i + 8].reshape(8, 5, 8)
    seen, full = blocks.any((0, 2)), blocks.all((0, 2))
    partial, every = counts[i]
    assert set(visits[i, :every]) == set(np.flatnonzero(seen))
    assert set(visits[i, partial:every]) == set(np.flatnonzero(full))


@pytest.mark.slow
@pytest.mark.parametrize("bias_shape", [(1, 2, 8, 35), (2, 1, 1, 35), (1, 1, 8, 1)])
def test_banded_with_a_single_query_block_reads_its_bias(bias_shape):
  """q_len ≤ block: one query block, whose bias rows must not be taken for a broadcast."""
  q, k, v = _inputs(0, 2, 8, 35, 2, 2, 8, jnp.float32)
  bias = jnp.asarray(np.random.default_rng(1).standard_normal(bias_shape), jnp.float32)
  mask = jnp.asarray(np.random.default_rng(2).random((2, 1, 8, 35)) > 0.2)
  expected = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, local_window_size=(4, 4))
  out = dot_product_attention(q, k, v, bias=bias, mask=mask, window=4, implementation="banded",
                              block_size=16)
  seen = _visible_rows(2, 2, 8, 35, False, 4, mask)
  np.testing.assert_allclose(jnp.where(seen, out, 0), jnp.where(seen, expected, 0), atol=2e-5)
