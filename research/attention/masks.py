"""Which keys each query may see: masks as boolean arrays (True = visible).

The structured patterns (causal, sliding window / band, key padding, global tokens, the
block-sparse patterns of `block_sparse`) are described by a `Visibility`, which both
builds dense masks and answers block questions (`block_map`, `visit_lists`) so that the
chunked, banded and kernel strategies visit only the key blocks some query of a block sees.
"""

import functools
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.attention import block_sparse
from research.attention.block_sparse import BlockSparse

Array = jax.Array


def causal_mask(q_len: int, kv_len: int) -> Array:
  """[q_len, kv_len]: query i sees keys j ≤ i."""
  return jnp.arange(q_len)[:, None] >= jnp.arange(kv_len)[None, :]


def window_mask(q_len: int, kv_len: int, left: int, right: int) -> Array:
  """[q_len, kv_len]: query i sees keys i − left ≤ j ≤ i + right."""
  offset = jnp.arange(kv_len)[None, :] - jnp.arange(q_len)[:, None]
  return (offset >= -left) & (offset <= right)


def padding_mask(lengths: Array, max_len: int) -> Array:
  """[batch, max_len]: position t is real (t < lengths[b])."""
  return jnp.arange(max_len)[None, :] < jnp.asarray(lengths)[:, None]


def global_tokens_mask(q_len: int, kv_len: int, global_positions) -> Array:
  """[q_len, kv_len]: Longformer's global attention, symmetric.

  A global token sees every key and is seen by every query.
  """
  is_global_q = jnp.zeros(q_len, bool).at[jnp.asarray(global_positions)].set(True, mode="drop")
  is_global_k = jnp.zeros(kv_len, bool).at[jnp.asarray(global_positions)].set(True, mode="drop")
  return is_global_q[:, None] | is_global_k[None, :]


