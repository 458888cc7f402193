"""Block-sparse attention patterns: Sparse Transformer's fixed and strided, BigBird.

A pattern says which key j a query i may see, before causality and key lengths (which
`masks.Visibility` adds). Patterns are static, so a kernel knows before it runs which blocks
it visits; the tiled implementations then need O(n) memory and no [n, n] mask.
"""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np


def _xp(*arrays):
  """NumPy when every array is NumPy (host-side block information), else jax.numpy."""
  return np if all(isinstance(a, (np.ndarray, np.generic, int)) for a in arrays) else jnp


def _positive_int(owner: str, name: str, value, minimum: int = 1):
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}")


class BlockSparse:
  """What every pattern answers (subclasses are frozen dataclasses of ints: hashable).

  `visible(queries, keys)` is the rule (True = visible) on positions (NumPy or JAX arrays,
  also inside a Pallas kernel where `nest` allows: see `within_blocks`); `tiles` answers,
  for rectangles of positions, whether some / every query there sees some / every key there
  (`Visibility.block_map` builds on it). The patterns are plain ints (BigBird's draws a
  NumPy table), so all of it is known before a kernel runs. A BigBird pattern is bound to
  a shape (`bind`) before use: its draws depend on the numbers of blocks.

    dot_product_attention(q, k, v, sparsity=BigBird(block=64, seed=layer), is_causal=True)
    MultiHeadAttention(num_heads=8, sparsity=SparseFixed(block=128, summary=8))
  """

  nest = None  # tiles lying within blocks of this many positions see `within_blocks`; None: any

  def bind(self, q_len: int, kv_len: int, causal: bool) -> "BlockSparse":
    """The pattern for one shape (only BigBird's draws depend on it)."""
    del q_len, kv_len, causal
    return self

  def visible(self, queries, keys):
    """bool, the broadcast of int position arrays `queries` and `keys`: the rule."""
    raise NotImplementedError

  def within_blocks(self, queries, keys):
    """The rule on a tile of positions lying within one block pair of `nest` positions
    that `tiles` says some query sees (None: all of it). Needs no table: for a kernel."""
    return self.visible(queries, keys)

  def tiles(self, q_first, q_last, k_first, k_last) -> tuple[np.ndarray, np.ndarray]:
    """(some, every) bool NumPy arrays, the broadcast of the inclusive position bounds of
    rectangles [q_first, q_last] × [k_first, k_last]: some query there sees some key (may
    say True of an empty rectangle), every query sees every key (may say False of a full
    one). The kernels visit rectangles with `some` and skip the mask where `every`."""
    raise NotImplementedError

  def first_keys(self, q_len: int, kv_len: int) -> np.ndarray:
    """int [q_len]: the first key each query sees (causality included: it is ≤ the query
    in every pattern here), kv_len when it sees none."""
    raise NotImplementedError

  def global_queries(self, q_len: int) -> tuple[int, ...]:
    """Positions of the queries that see every key (to compute apart as dense rows)."""
    del q_len
    return ()

  def without_global_queries(self) -> "BlockSparse":
    """The pattern with `global_queries` seeing nothing (their rows computed apart)."""
    return self


