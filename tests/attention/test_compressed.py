"""Linformer and memory-compressed attention against their formulas written here in NumPy.

  Linformer:   K' = E K, V' = F V,   out = softmax(q K'ᵀ / √d) V'
  compressed:  K'_j = mean | max of K_{c·j+i} over the block's real positions,
               or Σ_{i<c} K_{c·j+i} W_i + b (a missing position contributes nothing);
               blocks with no real position are masked out.

With c = 1 and an identity convolution, memory-compressed attention is plain multi-head
attention: flax.linen.MultiHeadDotProductAttention with the same parameters.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention.compressed import (
  LinformerSelfAttention,
  MemoryCompressedAttention,
  linformer_attention,
)

# Compared with NumPy formulas and flax within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

B, D, H, HEAD = 2, 6, 2, 3    # batch, features, heads, head size
ATOL = 1e-5


def normal(seed, shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def init(module, *inputs):
  """Random parameters of the shapes `module.init` gives (biases non-zero too)."""
  shapes = jax.eval_shape(module.init, jax.random.key(0), *inputs)["params"]
  leaves, tree = jax.tree.flatten(shapes)
  return jax.tree.unflatten(tree, [0.5 * normal(i + 10, s.shape) for i, s in enumerate(leaves)])


def jit_apply(module, **static):
  return jax.jit(functools.partial(module.apply, **static))


def project(x, p):
  return np.einsum("btf,fhd->bthd", x, p["kernel"]) + p["bias"]


def output(heads, p):
  return np.einsum("bthd,hdo->bto", heads, p["kernel"]) + p["bias"]


def numpy_attention(q, k, v, visible=None):
  """q [q, H, d], k / v [m, H, d], visible [m] -> out [q, H, d], weights [H, q, m]."""
  logits = np.einsum("qhd,mhd->hqm", q, k) / np.sqrt(q.shape[-1])
  if visible is not None:
    logits = np.where(visible, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("hqm,mhd->qhd", weights, v), weights


def numpy_linformer(q, k, v, e, f, lengths):
  """Per batch row: only the first `length` keys, and the same columns of E and F."""
  outs = []
  for b, n in enumerate(lengths):
    k_proj = np.einsum("pn,nhd->phd", e[:, :n], k[b, :n])
    v_proj = np.einsum("pn,nhd->phd", f[:, :n], v[b, :n])
    outs.append(numpy_attention(q[b], k_proj, v_proj))
  return np.stack([o for o, _ in outs]), np.stack([w for _, w in outs])


@pytest.mark.parametrize("lengths", [None, [5, 2]], ids=["full", "padded"])
def test_linformer_attention_matches_formula(lengths):
  q, k, v = normal(0, (B, 4, H, HEAD)), normal(1, (B, 5, H, HEAD)), normal(2, (B, 5, H, HEAD))
  e, f = normal(3, (3, 8)), normal(4, (3, 8))      # proj_len 3, max_len 8 > kv_len 5
  out, weights = linformer_attention(q, k, v, e, f, key_value_seq_lengths=lengths,
                                     return_weights=True)
  expected, expected_weights = numpy_linformer(q, k, v, e, f, lengths or [5, 5])
  np.testing.assert_allclose(out, expected, atol=ATOL, rtol=1e-5)
  np.testing.assert_allclose(weights, expected_weights, atol=ATOL)


def test_linformer_rejects_long_inputs_and_mismatched_projections():
  q = k = v = jnp.zeros((1, 5, H, HEAD))
  with pytest.raises(ValueError, match=r"kv_len \(5\) exceeds max_len \(4\)"):
    linformer_attention(q, k, v, jnp.zeros((3, 4)), jnp.zeros((3, 4)))
  with pytest.raises(ValueError, match="e and f"):
    linformer_attention(q, k, v, jnp.zeros((3, 8)), jnp.zeros((2, 8)))


@pytest.mark.parametrize("share_kv", [False, True], ids=["separate", "shared"])
def test_linformer_module_matches_formula(share_kv):
  x = normal(5, (B, 5, D))
  module = LinformerSelfAttention(num_heads=H, qkv_features=H * HEAD, proj_len=3, max_len=8,
                                  share_kv=share_kv)
  params = init(module, x)
  assert ("f" in params) != share_kv
  out, state = jit_apply(module, mutable=["intermediates"])({"params": params}, x,
                                                           key_value_seq_lengths=jnp.array([5, 3]))
  q, k, v = (project(x, params[n]) for n in ("query", "key", "value"))
  heads, weights = numpy_linformer(q, k, v, params["e"], params["e" if share_kv else "f"], [5, 3])
  np.testing.assert_allclose(out, output(heads, params["out"]), atol=ATOL, rtol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0], weights, atol=ATOL)


def numpy_compress(x, length, c, method, conv=None):
  """x [n, H, d] -> compressed [m, H, d] and block validity [m], m = ⌈n / c⌉."""
  n, heads, d = x.shape
  blocks, valid = [], []
  for start in range(0, n, c):
    real = x[start:min(start + c, length)].reshape(-1, heads * d)   # the block's real keys
    valid.append(len(real) > 0)
    if method == "conv":
      taps = np.zeros((c, heads * d), np.float32)
      taps[:len(real)] = real
      blocks.append(np.einsum("cf,cfg->g", taps, conv["kernel"]) + conv["bias"])
    elif not len(real):
      blocks.append(np.zeros(heads * d, np.float32))
    else:
      blocks.append(real.mean(0) if method == "avg" else real.max(0))
  return np.stack(blocks).reshape(-1, heads, d), np.array(valid)


@pytest.mark.parametrize("method,c", [("avg", 3), ("max", 3), ("conv", 2)])
def test_memory_compressed_matches_formula(method, c):
  """kv_len 7 is not a multiple of c; the second row is padded to length 2 (one empty block)."""
  xq, xkv, lengths = normal(6, (B, 4, D)), normal(7, (B, 7, 5)), [7, 2]
  module = MemoryCompressedAttention(num_heads=H, qkv_features=H * HEAD, compression=c,
                                     method=method, implementation="dense")
  params = init(module, xq, xkv)
  out, state = jit_apply(module, mutable=["intermediates"])(
      {"params": params}, xq, xkv, key_value_seq_lengths=jnp.array(lengths))
  chunked = jit_apply(module.clone(implementation="chunked"))(
      {"params": params}, xq, xkv, key_value_seq_lengths=jnp.array(lengths))
  q, k, v = project(xq, params["query"]), project(xkv, params["key"]), project(xkv, params["value"])
  heads, weights = [], []
  for b, length in enumerate(lengths):
    k_c, valid = numpy_compress(k[b], length, c, method, params.get("key_conv"))
    v_c, _ = numpy_compress(v[b], length, c, method, params.get("value_conv"))
    o, w = numpy_attention(q[b], k_c, v_c, valid)
    heads.append(o)
    weights.append(w)
  assert state["intermediates"]["attention_weights"][0].shape == (B, H, 4, -(-7 // c))
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0], np.stack(weights),
                             atol=ATOL)
  np.testing.assert_allclose(out, output(np.stack(heads), params["out"]), atol=ATOL, rtol=1e-5)
  np.testing.assert_allclose(chunked, out, atol=ATOL, rtol=1e-5)   # O(q_len) memory, no weights


def test_identity_conv_without_compression_is_plain_attention():
  xq, xkv = normal(8, (B, 4, D)), normal(9, (B, 5, D))
  module = MemoryCompressedAttention(num_heads=H, qkv_features=H * HEAD, compression=1)
  params = init(module, xq, xkv)
  identity = {"kernel": np.eye(H * HEAD, dtype=np.float32)[None], "bias": np.zeros(H * HEAD, np.float32)}
  params = dict(params, key_conv=identity, value_conv=identity)
  out = jit_apply(module)({"params": params}, xq, xkv)
  flax_params = {name: params[name] for name in ("query", "key", "value", "out")}
  expected = jit_apply(nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=H * HEAD))(
      {"params": flax_params}, xq, xkv)
  np.testing.assert_allclose(out, expected, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("config,kwargs,match", [
    (dict(compression=2), dict(is_causal=True), "is_causal"),
    (dict(compression=2, method="mean"), {}, r"method must be one of \('conv', 'avg', 'max'\)"),
    (dict(compression=0), {}, "compression must be a positive int"),
])
def test_memory_compressed_invalid_arguments_raise(config, kwargs, match):
  module = MemoryCompressedAttention(num_heads=H, qkv_features=H * HEAD, **config)
  with pytest.raises(ValueError, match=match):
    module.init(jax.random.key(0), jnp.zeros((1, 4, D)), **kwargs)
