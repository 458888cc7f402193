"""`implementation="pallas_tpu"`: splash attention (Pallas TPU), forward and backward.

JAX's splash attention kernels (`jax.experimental.pallas.ops.tpu.splash_attention`), with
our patterns as their static masks, visit only the tiles in which some query sees some key.
On a TPU they are compiled by Mosaic; on any other backend they run through Pallas'
interpreter (plain XLA operations), slowly but exactly: registered as interpreted on CPUs and
GPUs, for tests, taken by name only ("auto" never runs an interpreted kernel).
"""

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel,
    splash_attention_mask,
)

from research.attention import registry
from research.attention.masks import Visibility

Array = jax.Array
LANES = 128             # TPU vector lanes: tile lengths are multiples of this
DEFAULT_BLOCK = 512     # tile length along q and kv (clipped to the padded lengths)
HEAD_DIM_MULTIPLE = 64  # splash's TPU tests cover head dims 64, 128, 192, 256


def _runs(positions: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """Sorted distinct positions → maximal runs [start, stop) of consecutive positions."""
  runs = []
  for p in positions:
    if runs and runs[-1][1] == p:
      runs[-1][1] = p + 1
    else:
      runs.append([p, p + 1])
  return tuple((start, stop) for start, stop in runs)


class PatternMask(splash_attention_mask._ComputableMask):
  """Our static pattern on the padded [q_len, kv_len] grid, as a splash computable mask.

  Query i sees key j when (−left ≤ j − i ≤ right or i ∈ G or j ∈ G) and (not causal or
  j ≤ i) and j < kv_len (keys past kv_len are padding). left / right None: unbounded.
  `mask_function` evaluates this on position arrays (NumPy when splash builds its block
  information, jnp inside the kernel); `__getitem__` answers tiles that are wholly visible
  or wholly invisible without evaluating it, which keeps that building fast at long L.
  """

  def __init__(self, shape: tuple[int, int], rule: Visibility, kv_len: int):
    self.rule = rule._replace(kv_lengths=None)
    self.left, self.right, self.causal = rule.left, rule.right, rule.causal
    self.global_runs, self.kv_len = _runs(rule.global_tokens), kv_len
    self.pattern = (shape, self.rule, kv_len)
    super().__init__(shape, self.visible)

  def visible(self, q, k):
    """bool, broadcast of q and k (positions): query q sees key k."""
    flags = {}
    if self.global_runs:
      flags = dict(global_queries=self._is_global(q), global_keys=self._is_global(k))
    conditions = [self.rule.pattern_visible(q, k, **flags)]
    conditions = [] if conditions[0] is None else conditions
    if self.kv_len < self.shape[1]:
      conditions.append(k < self.kv_len)
    return functools.reduce(operator.and_, conditions)

  def _is_global(self, x):
    """bool like x: position x is a global token."""
    inside = [(x == start) if stop == start + 1 else (x >= start) & (x < stop)
              for start, stop in self.global_runs]
    return functools.reduce(operator.or_, inside)

  def _tile_value(self, q0: int, q1: int, k0: int, k1: int) -> bool | None:
    """True / False when every / no query of [q0, q1) sees every / any key of [k0, k1);
    None when the tile is mixed or this cheap test cannot tell."""
    low, high = k0 - (q1 - 1), (k1 - 1) - q0            # the tile's range of j − i
    left = np.inf if self.left is None else self.left
    right = np.inf if self.right is None else self.right
    window_all = low >= -left and high <= right
    window_none = high < -left or low > right
    meets = lambda a, b: any(start < b and a < stop for start, stop in self.global_runs)
    covers = lambda a, b: any(start <= a and b <= stop for start, stop in self.global_runs)
    causal_all = not (self.causal and self.global_runs) or high <= 0
    causal_none = self.causal and bool(self.global_runs) and low > 0
    if k0 >= self.kv_len or causal_none or (window_none and not meets(q0, q1)
                                            and not meets(k0, k1)):
      return False
    if k1 <= self.kv_len and causal_all and (window_all or covers(q0, q1) or covers(k0, k1)):
      return True
    return None

  def __getitem__(self, idx) -> np.ndarray:
    (q0, q1, _), (k0, k1, _) = (s.indices(n) for s, n in zip(idx, self.shape))
    value = self._tile_value(q0, q1, k0, k1)
    if value is not None:
      return np.full((q1 - q0, k1 - k0), value)
    rows, cols = np.arange(q0, q1, dtype=np.int32), np.arange(k0, k1, dtype=np.int32)
    return np.broadcast_to(self.visible(rows[:, None], cols[None, :]), (q1 - q0, k1 - k0))

  def __eq__(self, other):
    return isinstance(other, PatternMask) and self.pattern == other.pattern

  def __hash__(self):
    return hash((PatternMask, self.pattern))


class SparseMask(splash_attention_mask.Mask):
  """A block-sparse pattern within causality on the padded [q_len, kv_len] grid, keys past
  kv_len masked: a mask splash reads tile by tile on the host (`__getitem__`, NumPy),
  keeping the distinct partially visible tiles (few: the patterns repeat) for the kernel.
  """

  def __init__(self, shape: tuple[int, int], rule: Visibility, kv_len: int):
    self._shape, self.rule, self.kv_len = tuple(shape), rule._replace(kv_lengths=None), kv_len

  @property
  def shape(self) -> tuple[int, int]:
    return self._shape

  def __getitem__(self, idx) -> np.ndarray:
    (q0, q1, _), (k0, k1, _) = (s.indices(n) for s, n in zip(idx, self.shape))
    keys = min(k1, self.kv_len)
    tile = np.zeros((q1 - q0, k1 - k0), bool)
    if keys <= k0:
      return tile
    some, every = self.rule.rectangles(q0, q1 - 1, k0, keys - 1)
    if some:
      rows, cols = np.arange(q0, q1)[:, None], np.arange(k0, keys)[None, :]
      tile[:, :keys - k0] = True if every else self.rule.pattern_visible(rows, cols)
    return tile

  def __eq__(self, other):
    return isinstance(other, SparseMask) and (self.shape, self.rule, self.kv_len) == (
        other.shape, other.rule, other.kv_len)

  def __hash__(self):
    return hash((SparseMask, self.shape, self.rule, self.kv_len))


def splash_mask(visibility: Visibility, padded: tuple[int, int],
                kv_len: int) -> splash_attention_mask.Mask:
  """The static part of `visibility` on the padded [q_len, kv_len] grid (see
  `pallas_tpu_attention`)."""
  if visibility.sparsity is not None:
    return SparseMask(padded, visibility, kv_len)
  if visibility.left is None and visibility.right is None and kv_len == padded[1]:
    return splash.FullMask(padded)  # global tokens add nothing to an unbounded window
  return PatternMask(padded, visibility, kv_len)


@functools.lru_cache(maxsize=32)
def _kernel(mask: splash_attention_mask.Mask, heads: int, block_q: int, block_kv: int,
            interpret: bool) -> splash_attention_kernel.SplashAttentionKernel:
  """splash's MHA kernel (forward and custom VJP) for `mask` on every head; its block
  information is computed here, once per pattern, shape and tiling, as concrete arrays even
  when called under `jit` (the cached kernel must hold no tracer). Building it (splash's
  `MaskInfo`) evaluates the pattern tile by tile on the host: at L = 32768 with 512-tiles,
  about 1 s for a causal window and a few seconds with scattered global tokens; at
  L = 16384 about 1.5 s for BigBird (B = 64, tiles of 128) or the fixed pattern, 10 s for
  the strided one (every tile within causality is partial and evaluated)."""
  tiles = splash.BlockSizes(
      block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
      block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
      block_q_dq=block_q, block_kv_dq=block_kv)
  with jax.ensure_compile_time_eval():
    return splash.make_splash_mha(splash.MultiHeadMask((mask,) * heads), block_sizes=tiles,
                                  head_shards=1, q_seq_shards=1, interpret=interpret)


def _tile(block_size: int | None, length: int, nest: int | None) -> int:
  """The tile length along a sequence of `length`: the block, at most `length` rounded up
  to a multiple of 128; for a pattern of blocks of `nest` (BigBird's B), at most
  max(128, gcd(block, B)), so that few tiles differ."""
  block = DEFAULT_BLOCK if block_size is None else block_size
  if block % LANES:
    raise ValueError(f"pallas_tpu: block_size must be a multiple of {LANES}, got {block}")
  if nest:
    block = max(LANES, math.gcd(block, nest))
  return min(block, -(-length // LANES) * LANES)


def sees_a_key(visibility: Visibility, batch: int, q_len: int, kv_len: int) -> Array:
  """bool [batch, q_len]: query i sees at least one key under `visibility` (the window
  [i − left, i + right] meets [0, length), a global key lies below the length and within
  causality, or i is global and length > 0; a block-sparse pattern's first key lies below
  the length)."""
  lengths = (jnp.full((batch, 1), kv_len) if visibility.kv_lengths is None
             else jnp.minimum(visibility.kv_lengths, kv_len)[:, None])
  if visibility.sparsity is not None:
    return jnp.asarray(visibility.sparsity.first_keys(q_len, kv_len))[None, :] < lengths
  i = jnp.arange(q_len)[None, :]
  first = 0 if visibility.left is None else jnp.maximum(i - visibility.left, 0)
  last = lengths - 1 if visibility.right is None else jnp.minimum(i + visibility.right,
                                                                  lengths - 1)
  sees = first <= last
  if visibility.global_tokens:
    g = jnp.asarray(visibility.global_tokens)
    global_key = g[None, None, :] < lengths[:, :, None]                  # [batch, 1, |G|]
    if visibility.causal:
      global_key = global_key & (g[None, None, :] <= i[:, :, None])     # [batch, q_len, |G|]
    is_global_query = (i[:, :, None] == g[None, None, :]).any(-1)
    sees = sees | global_key.any(-1) | (is_global_query & (lengths > 0))
  return sees


def pallas_tpu_attention(q: Array, k: Array, v: Array, *, scale: float, bias, mask,
                         visibility: Visibility, block_size: int | None, return_weights: bool,
                         interpret: bool) -> Array:
  """The uniform implementation signature (see `research.attention.registry`).

  q: [batch, q_len, H, d]; k: [batch, kv_len, H_kv, d]; v: [batch, kv_len, H_kv, d_v].
  Returns [batch, q_len, H, d_v] in q's dtype. `interpret`: run Pallas' interpreter
  (the dispatcher sets it for the CPU branch) instead of Mosaic. Splash computes
  out = softmax(scale · q kᵀ over visible keys) v: a flash-attention forward and its two
  backward kernels (dq; dk and dv), all visiting only the (block_q × block_kv) tiles in
  which some query sees some key.

  Our pattern as splash sees it. A `Visibility` (see `research.attention.masks`) lets query
  i see key j when

    j < kv_lengths[b]  and  (not causal or j ≤ i)  and  (−left ≤ j − i ≤ right  or  i ∈ G
                                                         or  j ∈ G)

  (or, with a block-sparse pattern, its rule in place of the window and global tokens)

    static part (causal, window, global tokens G, the unpadded kv_len)
        → `PatternMask`, a splash `_ComputableMask`: splash derives from it which tiles are
          empty, full or partial (its `MaskInfo`, built once per pattern and shape and
          cached) and the kernel evaluates the same rule on the positions of a partial tile,
          so no [q_len, kv_len] array exists anywhere. G is kept as runs of consecutive
          positions (two comparisons per run). Without any static constraint: splash's
          `FullMask`.
    a block-sparse pattern (Sparse Transformer's fixed / strided, BigBird; `block_sparse`)
        → `SparseMask`, a plain splash `Mask` that splash reads tile by tile on the host:
          the empty tiles are skipped, the full ones need no mask, and the distinct partial
          tiles (a handful: the patterns repeat; for BigBird the tiles are
          max(128, gcd(512, B)) long, so they hold whole blocks) are kept for the kernel:
          O(n) in all.
    key lengths (per batch element, traced)
        → segment ids: every query has id 0, key j has id 0 if j < kv_lengths[b] else 1.
    heads
        → splash's MHA kernel takes k, v with H_kv heads dividing H (query head h reads kv
          head h // (H / H_kv)), which is our grouped-query attention; vmap over the batch.
    scale
        → splash does not scale: q is multiplied by `scale` first (q, k, v promoted to one
          dtype; the output is cast to q's).

  A query that sees no key (its window lies beyond the key lengths, or kv_lengths = 0) gets
  zeros: splash leaves such rows undefined (an average of masked values, or NaN where no
  tile of the row is visited), so they are replaced after the kernel; their cotangent is
  then zero and contributes nothing to dq, dk, dv.

  Blocks: q_len and kv_len are padded up to multiples of block_q = min(block, q_len rounded
  up to 128) and block_kv (the same for kv_len), `block = block_size or 512`, which must be
  a multiple of 128 (the TPU lane width); padded keys are masked by the static mask, padded
  queries cut off. The backward kernels use the same tiles (dq and dkv kernels separately).

  Limits: no bias and no arbitrary mask (registered mask=False, bias=False); float32 and
  bfloat16; head dims that are multiples of 64 (64, 128, 192, 256 are what splash's own TPU
  tests cover); TPU v4 or newer.
  """
  del return_weights  # never asked for: returns_weights=False
  if bias is not None or mask is not None:
    raise ValueError("pallas_tpu takes no bias or mask (splash's masks are static)")
  batch, q_len, heads, _ = q.shape
  kv_len = k.shape[1]
  dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
  nest = None if visibility.sparsity is None else visibility.sparsity.nest
  block_q, block_kv = _tile(block_size, q_len, nest), _tile(block_size, kv_len, nest)
  padded = (-(-q_len // block_q) * block_q, -(-kv_len // block_kv) * block_kv)
  kernel = _kernel(splash_mask(visibility, padded, kv_len), heads, block_q, block_kv,
                   bool(interpret))

  def heads_first(x, length):  # [batch, len, h, d] → [batch, h, padded len, d]
    x = jnp.pad(x.astype(dtype), ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))
    return x.transpose(0, 2, 1, 3)

  args = [heads_first(q.astype(dtype) * scale, padded[0]), heads_first(k, padded[1]),
          heads_first(v, padded[1])]
  if visibility.kv_lengths is not None:
    key_ids = jnp.arange(padded[1])[None, :] >= visibility.kv_lengths[:, None]
    args.append(splash.SegmentIds(q=jnp.zeros((batch, padded[0]), jnp.int32),
                                  kv=key_ids.astype(jnp.int32)))
  out = jax.vmap(kernel)(*args)[:, :, :q_len].transpose(0, 2, 1, 3)
  beyond_keys = visibility.left is not None and q_len - 1 - visibility.left >= kv_len
  if visibility.sparsity is not None:
    beyond_keys = bool((visibility.sparsity.first_keys(q_len, kv_len) >= kv_len).any())
  if visibility.kv_lengths is not None or beyond_keys:
    out = jnp.where(sees_a_key(visibility, batch, q_len, kv_len)[:, :, None, None], out, 0)
  return out.astype(q.dtype)


def refusals(request: registry.Request) -> list[str]:
  """What of `request` splash cannot do beyond the registered capabilities, in words."""
  if request.head_dim % HEAD_DIM_MULTIPLE:
    return [f"head dim {request.head_dim} (pallas_tpu takes multiples of {HEAD_DIM_MULTIPLE})"]
  return []


registry.register(registry.Implementation(
    "pallas_tpu", pallas_tpu_attention, window="optional", global_tokens=True,
    block_sparse=True, key_value_seq_lengths=True, gqa=True,
    dtypes=frozenset({"float32", "bfloat16"}),
    platforms=frozenset({"tpu"}), interpreted=frozenset({"cpu", "gpu"}), refuses=refusals,
    auto_rank=0))
