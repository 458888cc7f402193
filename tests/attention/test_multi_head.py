"""`MultiHeadAttention` against flax.linen, torch's scaled_dot_product_attention and jax.nn.

Torch's nn.MultiheadAttention parity (forward, weights, gradients) is in
test_torch_import.py. Here: the same parameters give flax.linen.MultiHeadDotProductAttention's
outputs and weights; grouped / multi-query heads match torch SDPA (enable_gqa) and
jax.nn.dot_product_attention on projections computed in NumPy, and equal full heads with
the key/value projections repeated; chunked and banded equal dense; the KV cache decodes
token by token (or a few tokens at a time) to the full causal pass; attention dropout;
invalid configurations.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from research.attention.dense import weighted_values
from research.attention.multi_head import MultiHeadAttention

# Compared with flax, torch SDPA, jax.nn and NumPy within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

B, T, D, H = 2, 7, 12, 4     # batch, length, features, heads (head_dim 3)
ATOL = 1e-5


def normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def init(module, *inputs, seed=0):
  """Random parameters (biases too, so that every parameter matters) of the shapes
  `module.init` would give; `eval_shape` traces without compiling."""
  shapes = jax.eval_shape(module.init, jax.random.key(0), *inputs)["params"]
  leaves, tree = jax.tree.flatten(shapes)
  return jax.tree.unflatten(tree, [0.4 * normal(seed + i, s.shape) for i, s in enumerate(leaves)])


def jit_apply(module, **static):
  """module.apply compiled as one program, with static keywords (is_causal, mutable, ...):
  cheaper than compiling op by op, and the chunked strategy's loops are traced once."""
  return jax.jit(functools.partial(module.apply, **static))


def project(x, p):
  """NumPy DenseGeneral: x [b, t, D] @ kernel [D, heads, d] + bias."""
  return np.einsum("btf,fhd->bthd", np.asarray(x), np.asarray(p["kernel"])) + np.asarray(p["bias"])


def output(heads, p):
  """NumPy output projection: heads [b, t, H, d] @ kernel [H, d, out] + bias."""
  return np.einsum("bthd,hdo->bto", np.asarray(heads), np.asarray(p["kernel"])) + np.asarray(p["bias"])


@pytest.mark.slow
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_matches_flax_multi_head_dot_product_attention(cross):
  x = normal(0, (B, T, D))
  kv = normal(1, (B, T + 2, 5)) if cross else None
  mask = normal(2, (B, 1, T, T + 2 if cross else T)) > -0.5
  mask = mask.at[..., 0].set(True)
  ours = MultiHeadAttention(num_heads=H, out_features=6, implementation="dense")
  params = init(ours, x, kv)
  out, state = jit_apply(ours, mutable=["intermediates"])({"params": params}, x, kv, mask=mask)
  theirs = nn.MultiHeadDotProductAttention(num_heads=H, out_features=6)
  expected, their_state = jit_apply(theirs, sow_weights=True, mutable=["intermediates"])(
      {"params": params}, x, kv, mask=mask)
  np.testing.assert_allclose(out, expected, atol=ATOL, rtol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0],
                             their_state["intermediates"]["attention_weights"][0], atol=ATOL)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_heads_match_torch_sdpa(num_kv_heads):
  """Causal grouped-query attention vs torch SDPA (enable_gqa) on NumPy projections."""
  x = normal(0, (B, T, D))
  module = MultiHeadAttention(num_heads=H, num_kv_heads=num_kv_heads)
  params = init(module, x)
  out = jit_apply(module, is_causal=True)({"params": params}, x)
  q, k, v = (torch.from_numpy(project(x, params[n])).transpose(1, 2) for n in ("query", "key", "value"))
  heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
  np.testing.assert_allclose(out, output(heads.transpose(1, 2).numpy(), params["out"]),
                             atol=ATOL, rtol=1e-5)


