"""Sliding-window and block-sparse attention in O(n·w) time and memory, without a dense mask.

Each block of queries attends densely to the few keys it can see (its slab of the band, or
the key blocks a block-sparse pattern lets it visit), one tile after another and recomputed
in the backward pass, so nothing of size n² (or n·w) is stored; `banded_attention` gives the
tiles' construction.
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.attention.dense import dense_attention, group_broadcast, masked_softmax
from research.attention.masks import Visibility, visit_lists

Array = jax.Array
F32 = jnp.float32
DEFAULT_BLOCK = 64


def _slabs(x: Array, num_blocks: int, block: int, n_left: int, n_right: int, axis: int) -> Array:
  """x [.., L, ..] along `axis` -> [.., num_blocks, W, ..]: block i's keys i−n_l … i+n_r."""
  x = jnp.moveaxis(_slab_padded(jnp.moveaxis(x, axis, 1), num_blocks, block, n_left, n_right), 1, axis)
  shape = x.shape[:axis] + (num_blocks + n_left + n_right, block) + x.shape[axis + 1:]
  blocks = x.reshape(shape)
  shifted = [jax.lax.slice_in_dim(blocks, s, s + num_blocks, axis=axis)
             for s in range(n_left + 1 + n_right)]
  slab = jnp.stack(shifted, axis=axis + 1)           # [.., nb, n_l+1+n_r, block, ..]
  return slab.reshape(slab.shape[:axis + 1] + (-1,) + slab.shape[axis + 3:])


