"""Deterministic, checkpointable batch streams: dicts of NumPy arrays with a leading
global-batch axis, batch n a pure function of (seed, n). The whole iterator state is the step
counter n, saved in every checkpoint (`get_state`); restoring it (`set_state`) continues the
exact same sequence of batches after a crash, on any number of devices or hosts. This gives
the guarantees of grain's checkpointable iterators without a worker pool.
"""

from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

Batch = dict[str, np.ndarray]


class Stream(Protocol):
  batch_size: int

  def __next__(self) -> Batch: ...
  def get_state(self) -> dict: ...
  def set_state(self, state: dict) -> None: ...
  def select(self, index: int, count: int) -> None: ...


class Share:
  """The rows [start, stop) of every global batch of `batch_size` that process `index`
  of `count` feeds (all of them by default).

  On several processes each one makes only its rows of every global batch
  (`select(index, count)`: the contiguous share `index` of `count`): the data a host
  generates or gathers is its share, and the shares put together are the one-process
  batch, bit for bit.
  """

  def __init__(self, batch_size: int):
    self.batch_size, self.start, self.stop = batch_size, 0, batch_size

  def select(self, index: int, count: int) -> None:
    if self.batch_size % count:
      raise ValueError(f"batch_size {self.batch_size} does not split over {count} processes")
    size = self.batch_size // count
    self.start, self.stop = index * size, (index + 1) * size


BLOCK = 8   # rows of a generated batch drawn from one generator


class GeneratedStream(Share):
  """Endless generated data: rows j·BLOCK … (j + 1)·BLOCK − 1 of batch n are
  generate(np.random.default_rng([seed, n, j]), BLOCK) (the last block shorter when BLOCK
  does not divide batch_size), so a process draws only the blocks its rows lie in."""

  def __init__(self, generate: Callable[[np.random.Generator, int], Batch], batch_size: int,
               seed: int):
    super().__init__(batch_size)
    self.generate, self.seed, self.step = generate, seed, 0

  def __iter__(self) -> Iterator[Batch]:
    return self

  def __next__(self) -> Batch:
    first, last = self.start // BLOCK, (self.stop - 1) // BLOCK
    blocks = [self.generate(np.random.default_rng([self.seed, self.step, j]),
                            min(BLOCK, self.batch_size - j * BLOCK))
              for j in range(first, last + 1)]
    self.step += 1
    offset = first * BLOCK
    return {name: np.concatenate([block[name] for block in blocks])[
        self.start - offset:self.stop - offset] for name in blocks[0]}

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class ShuffledStream(Share):
  """Endless epochs over a finite dataset, reshuffled every epoch, optionally bucketed by length.

  arrays: equal-length arrays [N, ...]. Epoch e draws from np.random.default_rng([seed, e]):

    no buckets   the examples in the order permutation(N), in N // batch_size whole batches
                 (the remainder of each permutation is left out of that epoch only)
    buckets      lengths [N] and ascending `boundaries` (the last ≥ max(lengths)): example i
                 is in the first bucket whose boundary is ≥ lengths[i]; each bucket is
                 permuted and cut into whole batches, and the epoch visits all of them in
                 a shuffled order. The arrays named in `trim` are cut along their last
                 axis (the positions: [N, L], or [N, 2, L] for pairs) to their bucket's
                 boundary, so short examples make short batches (one compiled step per
                 bucket instead of padding everything to the longest).
  """

  def __init__(self, arrays: Batch, batch_size: int, seed: int, lengths: np.ndarray | None = None,
               boundaries: tuple[int, ...] = (), trim: tuple[str, ...] = ()):
    sizes = {len(a) for a in arrays.values()}
    if len(sizes) != 1:
      raise ValueError(f"arrays must have equal lengths, got {sizes}")
    (size,) = sizes
    if batch_size > size:
      raise ValueError(f"batch_size {batch_size} exceeds the dataset's {size} examples")
    if lengths is None:
      self.buckets = [np.arange(size)]
      boundaries = (None,)
    else:
      if not boundaries or max(lengths) > boundaries[-1]:
        raise ValueError(f"boundaries {boundaries} must end at or above the longest example "
                         f"({max(lengths)})")
      index = np.searchsorted(np.asarray(boundaries), lengths)       # first boundary ≥ length
      self.buckets = [np.flatnonzero(index == b) for b in range(len(boundaries))]
    super().__init__(batch_size)
    self.arrays, self.seed, self.step = arrays, seed, 0
    self.boundaries, self.trim, self._epoch = boundaries, trim, (None, [])
    self.batches_per_epoch = sum(len(rows) // batch_size for rows in self.buckets)
    if not self.batches_per_epoch:
      raise ValueError(f"no bucket holds batch_size={batch_size} examples")

  def __iter__(self) -> Iterator[Batch]:
    return self

  def _batches(self, epoch: int) -> list[tuple[np.ndarray, int | None]]:
    """Epoch `epoch`'s batches: (rows, the boundary to trim to), in the order they come."""
    if self._epoch[0] != epoch:
      rng = np.random.default_rng([self.seed, epoch])
      batches = []
      for rows, boundary in zip(self.buckets, self.boundaries, strict=True):
        rows = rows[rng.permutation(len(rows))]
        whole = len(rows) // self.batch_size
        batches += [(part, boundary) for part in np.split(rows[:whole * self.batch_size], whole)
                    ] if whole else []
      order = rng.permutation(len(batches)) if len(self.buckets) > 1 else range(len(batches))
      self._epoch = (epoch, [batches[i] for i in order])
    return self._epoch[1]

  def __next__(self) -> Batch:
    epoch, index = divmod(self.step, self.batches_per_epoch)
    rows, boundary = self._batches(epoch)[index]
    rows = rows[self.start:self.stop]
    self.step += 1
    return {name: a[rows, ..., :boundary] if name in self.trim else a[rows]
            for name, a in self.arrays.items()}

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


def eval_batches(arrays: Batch, batch_size: int, lengths: np.ndarray | None = None,
                 boundaries: tuple[int, ...] = (), trim: tuple[str, ...] = ()) -> list[Batch]:
  """Every example once, in batches of exactly batch_size.

  The last batch is padded by repeating an example; each batch carries a float32
  `weight` [batch_size] that is 1 for real examples and 0 for padding. With lengths [N]
  and boundaries (as in ShuffledStream) the examples come shortest first and the arrays
  named in `trim` are cut along their last axis to the smallest boundary ≥ their batch's
  longest.
  """
  size = len(next(iter(arrays.values())))
  order = np.arange(size) if lengths is None else np.argsort(lengths, kind="stable")
  batches = []
  for start in range(0, size, batch_size):
    rows = np.arange(start, start + batch_size)
    weight = (rows < size).astype(np.float32)
    rows = order[np.where(rows < size, rows, start)]
    boundary = None
    if lengths is not None:
      boundary = boundaries[np.searchsorted(np.asarray(boundaries), lengths[rows].max())]
    batches.append({**{name: a[rows, ..., :boundary] if name in trim else a[rows]
                       for name, a in arrays.items()}, "weight": weight})
  return batches
