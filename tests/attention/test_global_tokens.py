"""Longformer global tokens (`global_tokens=`) against jax.nn with a mask built here in
NumPy from the rule in Beltagy et al. 2020 (a global token sees every key, every query sees
it), within causality and key lengths; and `Visibility.block_map` against the dense mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention import dot_product_attention, registry
from research.attention.masks import Visibility

pytestmark = pytest.mark.usefixtures("highest_precision")


def reference_mask(q_len, kv_len, *, is_causal=False, window=None, global_tokens=(),
                   lengths=None):
  """bool [b|1, 1, q_len, kv_len], written from the definition without research code."""
  i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  local = np.ones((q_len, kv_len), bool)
  if window is not None:
    left, right = (window, window) if isinstance(window, int) else window
    local = (j >= i - left) & (j <= i + right)
  if is_causal:
    local &= j <= i
  is_global = np.isin(i, global_tokens) | np.isin(j, global_tokens)
  visible = local | is_global
  if is_causal:
    visible &= j <= i
  visible = visible[None, None]
  if lengths is not None:
    visible = visible & (j < np.asarray(lengths)[:, None, None, None])
  return visible


def _inputs(seed, b, length, heads, kv_heads, d):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal((b, length, h, d)), jnp.float32)
               for h in (heads, kv_heads, kv_heads))


PATTERNS = {
    "causal_window": dict(is_causal=True, window=3, global_tokens=[0, 13]),
    "two_sided_lengths": dict(window=(2, 4), global_tokens=[5, 6, 20], lengths=[22, 15]),
    "causal_only": dict(is_causal=True, global_tokens=[1]),
    "mask_bias": dict(window=3, global_tokens=[2, 17], mask=True, bias=True),
}
IMPLEMENTATIONS = ("dense", "chunked", "banded")
LONG = {("causal_window", "chunked")}   # in the long tier: a grid case beyond one per family


@pytest.mark.slow
@pytest.mark.parametrize("pattern, implementation", [
    pytest.param(pattern, implementation, id=f"{name}-{implementation}",
                 marks=pytest.mark.long if (name, implementation) in LONG else ())
    for name, pattern in PATTERNS.items() for implementation in IMPLEMENTATIONS])
def test_matches_jax_nn_with_the_longformer_mask(implementation, pattern):
  b, length, heads, kv_heads, d = 2, 22, 4, 2, 8
  q, k, v = _inputs(0, b, length, heads, kv_heads, d)
  pattern = dict(pattern)
  lengths = pattern.pop("lengths", None)
  rng = np.random.default_rng(1)
  user_mask = rng.random((b, 1, length, length)) > 0.2 if pattern.pop("mask", False) else None
  bias = (jnp.asarray(rng.standard_normal((1, heads, length, length)), jnp.float32)
          if pattern.pop("bias", False) else None)
  if implementation == "banded" and "window" not in pattern:
    pytest.skip("banded needs a window")
  mask = reference_mask(length, length, lengths=lengths, **pattern)
  extra = {} if lengths is None else dict(key_value_seq_lengths=jnp.array(lengths))
  if user_mask is not None:
    mask = mask & user_mask
    extra["mask"] = jnp.asarray(user_mask)

  def ours(q, k, v):
    return dot_product_attention(q, k, v, bias=bias, implementation=implementation,
                                 block_size=8, **pattern, **extra)

  def theirs(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=jnp.asarray(mask))

  seen = np.moveaxis(mask.any(-1), 1, 2)[..., None]                   # [b, q, 1, 1]
  out = jax.jit(ours)(q, k, v)
  np.testing.assert_allclose(np.where(seen, out, 0), np.where(seen, theirs(q, k, v), 0), atol=2e-5)
  np.testing.assert_array_equal(np.where(seen, 0, out), 0)
  # the gradients of the two strategies with a backward of their own, on the causal case
  if implementation != "dense" and pattern.get("is_causal") and "window" in pattern:
    assert seen.all()
    loss = lambda f: lambda q, k, v: (f(q, k, v) * jnp.cos(v.sum() + q)).sum()
    for ours_grad, theirs_grad in zip(jax.jit(jax.grad(loss(ours), (0, 1, 2)))(q, k, v),
                                      jax.grad(loss(theirs), (0, 1, 2))(q, k, v), strict=True):
      np.testing.assert_allclose(ours_grad, theirs_grad, atol=5e-5)


@pytest.mark.slow
def test_global_tokens_change_the_output_only_through_the_mask():
  """Without global tokens the pattern is the plain window (the empty list is no pattern)."""
  q, k, v = _inputs(1, 1, 20, 2, 2, 8)
  plain = dot_product_attention(q, k, v, is_causal=True, window=2, implementation="chunked")
  empty = dot_product_attention(q, k, v, is_causal=True, window=2, global_tokens=[],
                                implementation="chunked")
  with_global = dot_product_attention(q, k, v, is_causal=True, window=2, global_tokens=[0],
                                      implementation="chunked")
  np.testing.assert_array_equal(empty, plain)
  np.testing.assert_array_equal(with_global[:, :3], plain[:, :3])   # key 0 is in their window
  assert np.abs(with_global[:, 3:] - plain[:, 3:]).min() > 0         # a key outside it


@pytest.mark.parametrize("global_tokens,message", [
    ([0, 20], r"global_tokens must lie in \[0, 20\)"),
    ([-1], r"global_tokens must lie in \[0, 20\)"),
    ([[0, 1]], "1-D sequence of int positions"),
    ([0.5], "1-D sequence of int positions"),
])
def test_bad_global_tokens_name_the_problem(global_tokens, message):
  q, k, v = _inputs(2, 1, 20, 2, 2, 8)
  with pytest.raises(ValueError, match=message):
    dot_product_attention(q, k, v, window=2, global_tokens=global_tokens)


def test_traced_global_tokens_are_refused_before_tracing_the_kernel():
  q, k, v = _inputs(3, 1, 20, 2, 2, 8)
  attend = jax.jit(lambda g: dot_product_attention(q, k, v, window=2, global_tokens=g))
  with pytest.raises(ValueError, match="global_tokens must be static positions"):
    attend(jnp.array([0, 1]))


def test_an_implementation_without_global_tokens_names_those_with_them():
  request = registry.Request(causal=True, window=(8, 0), global_tokens=True,
                                    dtype="bfloat16", platform="gpu", q_len=64, kv_len=64)
  with pytest.raises(ValueError, match=r"cannot do this: global tokens; implementations that "
                                       r"can: 'dense', 'chunked', 'banded', 'pallas_gpu'$"):
    registry.check("cudnn", request)


@pytest.mark.parametrize("pattern", [
    dict(is_causal=True),
    dict(is_causal=True, window=5),
    dict(window=(3, 9)),
    dict(is_causal=True, window=4, global_tokens=(0, 1, 29)),
    dict(window=2, global_tokens=(13,)),
    dict(),
], ids=["causal", "causal_window", "two_sided", "causal_window_global", "window_global", "full"])
@pytest.mark.parametrize("q_len,kv_len,q_block,k_block", [(37, 37, 8, 8), (30, 45, 16, 4)])
def test_block_map_is_the_dense_mask_reduced_over_blocks(pattern, q_len, kv_len, q_block,
                                                         k_block):
  """0: no query of the block sees a key of it, 2: every query sees every (real) key, 1:
  between; a key block running past kv_len is never 2 (its padding needs the mask)."""
  visibility = Visibility.make(pattern.get("is_causal", False), pattern.get("window"),
                               global_tokens=pattern.get("global_tokens", ()))
  blocks = visibility.block_map(q_len, kv_len, q_block, k_block)
  mask = reference_mask(q_len, kv_len, **pattern)[0, 0]
  nq, nk = -(-q_len // q_block), -(-kv_len // k_block)
  assert blocks.shape == (nq, nk)
  for i in range(nq):
    for j in range(nk):
      tile = mask[i * q_block:(i + 1) * q_block, j * k_block:(j + 1) * k_block]
      ragged = (j + 1) * k_block > kv_len
      expected = 2 if tile.all() and not ragged else int(tile.any())
      assert blocks[i, j] == expected, (i, j)
