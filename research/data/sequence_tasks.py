"""Synthetic long-range dependency tasks: copy, reverse, adding problem, associative recall.

Each generator is a pure function of a NumPy generator and a batch size B (plus task
settings) returning a batch of NumPy arrays, so `GeneratedStream` can replay it. T is the
dependency distance: the number of blanks (or, for the adding problem, the whole length)
between what the model must remember and where it must produce it.
"""

import numpy as np

Batch = dict[str, np.ndarray]
BLANK = 0


def copy_memory(rng: np.random.Generator, batch_size: int, *, length: int, num_symbols: int,
                num_items: int, reverse: bool = False) -> Batch:
  """Hochreiter & Schmidhuber's (1997) copy-memory task, in Arjovsky et al.'s (2016) layout.

  Each input is K symbols drawn uniformly with replacement, T blanks, the delimiter and
  K blanks; at those last K positions the model must output the K symbols (in reverse
  order when `reverse`).

  Tokens, with n = num_symbols and K = num_items: 0 blank, 1 … n symbols, n + 1 delimiter
  (vocabulary n + 2); the targets are classes 0 … n − 1, symbol s being token s + 1.

  Returns:
    inputs [B, K + T + 1 + K] int32 tokens; targets [B, K] int32 classes of the symbols
    due at the last K positions.
  """
  symbols = rng.integers(num_symbols, size=(batch_size, num_items))
  inputs = np.full((batch_size, 2 * num_items + length + 1), BLANK, np.int32)
  inputs[:, :num_items] = symbols + 1
  inputs[:, num_items + length] = num_symbols + 1
  targets = symbols[:, ::-1] if reverse else symbols
  return {"inputs": inputs, "targets": targets.astype(np.int32)}


def adding_problem(rng: np.random.Generator, batch_size: int, *, length: int) -> Batch:
  """Hochreiter & Schmidhuber's (1997) adding problem, as in Le et al. (2015).

  Channel 0 holds T values drawn from U(0, 1), channel 1 is 0 except for two 1s, one at
  a uniform position of each half [0, ⌊T/2⌋) and [⌊T/2⌋, T). The target is the sum of the
  two marked values; always predicting its mean 1 gives the MSE Var = 2/12 ≈ 0.167.

  Returns:
    inputs [B, T, 2] float32 (value, marker); targets [B] float32.
  """
  half = length // 2
  values = rng.uniform(size=(batch_size, length)).astype(np.float32)
  rows = np.arange(batch_size)
  first, second = rng.integers(half, size=batch_size), rng.integers(half, length, size=batch_size)
  markers = np.zeros((batch_size, length), np.float32)
  markers[rows, first] = markers[rows, second] = 1.0
  targets = values[rows, first] + values[rows, second]
  return {"inputs": np.stack([values, markers], axis=-1), "targets": targets}


def associative_recall(rng: np.random.Generator, batch_size: int, *, length: int,
                       num_symbols: int, num_items: int) -> Batch:
  """Associative recall (Ba et al. 2016): K key–value pairs, T blanks, then a query key.

  The K keys are distinct, drawn from the n keys; values are drawn uniformly with
  replacement; the query is one of the K keys, uniformly. Input layout:
  k_1 v_1 k_2 v_2 … k_K v_K, T blanks, query.

  Tokens, with n = num_symbols and K = num_items: 0 blank, 1 … n keys, n + 1 … 2n values
  (vocabulary 2n + 1); the targets are classes 0 … n − 1, value v being token n + 1 + v.

  Returns:
    inputs [B, 2K + T + 1] int32 tokens; targets [B] int32, the class of the queried value.
  """
  keys = np.argsort(rng.random((batch_size, num_symbols)), axis=1)[:, :num_items]
  values = rng.integers(num_symbols, size=(batch_size, num_items))
  query = rng.integers(num_items, size=batch_size)
  rows = np.arange(batch_size)
  inputs = np.full((batch_size, 2 * num_items + length + 1), BLANK, np.int32)
  inputs[:, 0:2 * num_items:2] = keys + 1
  inputs[:, 1:2 * num_items:2] = values + num_symbols + 1
  inputs[:, -1] = keys[rows, query] + 1
  return {"inputs": inputs, "targets": values[rows, query].astype(np.int32)}
