"""Which keys each query may see: masks as boolean arrays (True = visible).

The structured patterns (causal, sliding window / band, key padding, global tokens)
are described by a `Visibility`, which both builds dense masks and answers block
questions (`key_block_range`) so that the chunked and banded strategies can skip
key blocks that are invisible to a whole query block.

Positions: query i and key j are aligned at the start of the sequences (i, j ≥ 0),
as in `jax.nn.dot_product_attention`. A window (left, right) lets query i see keys
i − left … i + right; causal sets right = 0.
"""

import functools
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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
  """The structured part of a mask: causal, a window, global tokens, key lengths.

  Query i sees key j when

    j < kv_lengths[b]  and  (not causal or j ≤ i)
                       and  (−left ≤ j − i ≤ right  or  i ∈ G  or  j ∈ G)

  left / right: the window's reach (None: unbounded on that side); causal also sets
  right = 0, so without global tokens the window alone says it. global_tokens G: static
  sorted positions (Longformer's symmetric global attention: a global token sees every
  key and every query sees it, still within causality and key lengths). kv_lengths
  [batch] masks keys t ≥ length (padding), or None.
  """
  left: int | None = None
  right: int | None = None
  kv_lengths: Array | None = None
  causal: bool = False
  global_tokens: tuple[int, ...] = ()

  @classmethod
  def make(cls, is_causal: bool, window, kv_lengths=None, global_tokens=()) -> "Visibility":
    w = normalize_window(window, is_causal)
    left, right = (None, None) if w is None else w
    if is_causal:
      right = 0
    return cls(left, right, kv_lengths, bool(is_causal), tuple(global_tokens))

  @property
  def sees_everything(self) -> bool:
    """True when nothing is masked: no causal, no window, no key lengths."""
    return self.left is None and self.right is None and self.kv_lengths is None

  def pattern_visible(self, offset, global_queries=None, global_keys=None):
    """The static rule at key − query offsets (any array shape): the window, widened by
    global tokens within causality; key lengths are not in it. `global_queries` /
    `global_keys`: bool flags of the positions broadcastable to `offset` (needed when
    there are global tokens). None when the rule masks nothing. The kernels call it on
    the positions of a tile."""
    conditions = []
    if self.left is not None:
      conditions.append(offset >= -self.left)
    if self.right is not None:
      conditions.append(offset <= self.right)
    if not conditions:
      return None
    visible = functools.reduce(operator.and_, conditions)
    if self.global_tokens:
      visible = visible | global_queries | global_keys
      if self.causal:
        visible = visible & (offset <= 0)
    return visible

  def dense(self, q_len: int, kv_len: int, q_start=0, k_start=0) -> Array:
    """[batch or 1, q_len, kv_len] mask for queries q_start… and keys k_start…."""
    queries, keys = q_start + jnp.arange(q_len), k_start + jnp.arange(kv_len)
    flags = {}
    if self.global_tokens:
      positions = jnp.asarray(self.global_tokens)
      is_global = lambda x: (x[..., None] == positions).any(-1)
      flags = dict(global_queries=is_global(queries)[:, None], global_keys=is_global(keys)[None, :])
    visible = self.pattern_visible(keys[None, :] - queries[:, None], **flags)
    visible = jnp.ones((1, q_len, kv_len), bool) if visible is None else visible[None]
    if self.kv_lengths is not None:
      visible = visible & (keys[None, None, :] < self.kv_lengths[:, None, None])
    return visible

  def block_map(self, q_len: int, kv_len: int, q_block: int, k_block: int) -> np.ndarray:
    """int8 [⌈q_len/q_block⌉, ⌈kv_len/k_block⌉], computed at trace time from the static
    pattern (key lengths and masks are not in it): 0 = no query of the block sees a key
    of the block, 1 = some do (the block needs a mask), 2 = all do.

    Kernels visit only the blocks > 0, so a window of w costs O(L·w) and global tokens
    add their rows and columns of blocks.
    """
    q_first = np.arange(0, q_len, q_block)[:, None]
    k_first = np.arange(0, kv_len, k_block)[None, :]
    q_last = np.minimum(q_first + q_block, q_len) - 1
    k_last = np.minimum(k_first + k_block, kv_len) - 1
    low, high = k_first - q_last, k_last - q_first       # the block's range of j − i
    left = np.inf if self.left is None else self.left
    right = np.inf if self.right is None else self.right
    some = (high >= -left) & (low <= right)
    every = (low >= -left) & (high <= right)
    if self.global_tokens:
      positions = np.asarray(self.global_tokens)
      in_blocks = lambda first, last: ((positions >= first[..., None])
                                       & (positions <= last[..., None])).any(-1)
      some |= in_blocks(q_first, q_last) | in_blocks(k_first, k_last)
      if self.causal:
        some &= low <= 0
        every &= high <= 0
    # a key block cut short by the end of the sequence is padded: its tail needs the mask
    ragged = k_first + k_block > kv_len
    return np.where(some, np.where(every & ~ragged, 2, 1), 0).astype(np.int8)

  def key_block_range(self, q_start, q_size: int, kv_len: int) -> tuple[Array, Array]:
    """[first, last) key positions any query in [q_start, q_start + q_size) may see.

    With global tokens only causality bounds it (a global key may lie anywhere).
    """
    if self.global_tokens:
      last = jnp.minimum(q_start + q_size, kv_len) if self.causal else kv_len
      return jnp.asarray(0), jnp.asarray(last)
    first = 0 if self.left is None else jnp.maximum(q_start - self.left, 0)
    last = kv_len if self.right is None else jnp.minimum(q_start + q_size + self.right, kv_len)
    return jnp.asarray(first), jnp.asarray(last)

  def query_block_range(self, k_start, k_size: int, q_len: int) -> tuple[Array, Array]:
    """[first, last) query positions that may see some key in [k_start, k_start + k_size)."""
    if self.global_tokens:
      return jnp.asarray(k_start if self.causal else 0), jnp.asarray(q_len)
    first = 0 if self.right is None else jnp.maximum(k_start - self.right, 0)
    last = q_len if self.left is None else jnp.minimum(k_start + k_size + self.left, q_len)
    return jnp.asarray(first), jnp.asarray(last)

  def full_key_range(self, q_start, q_size: int) -> tuple[Array, Array]:
    """[first, last) key positions every query in [q_start, q_start + q_size) sees.

    Empty (first ≥ last) when the window is narrower than the block; key lengths
    are not taken into account.
    """
    q_last = q_start + q_size - 1
    first = 0 if self.left is None else jnp.maximum(q_last - self.left, 0)
    last = jnp.iinfo(jnp.int32).max if self.right is None else q_start + self.right + 1
    return jnp.asarray(first), jnp.asarray(last)

  def full_query_range(self, k_start, k_size: int) -> tuple[Array, Array]:
    """[first, last) query positions that see every key in [k_start, k_start + k_size)."""
    k_last = k_start + k_size - 1
    first = 0 if self.right is None else jnp.maximum(k_last - self.right, 0)
    last = jnp.iinfo(jnp.int32).max if self.left is None else k_start + self.left + 1
    return jnp.asarray(first), jnp.asarray(last)