def test_weighted_values_reads_key_value_head_h_over_g():
  """The dropout path's weights · v with grouped heads: query head h reads kv head ⌊h / G⌋."""
  weights, v = normal(0, (B, H, 3, 5)), normal(1, (B, 5, 2, 6))
  expected = np.einsum("bhqk,bkhd->bqhd", weights, np.repeat(v, H // 2, axis=2))
  np.testing.assert_allclose(weighted_values(weights, v), expected, atol=ATOL, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_multi_query_equals_full_heads_with_repeated_key_value_projections(implementation):
  x = normal(0, (B, T, D))
  mqa = MultiHeadAttention(num_heads=H, num_kv_heads=1, implementation=implementation, block_size=3)
  params = init(mqa, x)
  repeat = lambda p: jax.tree.map(lambda a: jnp.repeat(a, H, axis=-2), p)  # kv head axis: 1 -> H
  full_params = dict(params, key=repeat(params["key"]), value=repeat(params["value"]))
  full = MultiHeadAttention(num_heads=H, implementation=implementation, block_size=3)
  lengths = jnp.array([T, 4])
  np.testing.assert_allclose(
      jit_apply(mqa)({"params": params}, x, key_value_seq_lengths=lengths),
      jit_apply(full)({"params": full_params}, x, key_value_seq_lengths=lengths),
      atol=ATOL, rtol=1e-5)


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(batch=st.just(2), q_len=st.sampled_from([1, 4]), kv_len=st.sampled_from([1, 5]),
       groups=st.sampled_from([(2, 1), (2, 2)]), seed=st.integers(0, 2**16))
def test_shapes_and_masks_match_jax_nn(batch, q_len, kv_len, groups, seed):
  """Lengths, heads and masks: the NumPy projections + jax.nn.dot_product_attention."""
  num_heads, num_kv_heads = groups
  xq, xkv = normal(seed, (batch, q_len, 4)), normal(seed + 1, (batch, kv_len, 3))
  mask = (normal(seed + 2, (batch, num_heads, q_len, kv_len)) > 0).at[..., 0].set(True)
  dense = lambda i, fan_in, heads: {"kernel": normal(seed + i, (fan_in, heads, 4)),
                                    "bias": normal(seed + i + 1, (heads, 4))}
  params = {"query": dense(3, 4, num_heads), "key": dense(5, 3, num_kv_heads),
            "value": dense(7, 3, num_kv_heads),
            "out": {"kernel": normal(seed + 9, (num_heads, 4, 4)), "bias": normal(seed + 10, (4,))}}
  module = MultiHeadAttention(num_heads=num_heads, num_kv_heads=num_kv_heads, qkv_features=4 * num_heads)
  out = jit_apply(module)({"params": params}, xq, xkv, mask=mask)
  q, k, v = (project(x, params[n]) for x, n in ((xq, "query"), (xkv, "key"), (xkv, "value")))
  heads = jax.jit(jax.nn.dot_product_attention)(q, k, v, mask=mask)
  assert out.shape == (batch, q_len, 4)
  np.testing.assert_allclose(out, output(heads, params["out"]), atol=ATOL, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("implementation,window", [("chunked", None), ("chunked", (2, 1)),
                                                   ("banded", 3)])
def test_chunked_and_banded_equal_dense(implementation, window):
  x = normal(0, (B, 10, D))
  dense = MultiHeadAttention(num_heads=H, num_kv_heads=2, window=window)
  params = init(dense, x)
  other = MultiHeadAttention(num_heads=H, num_kv_heads=2, window=window,
                             implementation=implementation, block_size=4)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, init(other, x))
  lengths = jnp.array([10, 6])
  out, expected = (jit_apply(m, is_causal=True)({"params": params}, x, key_value_seq_lengths=lengths)
                   for m in (other, dense))
  np.testing.assert_allclose(out, expected, atol=ATOL, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("implementation,window,step_sizes", [
    ("dense", None, [1] * T), ("chunked", None, [1] * T), ("dense", 2, [3, 1, 2, 1]),
    ("chunked", 2, [1] * T), ("banded", (2, 0), [1] * T)],
    ids=["dense", "chunked", "dense_window_multi_token", "chunked_window", "banded_window"])
def test_kv_cache_decoding_equals_full_causal_pass(implementation, window, step_sizes):
  x = normal(0, (B, T, D))
  kwargs = dict(num_heads=H, num_kv_heads=2, window=window, implementation=implementation,
                block_size=4)
  decoder = MultiHeadAttention(decode=True, **kwargs)
  cache_shapes = jax.eval_shape(decoder.init, jax.random.key(0), x)["cache"]
  params, cache = init(decoder, x), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
  assert cache["cached_key"].shape == (B, T, 2, D // H)
  full = jit_apply(MultiHeadAttention(**kwargs), is_causal=True)({"params": params}, x)
  decode_step = jit_apply(decoder, mutable=["cache"])
  steps, start = [], 0
  for size in step_sizes:
    out, updated = decode_step({"params": params, "cache": cache}, x[:, start:start + size])
    cache, start = updated["cache"], start + size
    steps.append(out)
  assert int(cache["cache_index"]) == T
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=ATOL, rtol=1e-5)


def test_kv_cache_rejects_cross_attention():
  x = normal(0, (B, T, D))
  with pytest.raises(ValueError, match="inputs_kv"):
    MultiHeadAttention(num_heads=H, decode=True).init(jax.random.key(0), x, x)


@pytest.mark.slow
def test_attention_dropout():
  x = normal(0, (B, T, D))
  module = MultiHeadAttention(num_heads=H, dropout_rate=0.5)
  params = init(module, x)
  no_dropout = jit_apply(MultiHeadAttention(num_heads=H))({"params": params}, x)
  np.testing.assert_array_equal(jit_apply(module)({"params": params}, x), no_dropout)

  train_apply = jit_apply(module, train=True)
  train = lambda seed: train_apply({"params": params}, x, rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(train(1), train(1))
  assert np.abs(train(1) - no_dropout).max() > 1e-2
  assert np.abs(train(1) - train(2)).max() > 1e-2
  # inverted dropout is unbiased, E[mask / (1 − p)] = 1: averaged over 256 masks (256 copies
  # of the batch), the train output is ~√256 times closer to the eval output than one mask's
  copies = train_apply({"params": params}, jnp.tile(x, (256, 1, 1)),
                       rngs={"dropout": jax.random.key(3)})
  mean = copies.reshape((256,) + x.shape).mean(0)
  assert np.abs(mean - no_dropout).mean() < 0.15 * np.abs(train(1) - no_dropout).mean()

  chunked = MultiHeadAttention(num_heads=H, dropout_rate=0.5, implementation="chunked")
  with pytest.raises(ValueError, match="implementation='dense'"):
    chunked.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})


@pytest.mark.parametrize("config,match", [
    (dict(num_heads=5), r"qkv_features \(12\).*num_heads \(5\)"),
    (dict(num_heads=4, qkv_features=10), r"qkv_features \(10\).*num_heads \(4\)"),
    (dict(num_heads=4, num_kv_heads=3), r"num_kv_heads \(3\).*num_heads \(4\)"),
    (dict(num_heads=4, implementation="flash"), "implementation must be one of"),
    (dict(num_heads=4, dropout_rate=1.0), "dropout_rate"),
    (dict(num_heads=4, window=-1), "window"),
])
def test_invalid_configurations_raise(config, match):
  with pytest.raises(ValueError, match=match):
    MultiHeadAttention(**config).init(jax.random.key(0), jnp.zeros((1, 3, D)))