@dataclasses.dataclass(frozen=True)
class SparseFixed(BlockSparse):
  """Sparse Transformer's fixed pattern (Child et al. 2019, "fixed"):

    ⌊i / l⌋ = ⌊j / l⌋   or   j mod l ≥ l − c

  its own block of l positions, and the last c positions of every block (causal: of every
  earlier block), which summarise them. The tiled implementations visit its own block and
  the tiles holding earlier blocks' summaries, O(n·(l + t·n/l)) with tiles of t.
  """
  block: int          # l, the block length
  summary: int = 1    # c, the last positions of each block that every query sees

  def __post_init__(self):
    _positive_int("SparseFixed", "block", self.block)
    _positive_int("SparseFixed", "summary", self.summary)
    if self.summary > self.block:
      raise ValueError(f"SparseFixed: summary ({self.summary}) must be at most block "
                       f"({self.block})")

  def visible(self, queries, keys):
    l, c = self.block, self.summary
    return (queries // l == keys // l) | (keys % l >= l - c)

  def tiles(self, q_first, q_last, k_first, k_last):
    l, c = self.block, self.summary
    same_block = (q_first // l <= k_last // l) & (k_first // l <= q_last // l)
    # the first summary position at or after k_first
    first_summary = np.where(k_first % l >= l - c, k_first, k_first // l * l + l - c)
    some = same_block | (first_summary <= k_last)
    one_block = (q_first // l == q_last // l) & (q_first // l == k_first // l) & (
        k_first // l == k_last // l)
    all_summary = (c == l) | ((k_first // l == k_last // l) & (k_first % l >= l - c))
    return some, one_block | all_summary

  def first_keys(self, q_len, kv_len):
    # a query of block 0 sees key 0; a later one the first summary, l − c (< its block)
    first = np.where(np.arange(q_len) < self.block, 0, self.block - self.summary)
    return np.where(first < kv_len, first, kv_len)


@dataclasses.dataclass(frozen=True)
class SparseStrided(BlockSparse):
  """Sparse Transformer's strided pattern (Child et al. 2019, "strided"):

    |j − i| ≤ l   or   (j − i) mod l = 0

  the l previous (and, not causal, next) positions, and every l-th position. The stride
  positions fall in every key tile at least l long, so the tiled implementations visit
  every tile within causality: the work of full attention.
  """
  stride: int         # l

  def __post_init__(self):
    _positive_int("SparseStrided", "stride", self.stride)

  def visible(self, queries, keys):
    l = self.stride
    offset = keys - queries
    return (abs(offset) <= l) | (offset % l == 0)

  def tiles(self, q_first, q_last, k_first, k_last):
    l = self.stride
    low, high = k_first - q_last, k_last - q_first     # every offset between is met
    some = ((high >= -l) & (low <= l)) | (high // l * l >= low)
    return some, ((low >= -l) & (high <= l)) | (l == 1)

  def first_keys(self, q_len, kv_len):
    i = np.arange(q_len)
    first = np.where(i < self.stride, 0, i % self.stride)
    return np.where(first < kv_len, first, kv_len)


@functools.lru_cache(maxsize=64)
def _bigbird_draws(pattern: "BigBird") -> np.ndarray:
  """int [q_blocks, r]: the random key blocks of each query block, −1 where none."""
  q_blocks, k_blocks = pattern.blocks
  reach, g, r = (pattern.window - 1) // 2, pattern.global_blocks, pattern.random_blocks
  rng = np.random.default_rng(pattern.seed)
  draws = np.full((q_blocks, r), -1, np.int64)
  for a in range(g, q_blocks):
    c = np.arange(g, a if pattern.causal else k_blocks)
    candidates = c[np.abs(c - a) > reach]
    chosen = rng.choice(candidates, size=min(r, candidates.size), replace=False)
    draws[a, :chosen.size] = np.sort(chosen)
  draws.setflags(write=False)
  return draws


@functools.lru_cache(maxsize=64)
def _bigbird_table(pattern: "BigBird") -> np.ndarray:
  """bool [q_blocks, k_blocks]: query block a sees key block c."""
  q_blocks, k_blocks = pattern.blocks
  a, c = np.arange(q_blocks)[:, None], np.arange(k_blocks)[None, :]
  table = (np.abs(c - a) <= (pattern.window - 1) // 2) | (c < pattern.global_blocks)
  global_rows = a < pattern.global_blocks
  table = table | global_rows if pattern.global_rows else table & ~global_rows
  draws = _bigbird_draws(dataclasses.replace(pattern, global_rows=True))
  rows = np.repeat(np.arange(q_blocks), draws.shape[1])
  table[rows[draws.ravel() >= 0], draws.ravel()[draws.ravel() >= 0]] = True
  table.setflags(write=False)
  return table


@functools.lru_cache(maxsize=64)
def _bigbird_counts(pattern: "BigBird") -> np.ndarray:
  """int [q_blocks + 1, k_blocks + 1]: counts[a, c] = the visible pairs of table[:a, :c]."""
  counts = np.pad(_bigbird_table(pattern).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
  counts.setflags(write=False)
  return counts


@dataclasses.dataclass(frozen=True)
class BigBird(BlockSparse):
  """BigBird's pattern on blocks of B positions: window, global and random blocks (Zaheer
  et al. 2020).

  Visibility is constant on blocks of B positions: query block a = ⌊i / B⌋ sees key
  block c = ⌊j / B⌋ when

    |c − a| ≤ (w − 1) / 2                       (window: w blocks centred on a)
    or c < g or a < g                           (global: the first g blocks see every
                                                 block and every block sees them)
    or c ∈ R_a                                  (random)

  R_a: r blocks drawn without replacement, for each non-global query block in order,
  from those neither in a's window nor global (causal: only earlier blocks, c < a),
  with NumPy's `default_rng(seed)`: once per seed and shape, the same in every call
  and in every head, as a layer's fixed pattern. Fewer when fewer are left. The tiled
  implementations visit w + g + r key blocks per query block (global rows all),
  O(n·B·(w + g + r)).
  """
  block: int = 64               # B
  window: int = 3               # w, odd: the own block and (w − 1) / 2 on each side
  global_blocks: int = 2        # g: the first g blocks see and are seen by every block
  random_blocks: int = 3        # r per query block
  seed: int = 0                 # of the random blocks (one per layer)
  blocks: tuple[int, int] | None = None   # (query blocks, key blocks), set by `bind`
  causal: bool = False          # set by `bind`: random blocks only among earlier blocks
  global_rows: bool = True      # False: global query blocks see nothing (computed apart)

  def __post_init__(self):
    _positive_int("BigBird", "block", self.block)
    _positive_int("BigBird", "window", self.window)
    if self.window % 2 == 0:
      raise ValueError(f"BigBird: window must be an odd number of blocks (the own block and "
                       f"as many on each side), got {self.window}")
    _positive_int("BigBird", "global_blocks", self.global_blocks, minimum=0)
    _positive_int("BigBird", "random_blocks", self.random_blocks, minimum=0)
    _positive_int("BigBird", "seed", self.seed, minimum=0)

  @property
  def nest(self) -> int:
    return self.block

  def bind(self, q_len, kv_len, causal):
    blocks = (-(-q_len // self.block), -(-kv_len // self.block))
    return dataclasses.replace(self, blocks=blocks, causal=bool(causal))

  def _bound(self):
    if self.blocks is None:
      raise ValueError("BigBird: bind(q_len, kv_len, causal) the pattern to a shape first "
                       "(dot_product_attention does)")

  def draws(self) -> np.ndarray:
    """int [query blocks, r]: the random key blocks of each query block, sorted, −1 where
    fewer were left to draw (and on the global rows, which see everything)."""
    self._bound()
    return _bigbird_draws(dataclasses.replace(self, global_rows=True))

  def table(self) -> np.ndarray:
    """bool [query blocks, key blocks]: query block a sees key block c."""
    self._bound()
    return _bigbird_table(self)

  def visible(self, queries, keys):
    table = self.table()
    xp = _xp(queries, keys)
    a = xp.minimum(queries // self.block, table.shape[0] - 1)   # padding: masked elsewhere
    c = xp.minimum(keys // self.block, table.shape[1] - 1)
    return xp.asarray(table)[a, c]

  def within_blocks(self, queries, keys):
    del queries, keys
    return None

  def tiles(self, q_first, q_last, k_first, k_last):
    table, counts = self.table(), _bigbird_counts(self)
    a0 = np.minimum(q_first // self.block, table.shape[0] - 1)
    a1 = np.minimum(q_last // self.block, table.shape[0] - 1) + 1
    c0 = np.minimum(k_first // self.block, table.shape[1] - 1)
    c1 = np.minimum(k_last // self.block, table.shape[1] - 1) + 1
    seen = counts[a1, c1] - counts[a0, c1] - counts[a1, c0] + counts[a0, c0]
    return seen > 0, seen == (a1 - a0) * (c1 - c0)

  def first_keys(self, q_len, kv_len):
    table = self.table()
    first = np.where(table.any(1), table.argmax(1) * self.block, kv_len)
    first = first[np.minimum(np.arange(q_len) // self.block, table.shape[0] - 1)]
    return np.minimum(first, kv_len)

  def global_queries(self, q_len):
    return tuple(range(min(self.global_blocks * self.block, q_len))) if self.global_rows else ()

  def without_global_queries(self):
    return dataclasses.replace(self, global_rows=False)


PATTERNS = {"fixed": SparseFixed, "strided": SparseStrided, "bigbird": BigBird}


def check(pattern) -> BlockSparse | None:
  """`pattern` if it is None or a block-sparse pattern; else a ValueError naming them."""
  if pattern is None or isinstance(pattern, BlockSparse):
    return pattern
  raise ValueError(f"sparsity must be None or a block-sparse pattern ("
                   f"{', '.join(cls.__name__ for cls in PATTERNS.values())}), got {pattern!r}")