def normalize_window(window, is_causal: bool) -> tuple[int, int] | None:
  """None, w or (left, right) -> None or (left, right), with right = 0 when causal.

  Raises ValueError naming the allowed forms for anything else.
  """
  if window is None:
    return None
  if isinstance(window, int) and not isinstance(window, bool):
    left, right = window, window
  elif (isinstance(window, (tuple, list)) and len(window) == 2
        and all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
    left, right = window
  else:
    raise ValueError(f"window must be None, an int w or a pair (left, right) of ints, got {window!r}")
  if left < 0 or right < 0:
    raise ValueError(f"window sizes must be >= 0, got {window!r}")
  return (left, 0 if is_causal else right)


class Visibility(NamedTuple):
  """The structured part of a mask: causal, a window, global tokens, a block-sparse
  pattern, key lengths.

  Query i sees key j when

    j < kv_lengths[b]  and  (not causal or j ≤ i)
                       and  (−left ≤ j − i ≤ right  or  i ∈ G  or  j ∈ G)      (no sparsity)
                       and  sparsity.visible(i, j)                            (sparsity)

  left / right: the window's reach (None: unbounded on that side); causal also sets
  right = 0, so without global tokens the window alone says it. global_tokens G: static
  sorted positions (Longformer's symmetric global attention: a global token sees every
  key and every query sees it, still within causality and key lengths). sparsity: a
  block-sparse pattern bound to the shape (`block_sparse`: Sparse Transformer's fixed or
  strided, BigBird), which replaces the window and global tokens. kv_lengths [batch]
  masks keys t ≥ length (padding), or None. Query i and key j are aligned at the start of
  the sequences (i, j ≥ 0), as in `jax.nn.dot_product_attention`.
  """
  left: int | None = None
  right: int | None = None
  kv_lengths: Array | None = None
  causal: bool = False
  global_tokens: tuple[int, ...] = ()
  sparsity: BlockSparse | None = None

  @classmethod
  def make(cls, is_causal: bool, window, kv_lengths=None, global_tokens=(),
           sparsity: BlockSparse | None = None) -> "Visibility":
    w = normalize_window(window, is_causal)
    if block_sparse.check(sparsity) is not None and (w is not None or global_tokens):
      raise ValueError(f"sparsity={sparsity!r} is its own pattern: pass no window and no "
                       f"global_tokens with it (got window={window!r}, "
                       f"global_tokens={tuple(global_tokens)!r})")
    left, right = (None, None) if w is None else w
    if is_causal and sparsity is None:
      right = 0
    return cls(left, right, kv_lengths, bool(is_causal), tuple(global_tokens), sparsity)

  @property
  def sees_everything(self) -> bool:
    """True when nothing is masked: no causal, no window, no pattern, no key lengths."""
    return (self.left is None and self.right is None and self.kv_lengths is None
            and self.sparsity is None and not self.causal)

  def pattern_visible(self, queries, keys, global_queries=None, global_keys=None):
    """The static rule at query and key positions (int arrays broadcasting together): the
    window, widened by global tokens within causality, or the block-sparse pattern within
    causality; key lengths are not in it. `global_queries` / `global_keys`: bool flags of
    the positions broadcastable like them (needed when there are global tokens). None
    when the rule masks nothing."""
    if self.sparsity is not None:
      return self._within_causality(self.sparsity.visible(queries, keys), queries, keys)
    offset = keys - queries
    conditions = []
    if self.left is not None:
      conditions.append(offset >= -self.left)
    if self.right is not None:
      conditions.append(offset <= self.right)
    if not conditions:
      return None
    visible = functools.reduce(operator.and_, conditions)
    if self.global_tokens:
      visible = self._within_causality(visible | global_queries | global_keys, queries, keys)
    return visible

  def tile_visible(self, queries, keys, global_queries=None, global_keys=None):
    """`pattern_visible` on a tile that `block_map` visits and that lies within one block
    pair of `sparsity.nest` positions: what a kernel evaluates, without tables."""
    if self.sparsity is not None:
      return self._within_causality(self.sparsity.within_blocks(queries, keys), queries, keys)
    return self.pattern_visible(queries, keys, global_queries, global_keys)

  def _within_causality(self, visible, queries, keys):
    if not self.causal:
      return visible
    before = keys <= queries
    return before if visible is None else visible & before

  def at(self, queries: Array, keys: Array) -> Array:
    """bool [batch or 1, len(queries), len(keys)]: the mask at 1-D query and key positions."""
    queries, keys = queries[:, None], keys[None, :]
    flags = {}
    if self.global_tokens:
      positions = jnp.asarray(self.global_tokens)
      is_global = lambda x: (x[..., None] == positions).any(-1)
      flags = dict(global_queries=is_global(queries), global_keys=is_global(keys))
    visible = self.pattern_visible(queries, keys, **flags)
    shape = (1, queries.shape[0], keys.shape[1])
    visible = jnp.ones(shape, bool) if visible is None else jnp.broadcast_to(visible, shape)
    if self.kv_lengths is not None:
      visible = visible & (keys[None] < self.kv_lengths[:, None, None])
    return visible

  def dense(self, q_len: int, kv_len: int, q_start=0, k_start=0) -> Array:
    """[batch or 1, q_len, kv_len] mask for queries q_start… and keys k_start…."""
    return self.at(q_start + jnp.arange(q_len), k_start + jnp.arange(kv_len))

  def rectangles(self, q_first, q_last, k_first, k_last) -> tuple[np.ndarray, np.ndarray]:
    """(some, every): bool NumPy arrays, the broadcast of the inclusive position bounds of
    rectangles [q_first, q_last] × [k_first, k_last]: some query there may see some key
    (False: none does), every query sees every key (the static pattern, no key lengths)."""
    low, high = k_first - q_last, k_last - q_first       # the rectangle's range of j − i
    if self.sparsity is not None:
      some, every = self.sparsity.tiles(q_first, q_last, k_first, k_last)
    else:
      left = np.inf if self.left is None else self.left
      right = np.inf if self.right is None else self.right
      some = (high >= -left) & (low <= right)
      every = (low >= -left) & (high <= right)
    if self.global_tokens:
      positions = np.asarray(self.global_tokens)
      in_blocks = lambda first, last: ((positions >= first[..., None])
                                       & (positions <= last[..., None])).any(-1)
      some = some | in_blocks(q_first, q_last) | in_blocks(k_first, k_last)
    if self.causal:
      some = some & (low <= 0)
      every = every & (high <= 0)
    return some, every

  def block_map(self, q_len: int, kv_len: int, q_block: int, k_block: int) -> np.ndarray:
    """int8 [⌈q_len/q_block⌉, ⌈kv_len/k_block⌉], computed at trace time from the static
    pattern (key lengths and masks are not in it): 0 = no query of the block sees a key
    of the block, 1 = some do (the block needs a mask), 2 = all do.

    Kernels visit only the blocks > 0, so a window of w costs O(L·w), global tokens add
    their rows and columns of blocks, and a block-sparse pattern its visible blocks.
    """
    q_first = np.arange(0, q_len, q_block)[:, None]
    k_first = np.arange(0, kv_len, k_block)[None, :]
    some, every = self.rectangles(q_first, np.minimum(q_first + q_block, q_len) - 1,
                                  k_first, np.minimum(k_first + k_block, kv_len) - 1)
    # a key block cut short by the end of the sequence is padded: its tail needs the mask
    ragged = k_first + k_block > kv_len
    return np.where(some, np.where(every & ~ragged, 2, 1), 0).astype(np.int8)


@functools.lru_cache(maxsize=64)
def visit_lists(pattern: Visibility, lengths: tuple[int, int], padded: tuple[int, int],
                blocks: tuple[int, int], transpose: bool) -> tuple[np.ndarray, np.ndarray]:
  """Per query block (per key block when `transpose`) of the padded lengths, the blocks of
  the other axis to visit under `pattern` (a Visibility without key lengths) at the real
  lengths: what the chunked, banded and Pallas GPU strategies loop over.

  Returns visits int32 [blocks, most visits] (block indices, partially visible ones first,
  then the wholly visible ones) and counts int32 [blocks, 2] = (partial, all); blocks
  wholly in the padding visit nothing.
  """
  block_map = pattern.block_map(*lengths, *blocks)
  tiles = [n // b for n, b in zip(padded, blocks)]
  block_map = np.pad(block_map, [(0, t - n) for t, n in zip(tiles, block_map.shape)])
  if transpose:
    block_map = block_map.T
  lists = [np.concatenate([np.flatnonzero(row == 1), np.flatnonzero(row == 2)])
           for row in block_map]
  visits = np.zeros((len(lists), max(1, *map(len, lists))), np.int32)
  counts = np.zeros((len(lists), 2), np.int32)
  for r, (row, visited) in enumerate(zip(block_map, lists)):
    visits[r, :len(visited)] = visited
    counts[r] = (row == 1).sum(), len(visited)
  return visits, counts
