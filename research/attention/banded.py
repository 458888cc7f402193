"""Sliding-window attention in O(n·w) time and memory, without a dense mask.

Queries are cut into blocks of bq. Query block i can only see keys in
[i·bq − left, (i+1)·bq − 1 + right], which lie in the key blocks i − n_l … i + n_r
with n_l = ⌈left / bq⌉, n_r = ⌈right / bq⌉. Those blocks are stacked into one slab of
W = (n_l + 1 + n_r)·bq keys per query block (shifted slices, no gather), and dense
attention runs on all [bq, W] tiles at once with the band mask

  visible(a, c) = −left ≤ (c − n_l·bq) − a ≤ right  and the key exists,

for query a and slab key c of a block, so the cost is O(n·W) instead of O(n²).
"""

import math

import jax
import jax.numpy as jnp

from research.attention.dense import group_broadcast, masked_softmax
from research.attention.masks import Visibility

Array = jax.Array
F32 = jnp.float32


def _slabs(x: Array, num_blocks: int, block: int, n_left: int, n_right: int, axis: int) -> Array:
  """x [.., L, ..] along `axis` -> [.., num_blocks, W, ..]: block i's keys i−n_l … i+n_r."""
  total = (num_blocks + n_left + n_right) * block
  x = jax.lax.slice_in_dim(x, 0, min(x.shape[axis], total - n_left * block), axis=axis)  # unreachable keys
  pad = [(0, 0)] * x.ndim
  pad[axis] = (n_left * block, total - n_left * block - x.shape[axis])
  x = jnp.pad(x, pad)
  shape = x.shape[:axis] + (num_blocks + n_left + n_right, block) + x.shape[axis + 1:]
  blocks = x.reshape(shape)
  shifted = [jax.lax.slice_in_dim(blocks, s, s + num_blocks, axis=axis)
             for s in range(n_left + 1 + n_right)]
  slab = jnp.stack(shifted, axis=axis + 1)           # [.., nb, n_l+1+n_r, block, ..]
  return slab.reshape(slab.shape[:axis + 1] + (-1,) + slab.shape[axis + 3:])


def _band(x: Array | None, num_blocks: int, block: int, n_left: int, n_right: int) -> Array | None:
  """A [b|1, H|1, q|1, k|1] mask or bias -> [b|1, H|1, nb|1, bq|1, W|1] on the band."""
  if x is None:
    return None
  per_query, per_key = x.shape[-2] != 1, x.shape[-1] != 1
  if per_query:  # [.., q, k] -> [.., nb, bq, k]
    x = jnp.pad(x, [(0, 0)] * 2 + [(0, num_blocks * block - x.shape[-2]), (0, 0)])
    x = x.reshape(x.shape[:2] + (num_blocks, block, x.shape[-1]))
  else:
    x = x[:, :, None]
  if not per_key:
    return x
  if not per_query:  # the same row for every query: slab the keys alone
    return _slabs(x[:, :, 0, 0], num_blocks, block, n_left, n_right, axis=2)[:, :, :, None]
  keys = _slabs(x, num_blocks, block, n_left, n_right, axis=4)  # [.., nb, bq, nb, W]
  i = jnp.arange(num_blocks)
  return keys[:, :, i, :, i].transpose(1, 2, 0, 3, 4)          # block i's own slab


def banded_attention(q: Array, k: Array, v: Array, *, scale: float, bias: Array | None,
                     mask: Array | None, visibility: Visibility, block: int = 128) -> Array:
  """Windowed attention on [block, W] tiles.

  Args:
    q: [batch, q_len, H, d]; k, v: [batch, kv_len, H_kv, d] (H_kv divides H).
    scale: multiplies q kᵀ.
    bias, mask: [batch|1, H|1, q_len|1, kv_len|1] or None; only their band is read.
    visibility: must have a finite left and right reach (a window, or causal + window).
    block: query block size bq.

  Returns:
    [batch, q_len, H, d_v] in q's dtype.
  """
  if visibility.left is None or visibility.right is None:
    raise ValueError("implementation='banded' needs a window: pass window=w or (left, right)")
  b, q_len, h, d = q.shape
  kv_len, num_kv_heads = k.shape[1], k.shape[2]
  group = h // num_kv_heads
  block = max(1, min(block, q_len))
  num_blocks = math.ceil(q_len / block)
  n_left = math.ceil(visibility.left / block)
  n_right = math.ceil(visibility.right / block)

  qb = jnp.pad(q, [(0, 0), (0, num_blocks * block - q_len), (0, 0), (0, 0)])
  qb = qb.reshape(b, num_blocks, block, num_kv_heads, group, d)
  k_slab = _slabs(k, num_blocks, block, n_left, n_right, axis=1)   # [b, nb, W, H_kv, d]
  v_slab = _slabs(v, num_blocks, block, n_left, n_right, axis=1)
  logits = jnp.einsum("bnqhgd,bnkhd->bhgnqk", qb, k_slab, preferred_element_type=F32) * scale

  width = k_slab.shape[2]
  query_pos = jnp.arange(num_blocks)[:, None] * block + jnp.arange(block)[None, :]   # [nb, bq]
  key_pos = ((jnp.arange(num_blocks)[:, None] - n_left) * block
             + jnp.arange(width)[None, :])                                          # [nb, W]
  offset = key_pos[:, None, :] - query_pos[:, :, None]                              # [nb, bq, W]
  visible = ((offset >= -visibility.left) & (offset <= visibility.right)
             & (key_pos[:, None, :] >= 0) & (key_pos[:, None, :] < kv_len))[None]
  if visibility.kv_lengths is not None:
    visible = visible & (key_pos[None, :, None, :]
                         < jnp.asarray(visibility.kv_lengths)[:, None, None, None])
  visible = visible[:, None, None]                                 # [b|1, 1, 1, nb, bq, W]
  band_mask = _band(mask, num_blocks, block, n_left, n_right)
  if band_mask is not None:
    visible = visible & group_broadcast(band_mask, num_kv_heads)
  band_bias = _band(bias, num_blocks, block, n_left, n_right)
  if band_bias is not None:
    logits = logits + group_broadcast(band_bias, num_kv_heads).astype(F32)

  weights = masked_softmax(logits, visible)
  out = jnp.einsum("bhgnqk,bnkhd->bnqhgd", weights.astype(v.dtype), v_slab,
                   preferred_element_type=F32)
  return out.reshape(b, num_blocks * block, h, v.shape[-1])[:, :q_len].astype(q.dtype)

