"""Attention over compressed keys and values: Linformer and memory-compressed attention.

Both shorten the keys and values along the length before attending (Linformer by learned
projections, memory-compressed attention by a strided convolution or pooling), so the
weights are [q_len, compressed length]. A compressed position mixes several key positions,
so causal masking is not meaningful and is refused.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention import registry
from research.attention.functional import dot_product_attention
from research.attention.masks import padding_mask
from research.attention.multi_head import check_heads
from research.errors import check_choice, check_positive

Array = jax.Array
METHODS = ("conv", "avg", "max")


def _valid_keys(batch: int, kv_len: int, key_value_seq_lengths: Array | None) -> Array:
  """[batch, kv_len] bool: True = a real key, False = padding."""
  if key_value_seq_lengths is None:
    return jnp.ones((batch, kv_len), bool)
  return padding_mask(key_value_seq_lengths, kv_len)


def linformer_attention(q: Array, k: Array, v: Array, e: Array, f: Array, *,
                        scale: float | None = None, key_value_seq_lengths: Array | None = None,
                        return_weights: bool = False):
  """softmax(q (E K)ᵀ · scale) (F V), per head.

  Args:
    q: [b, q_len, H, d]; k: [b, kv_len, H_kv, d]; v: [b, kv_len, H_kv, d_v].
    e, f: [proj_len, max_len] with kv_len ≤ max_len (the first kv_len columns are used).
    scale: logit scale, default 1/√d.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding and left out of E K, F V.
    return_weights: also return the weights [b, H, q_len, proj_len].

  Returns:
    out [b, q_len, H, d_v], or (out, weights) with return_weights.
  """
  e, f = jnp.asarray(e), jnp.asarray(f)
  if e.ndim != 2 or e.shape != f.shape:
    raise ValueError(f"e and f must both be [proj_len, max_len]; got {e.shape} and {f.shape}")
  kv_len = k.shape[1]
  if kv_len > e.shape[1]:
    raise ValueError(f"kv_len ({kv_len}) exceeds max_len ({e.shape[1]}) of the projections e, f")
  valid = _valid_keys(k.shape[0], kv_len, key_value_seq_lengths)[:, :, None, None]
  k, v = jnp.where(valid, k, 0), jnp.where(valid, v, 0)
  k_proj = jnp.einsum("pn,bnhd->bphd", e[:, :kv_len].astype(k.dtype), k)
  v_proj = jnp.einsum("pn,bnhd->bphd", f[:, :kv_len].astype(v.dtype), v)
  return dot_product_attention(q, k_proj, v_proj, scale=scale, return_weights=return_weights)


def pool_length(x: Array, valid: Array, compression: int, method: str) -> tuple[Array, Array]:
  """Average or max pooling over blocks of c positions, ignoring invalid ones.

  x: [b, n, F]; valid: [b, n] bool. Returns pooled [b, ⌈n/c⌉, F] (0 for a block with no
  valid position) and block_valid [b, ⌈n/c⌉] (the block has a valid position).
  """
  if method not in ("avg", "max"):
    raise ValueError(f"pooling method must be 'avg' or 'max', got {method!r}")
  blocks, block_valid = _blocks(x, valid, compression)         # [b, m, c, F], [b, m, c]
  counts = jnp.sum(block_valid, axis=-1)[..., None]             # [b, m, 1]
  if method == "avg":
    pooled = jnp.sum(blocks, axis=2) / jnp.maximum(counts, 1)
  else:
    pooled = jnp.max(jnp.where(block_valid[..., None], blocks, -jnp.inf), axis=2)
    pooled = jnp.where(counts > 0, pooled, 0.0)
  return pooled, counts[..., 0] > 0


def _blocks(x: Array, valid: Array, compression: int) -> tuple[Array, Array]:
  """x [b, n, F] (invalid positions zeroed), valid [b, n] -> [b, ⌈n/c⌉, c, F], [b, ⌈n/c⌉, c]."""
  pad = -x.shape[1] % compression
  x = jnp.pad(jnp.where(valid[..., None], x, 0), ((0, 0), (0, pad), (0, 0)))
  valid = jnp.pad(valid, ((0, 0), (0, pad)))
  b, n, features = x.shape
  return (x.reshape(b, n // compression, compression, features),
          valid.reshape(b, n // compression, compression))


class LinformerSelfAttention(nn.Module):
  """Multi-head self-attention with Linformer's length projections E (keys), F (values).

  Linformer (Wang et al. 2020) projects keys and values along the length with learned
  E, F [proj_len, max_len]; an input of kv_len ≤ max_len uses their first kv_len columns:

    K' = E K,   V' = F V   [proj_len, d],     out = softmax(q K'ᵀ / √d) V'

  Parameters: query / key / value / out as in `MultiHeadAttention`, e [proj_len, max_len]
  and f (the same shape; absent with share_kv, where F = E), initialised N(0, 1/max_len).
  `__call__(inputs [b, n, D], *, key_value_seq_lengths=None)` -> [b, n, D], n ≤ max_len;
  the weights [b, H, n, proj_len] are sown as intermediates/attention_weights. A projected
  position mixes every key, so is_causal=True is refused; `train` changes nothing (no
  dropout), as for MemoryCompressedAttention.
  """
  num_heads: int                   # H
  qkv_features: int                # H · d
  proj_len: int                    # k in the paper: compressed key / value length
  max_len: int                     # longest input; shorter ones use E[:, :n], F[:, :n]
  share_kv: bool = False           # one projection for keys and values (F = E)
  dtype: Any = None                # computation dtype
  param_dtype: Any = jnp.float32   # parameter dtype

  @nn.compact
  def __call__(self, inputs: Array, *, key_value_seq_lengths: Array | None = None,
               is_causal: bool = False, train: bool = False) -> Array:
    del train
    head_dim = check_heads(self.qkv_features, self.num_heads)
    if is_causal:
      raise ValueError("is_causal=True is not supported by LinformerSelfAttention: a projected "
                       "position mixes every key position")
    dense = functools.partial(nn.DenseGeneral, dtype=self.dtype, param_dtype=self.param_dtype)
    q, k, v = (dense((self.num_heads, head_dim), name=name)(inputs)
               for name in ("query", "key", "value"))
    init = nn.initializers.lecun_normal(in_axis=1, out_axis=0)
    e = self.param("e", init, (self.proj_len, self.max_len), self.param_dtype)
    f = e if self.share_kv else self.param("f", init, (self.proj_len, self.max_len), self.param_dtype)
    out, weights = linformer_attention(q, k, v, e, f, key_value_seq_lengths=key_value_seq_lengths,
                                       return_weights=True)
    self.sow("intermediates", "attention_weights", weights)
    return dense(inputs.shape[-1], axis=(-2, -1), name="out")(out)


class MemoryCompressedAttention(nn.Module):
  """Multi-head attention over keys and values shortened c-fold by a strided conv or pooling.

  Memory-compressed attention (Liu et al. 2018, "Generating Wikipedia by summarizing long
  sequences") shortens keys and values by c before attending: a strided convolution with
  kernel = stride = c ("conv"), or average / max pooling over blocks of c positions:

    K'_j = Σ_{i<c} K_{c·j+i} W_i + b   |   mean_{i<c} K_{c·j+i}   |   max_{i<c} K_{c·j+i}

  When kv_len is not a multiple of c the keys are padded: the last block compresses the
  remaining kv_len mod c positions alone (its mean and max over those; the convolution sees
  zeros in place of the missing ones). Padding keys (key_value_seq_lengths) are left out the
  same way, and a block with no real key is masked out.

  Parameters: query / key / value / out as in `MultiHeadAttention`, and for method "conv"
  key_conv / value_conv (`flax.linen.Conv`, kernel [c, H·d, H·d], bias [H·d]).
  `__call__(inputs_q [b, q_len, D], inputs_kv [b, kv_len, D_kv] = inputs_q, *,
  key_value_seq_lengths=None)` -> [b, q_len, D]. The softmax over the compressed keys runs
  as `implementation` chooses: "auto" per platform (on a CPU chunked, memory O(q_len) rather
  than O(q_len · kv_len / c)); with one that returns them ("dense") the weights
  [b, H, q_len, ⌈kv_len/c⌉] are sown as intermediates/attention_weights. `train` changes
  nothing (no dropout).
  """
  num_heads: int                   # H
  qkv_features: int                # H · d
  compression: int                 # c: kernel size and stride along the length
  method: str = "conv"             # "conv", "avg" or "max"
  implementation: str = "auto"     # research.attention implementation over compressed keys
  dtype: Any = None                # computation dtype
  param_dtype: Any = jnp.float32   # parameter dtype

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train
    head_dim = check_heads(self.qkv_features, self.num_heads)
    check_choice("method", self.method, METHODS)
    check_positive("compression", self.compression)
    if is_causal:
      raise ValueError("is_causal=True is not supported by MemoryCompressedAttention: a "
                       "compressed position mixes several key positions")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    dense = functools.partial(nn.DenseGeneral, dtype=self.dtype, param_dtype=self.param_dtype)
    q, k, v = (dense((self.num_heads, head_dim), name=name)(x)
               for name, x in (("query", inputs_q), ("key", inputs_kv), ("value", inputs_kv)))
    b, kv_len = inputs_kv.shape[:2]
    valid = _valid_keys(b, kv_len, key_value_seq_lengths)

    def compress(x: Array, name: str) -> tuple[Array, Array]:
      """[b, kv_len, H, d] -> [b, m, H, d] and block validity [b, m]."""
      x = x.reshape(b, kv_len, self.qkv_features)
      if self.method == "conv":
        blocks, block_valid = _blocks(x, valid, self.compression)
        conv = nn.Conv(self.qkv_features, (self.compression,), strides=(self.compression,),
                       padding="VALID", dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        x, block_valid = conv(blocks.reshape(b, -1, x.shape[-1])), jnp.any(block_valid, axis=-1)
      else:
        x, block_valid = pool_length(x, valid, self.compression, self.method)
      return x.reshape(x.shape[:2] + (self.num_heads, head_dim)), block_valid

    k, block_valid = compress(k, "key_conv")
    v, _ = compress(v, "value_conv")
    attend = functools.partial(dot_product_attention, q, k, v, mask=block_valid[:, None, None, :],
                               implementation=self.implementation)
    if registry.gives_weights(self.implementation):
      out, weights = attend(return_weights=True)
      self.sow("intermediates", "attention_weights", weights)
    else:
      out = attend()
    return dense(inputs_q.shape[-1], axis=(-2, -1), name="out")(out)
