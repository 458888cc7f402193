"""Deterministic, checkpointable batch streams.

A stream yields dicts of NumPy arrays with a leading global-batch axis. Batch n is a
pure function of (seed, n), so the whole iterator state is the step counter n: it is
saved in every checkpoint (`get_state`) and restoring it (`set_state`) continues the
exact same sequence of batches after a crash, on any number of devices or hosts.
This gives the guarantees of grain's checkpointable iterators without a worker pool.
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


class GeneratedStream:
  """Endless generated data: batch n = generate(np.random.default_rng([seed, n]), batch_size)."""

  def __init__(self, generate: Callable[[np.random.Generator, int], Batch], batch_size: int,
               seed: int):
    self.generate, self.batch_size, self.seed, self.step = generate, batch_size, seed, 0

  def __iter__(self) -> Iterator[Batch]:
    return self

  def __next__(self) -> Batch:
    batch = self.generate(np.random.default_rng([self.seed, self.step]), self.batch_size)
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class ShuffledStream:
  """Endless epochs over a finite dataset, reshuffled every epoch.

  arrays: equal-length arrays [N, ...]. Epoch e visits the examples in the order
  np.random.default_rng([seed, e]).permutation(N), in N // batch_size whole batches
  (the remainder of each permutation is left out of that epoch only).
  """

  def __init__(self, arrays: Batch, batch_size: int, seed: int):
    sizes = {len(a) for a in arrays.values()}
    if len(sizes) != 1:
      raise ValueError(f"arrays must have equal lengths, got {sizes}")
    (size,) = sizes
    if batch_size > size:
      raise ValueError(f"batch_size {batch_size} exceeds the dataset's {size} examples")
    self.arrays, self.batch_size, self.seed, self.step = arrays, batch_size, seed, 0
    self.size, self.batches_per_epoch = size, size // batch_size

  def __iter__(self) -> Iterator[Batch]:
    return self

  def __next__(self) -> Batch:
    epoch, index = divmod(self.step, self.batches_per_epoch)
    order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
    rows = order[index * self.batch_size:(index + 1) * self.batch_size]
    self.step += 1
    return {name: a[rows] for name, a in self.arrays.items()}

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


def eval_batches(arrays: Batch, batch_size: int) -> list[Batch]:
  """Every example once, in order, in batches of exactly batch_size.

  The last batch is padded by repeating example 0; each batch carries a float32
  `weight` [batch_size] that is 1 for real examples and 0 for padding.
  """
  size = len(next(iter(arrays.values())))
  batches = []
  for start in range(0, size, batch_size):
    rows = np.arange(start, start + batch_size)
    weight = (rows < size).astype(np.float32)
    rows = np.where(rows < size, rows, 0)
    batches.append({**{name: a[rows] for name, a in arrays.items()}, "weight": weight})
  return batches