def _slab_padded(x: Array, num_blocks: int, block: int, n_left: int, n_right: int) -> Array:
  """Keys [b, L, ..] padded so block i's slab is rows [i·bq, i·bq + W) (key t at t + n_l·bq)."""
  total = (num_blocks + n_left + n_right) * block
  x = jax.lax.slice_in_dim(x, 0, min(x.shape[1], total - n_left * block), axis=1)  # unreachable keys
  return jnp.pad(x, [(0, 0), (n_left * block, total - n_left * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _rows(x: Array, num_blocks: int, block: int) -> Array:
  """A [b|1, H|1, q|1, k|1] mask or bias -> [b|1, H|1, nb|1, bq|1, k|1] by query block."""
  if x.shape[-2] == 1:
    return x[:, :, None]
  x = jnp.pad(x, [(0, 0)] * 2 + [(0, num_blocks * block - x.shape[-2]), (0, 0)])
  return x.reshape(x.shape[:2] + (num_blocks, block, x.shape[-1]))


def _band(x: Array | None, num_blocks: int, block: int, n_left: int, n_right: int) -> Array | None:
  """A [b|1, H|1, q|1, k|1] mask or bias -> [b|1, H|1, nb|1, bq|1, W|1] on the band."""
  if x is None:
    return None
  per_query, per_key = x.shape[-2] != 1, x.shape[-1] != 1
  x = _rows(x, num_blocks, block)
  if not per_key:
    return x
  if not per_query:  # the same row for every query: slab the keys alone
    return _slabs(x[:, :, 0, 0], num_blocks, block, n_left, n_right, axis=2)[:, :, :, None]
  keys = _slabs(x, num_blocks, block, n_left, n_right, axis=4)  # [.., nb, bq, nb, W]
  i = jnp.arange(num_blocks)
  return keys[:, :, i, :, i].transpose(1, 2, 0, 3, 4)          # block i's own slab


def _slab_keys(visibility: Visibility, q_len: int, k, v, bias, mask, num_blocks: int,
               block: int):
  """tile(i) for a window: query block i's slab of W = (n_l + 1 + n_r)·bq keys, one
  dynamic slice (see `banded_attention`)."""
  del q_len  # the slab depends on the block only
  n_left = math.ceil(visibility.left / block)
  n_right = math.ceil(visibility.right / block)
  width = (n_left + 1 + n_right) * block
  pad_keys = lambda x: _slab_padded(x, num_blocks, block, n_left, n_right)
  k_padded, v_padded = pad_keys(k), pad_keys(v)           # key t sits at t + n_left·bq
  num_kv_heads = k.shape[2]
  band_mask = group_broadcast(_band(mask, num_blocks, block, n_left, n_right), num_kv_heads)
  band_bias = group_broadcast(_band(bias, num_blocks, block, n_left, n_right), num_kv_heads)

  def tile(i):
    positions = (i - n_left) * block + jnp.arange(width)
    # block i's rows of a banded mask / bias [.., nb|1, bq|1, W|1] (index 0 when broadcast)
    at_block = lambda x: None if x is None else jax.lax.dynamic_index_in_dim(
        x, i if x.shape[3] > 1 else 0, 3, False)
    return (jax.lax.dynamic_slice_in_dim(k_padded, i * block, width, axis=1),
            jax.lax.dynamic_slice_in_dim(v_padded, i * block, width, axis=1),
            positions, positions >= 0, at_block(band_mask), at_block(band_bias))

  return tile


def gathered_blocks(visibility: Visibility, q_len: int, kv_len: int,
                    block: int = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
  """The key blocks of `block` each query block of a block-sparse pattern visits, its
  global rows left out (they are computed apart): `masks.visit_lists`' (visits, counts)."""
  pattern = visibility._replace(kv_lengths=None,
                                sparsity=visibility.sparsity.without_global_queries())
  padded = (math.ceil(q_len / block) * block, math.ceil(kv_len / block) * block)
  return visit_lists(pattern, (q_len, kv_len), padded, (block, block), False)


def _gathered_keys(visibility: Visibility, q_len: int, k, v, bias, mask, num_blocks: int,
                   block: int):
  """tile(i) for a block-sparse pattern: the key blocks query block i visits
  (`gathered_blocks`), gathered into W = M·bq keys, M the most blocks a query block
  visits; unused places are masked."""
  kv_len, num_kv_heads = k.shape[1], k.shape[2]
  num_key_blocks = math.ceil(kv_len / block)
  visits, counts = (jnp.asarray(x) for x in gathered_blocks(visibility, q_len, kv_len, block))
  by_block = lambda x: jnp.pad(x, [(0, 0), (0, num_key_blocks * block - kv_len), (0, 0), (0, 0)]
                               ).reshape(x.shape[0], num_key_blocks, block, *x.shape[2:])
  k_blocks, v_blocks = by_block(k), by_block(v)            # [b, n_k, bq, H_kv, d]
  rows = lambda x: x if x is None or x.shape[-2] == 1 else jnp.pad(
      x, [(0, 0)] * 3 + [(0, num_blocks * block - x.shape[-2]), (0, 0)])
  tile_mask, tile_bias = (rows(group_broadcast(x, num_kv_heads)) for x in (mask, bias))

  def tile(i):
    listed = visits[i]                                              # [M]
    positions = (listed[:, None] * block + jnp.arange(block)).reshape(-1)
    used = jnp.repeat(jnp.arange(listed.shape[0]) < counts[i, 1], block)
    gather = lambda x: x[:, listed].reshape(x.shape[0], -1, *x.shape[3:])

    def pairwise(x):  # [b|1, H_kv|1, G|1, q|1, k|1] -> [.., bq|1, W|1]
      if x is None:
        return None
      if x.shape[-2] > 1:
        x = jax.lax.dynamic_slice_in_dim(x, i * block, block, axis=3)
      return x if x.shape[-1] == 1 else jnp.take(x, jnp.minimum(positions, kv_len - 1), axis=4)

    return (gather(k_blocks), gather(v_blocks), positions, used, pairwise(tile_mask),
            pairwise(tile_bias))

  return tile


def banded_attention(q: Array, k: Array, v: Array, *, scale: float, bias: Array | None,
                     mask: Array | None, visibility: Visibility,
                     block: int = DEFAULT_BLOCK) -> Array:
  """Windowed or block-sparse attention on [block, W] tiles.

  Queries are cut into blocks of bq. Query block i can only see keys in
  [i·bq − left, (i+1)·bq − 1 + right], which lie in the key blocks i − n_l … i + n_r
  with n_l = ⌈left / bq⌉, n_r = ⌈right / bq⌉: a slab of W = (n_l + 1 + n_r)·bq keys,
  read by one dynamic slice of the (padded) keys. Dense attention runs on the [bq, W]
  tile with the band mask

    visible(a, c) = −left ≤ (c − n_l·bq) − a ≤ right  and the key exists,

  for query a and slab key c of the block, so the cost is O(n·W) instead of O(n²). The
  tiles are computed one after another (`lax.map`) and recomputed in the backward pass
  (`jax.checkpoint`): each tile stays in cache and nothing of size n·W is stored, which
  on a CPU is 2× faster than materialising every tile at once.

  Global tokens G (Longformer): every tile also gets the |G| global keys as extra columns,
  visible where the band does not already show them (one softmax over slab and globals),
  and the |G| global queries, which see every key, are computed densely and written over
  their rows: O(n·(W + |G|)) in all.

  A block-sparse pattern (Sparse Transformer, BigBird: `block_sparse`) replaces the slab by
  the key blocks of bq the query block visits (`masks.visit_lists`), gathered: W = M·bq for
  the most blocks M any query block visits, places past its own count masked, the pattern
  evaluated on the gathered positions. BigBird's global query blocks, which see every key,
  are left out of the lists and computed densely as global queries: O(n·M·bq) in all
  (BigBird with bq = B: M = w + g + r).

  Args:
    q: [batch, q_len, H, d]; k, v: [batch, kv_len, H_kv, d] (H_kv divides H).
    scale: multiplies q kᵀ.
    bias, mask: [batch|1, H|1, q_len|1, kv_len|1] or None; only their band (and the
      global tokens' rows and columns) is read.
    visibility: a finite left and right reach (a window, or causal + window), which may
      have global tokens; or a block-sparse pattern (`visibility.sparsity`).
    block: query block size bq (and key block size of a block-sparse pattern).

  Returns:
    [batch, q_len, H, d_v] in q's dtype.
  """
  sparse = visibility.sparsity is not None
  if not sparse and (visibility.left is None or visibility.right is None):
    raise ValueError("implementation='banded' needs a window (window=w or (left, right)) or "
                     "a block-sparse pattern (sparsity=)")
  b, q_len, h, d = q.shape
  kv_len, num_kv_heads = k.shape[1], k.shape[2]
  group = h // num_kv_heads
  block = max(1, min(block, q_len))
  num_blocks = math.ceil(q_len / block)

  qb = jnp.pad(q, [(0, 0), (0, num_blocks * block - q_len), (0, 0), (0, 0)])
  qb = qb.reshape(b, num_blocks, block, num_kv_heads, group, d)
  tile = (_gathered_keys if sparse else _slab_keys)(visibility, q_len, k, v, bias, mask,
                                                     num_blocks, block)
  band = visibility._replace(global_tokens=())
  global_keys = _GlobalKeys.make(visibility, k, v, bias, mask, num_blocks, block)

  @jax.checkpoint  # the backward pass recomputes each tile instead of storing them all
  def query_block(i):
    """Dense attention of query block i over its tile of W keys."""
    k_tile, v_tile, positions, used, tile_mask, tile_bias = tile(i)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", qb[:, i], k_tile, preferred_element_type=F32) * scale
    visible = band.at(i * block + jnp.arange(block), positions)                     # [b|1, bq, W]
    visible &= (used & (positions < kv_len))[None, None, :]                          # padding
    visible = visible[:, None, None]                                                 # [b|1, 1, 1, bq, W]
    if tile_mask is not None:
      visible = visible & tile_mask
    if tile_bias is not None:
      logits = logits + tile_bias.astype(F32)
    if global_keys is not None:   # the global keys as |G| more columns: one softmax
      extra_logits, extra_visible = global_keys.tile(qb[:, i], i, scale)
      logits = jnp.concatenate([logits, extra_logits], axis=-1)
      visible = jnp.concatenate([jnp.broadcast_to(visible, logits.shape[:-1] + (k_tile.shape[1],)),
                                 jnp.broadcast_to(extra_visible, extra_logits.shape)], axis=-1)
      v_tile = jnp.concatenate([v_tile, global_keys.v], axis=1)
    weights = masked_softmax(logits, visible)
    return jnp.einsum("bhgqk,bkhd->bqhgd", weights.astype(v.dtype), v_tile,
                      preferred_element_type=F32)

  out = jax.lax.map(query_block, jnp.arange(num_blocks))          # [nb, b, bq, H_kv, G, dv]
  out = jnp.moveaxis(out, 0, 1).reshape(b, num_blocks * block, h, v.shape[-1])[:, :q_len]
  return _global_query_rows(out, q, k, v, scale, bias, mask, visibility).astype(q.dtype)


class _GlobalKeys(NamedTuple):
  """The global keys seen as extra columns of every tile."""
  positions: Array           # [|G|] key positions < kv_len
  k: Array                   # [b, |G|, H_kv, d]
  v: Array                   # [b, |G|, H_kv, d_v]
  mask: Array | None         # [b|1, H_kv|1, G|1, nb|1, bq|1, |G||1]
  bias: Array | None
  visibility: Visibility

  @classmethod
  def make(cls, visibility, k, v, bias, mask, num_blocks, block) -> "_GlobalKeys | None":
    positions = [p for p in visibility.global_tokens if p < k.shape[1]]
    if not positions:
      return None
    positions = jnp.asarray(positions)
    def columns(x):
      if x is None:
        return None
      x = x if x.shape[-1] == 1 else jnp.take(x, positions, axis=-1)
      return group_broadcast(_rows(x, num_blocks, block), k.shape[2])
    return cls(positions, k[:, positions], v[:, positions], columns(mask), columns(bias),
               visibility)

  def tile(self, q_block: Array, i, scale: float) -> tuple[Array, Array]:
    """Logits [b, H_kv, G, bq, |G|] of query block i [b, bq, H_kv, G, d] against the global
    keys, and where they are visible: by the pattern, but not already inside the band."""
    # block i's rows of a mask / bias [.., nb|1, bq|1, |G||1] (index 0 when broadcast)
    at_block = lambda x: jax.lax.dynamic_index_in_dim(x, i if x.shape[3] > 1 else 0, 3, False)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", q_block, self.k, preferred_element_type=F32) * scale
    if self.bias is not None:
      logits = logits + at_block(self.bias).astype(F32)
    queries = i * q_block.shape[1] + jnp.arange(q_block.shape[1])
    offset = self.positions[None, :] - queries[:, None]                     # [bq, |G|]
    vis = self.visibility
    band = vis._replace(global_tokens=()).pattern_visible(queries[:, None], self.positions[None, :])
    visible = ~band                                                      # not in the band
    if vis.causal:
      visible &= offset <= 0
    visible = visible[None]
    if vis.kv_lengths is not None:
      visible = visible & (self.positions[None, None, :] < vis.kv_lengths[:, None, None])
    visible = visible[:, None, None]
    if self.mask is not None:
      visible = visible & at_block(self.mask)
    return logits, visible


def _global_query_rows(out, q, k, v, scale, bias, mask, visibility: Visibility) -> Array:
  """out [b, q_len, H, d_v] with the rows of global queries (Longformer's global tokens,
  BigBird's global blocks), which see every key within causality and key lengths,
  computed densely: O(|G|·kv_len)."""
  rows = [p for p in visibility.global_tokens if p < q.shape[1]]
  if visibility.sparsity is not None:
    rows = list(visibility.sparsity.global_queries(q.shape[1]))
  if not rows:
    return out
  rows = jnp.asarray(rows)
  visible = visibility.at(rows, jnp.arange(k.shape[1]))[:, None]     # [b|1, 1, |G|, kv_len]
  pick = lambda x: x if x is None or x.shape[-2] == 1 else jnp.take(x, rows, axis=-2)
  if mask is not None:
    visible = visible & pick(mask)
  rows_out, _ = dense_attention(q[:, rows], k, v, scale=scale, bias=pick(bias), visible=visible)
  return out.at[:, rows].set(rows_out.astype(out.dtype))
