"""What every predictor shares: the checks of the run and the settings it is handed, the
attention weights the blocks sow, a run's model as a static jit argument, and the bounds on
what it holds at once: inputs read once into a list (`listed`, `as_array`), sizes and seeds
ints in a stated range (`check_int`), rows through a compiled function in batches of one shape
(`in_batches`), and the outputs that grow with an input's square or the training set bounded
in all (`check_result`). No OverflowError or MemoryError reaches the user.
"""

import numbers
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from research.attention import registry
from research.errors import InputError, excerpt

# Rows one compiled call takes at most, whatever their size (tests lower it to force batches).
MAX_ROWS = 4096
# Bytes of the per-row arrays one call computes at most (its outputs, a step's logits): 256 MiB,
# a small part of any accelerator's or host's memory.
CALL_BYTES = 1 << 28
# Bytes of the optional per-input outputs (attention weights, kernel weights) one answer
# returns at most: 2 GiB, held on the host beside the batch being computed.
RESULT_BYTES = 1 << 31


def check_experiment(run, experiment: str, function: str) -> None:
  """InputError unless `run` (a research.training.Run) is a run of `experiment`:
  `function` answers that experiment's runs only."""
  if run.config.experiment != experiment:
    raise InputError(f"{function} answers {experiment} runs; the run in {run.workdir} is a "
                     f"{run.config.experiment} run")


def is_int(value) -> bool:
  """Whether a setting is an int (a bool is not)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value, name: str, low: int, high: int, note: str = "") -> int:
  """`value` as an int; InputError naming `name` and the range low … high (and `note`, why)
  unless it is an int (a bool is not) within it: nothing reaches jax that overflows or cannot
  be held (char_lm's length × num_samples and seed, nmt_dates' beam_size, say)."""
  if not is_int(value) or not low <= value <= high:
    raise InputError(f"{name}={value!r} must be an int in {low} … {high}"
                     + (f" ({note})" if note else ""))
  return int(value)


def check_bool(value, name: str) -> bool:
  """`value` as a bool; InputError naming `name` unless it is True or False (numpy's too)."""
  if not isinstance(value, bool | np.bool_):
    raise InputError(f"{name}={value!r} must be True or False")
  return bool(value)


def listed(values, name: str, noun: str, item: str) -> list:
  """`values` (any iterable: list, tuple, generator, numpy array) read once into a list, so an
  answer and the inputs it names agree. InputError naming `name` for one str or bytes given
  instead of a list of them (`noun`: what the list holds; `item`: what one is called) and for
  a value that is not iterable (a number, a 0-d array)."""
  if isinstance(values, str | bytes):
    one = f"string {excerpt(values)}" if isinstance(values, str) else f"bytes {values[:60]!r}"
    raise InputError(f"{name} must be a list of {noun}, got one {one}: give [{item}]")
  try:
    iterator = iter(values)
  except TypeError:
    raise InputError(f"{name} must be a list of {noun}, got a {type(values).__name__}, "
                     "which is not iterable") from None
  return list(iterator)


def as_array(values, name: str, takes: str) -> np.ndarray:
  """`values` as a numpy array, an iterator (a generator) read once into a list first.
  InputError naming `name`, with `takes` (what the run takes), for ragged nested lists."""
  if isinstance(values, Iterator):
    values = list(values)
  try:
    return np.asarray(values)
  except ValueError as error:          # ragged nested lists
    raise InputError(f"{name} is not an array ({error}): {takes}") from None


def nbytes(tree) -> int:
  """The bytes of the arrays (or jax.ShapeDtypeStructs) of a pytree."""
  return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
             for leaf in jax.tree.leaves(tree))


def row_bytes(call: Callable, arrays: tuple[np.ndarray, ...]) -> int:
  """The bytes call(*arrays) returns for one row (jax.eval_shape: traced, not compiled)."""
  return nbytes(jax.eval_shape(call, *(array[:1] for array in arrays)))


def rows_per_call(bytes_per_row: int, most: int) -> int:
  """Rows of one compiled call: at most `most` (a predictor's own bound, e.g. the run's
  config.train.batch_size: it held that many rows at once in training) and MAX_ROWS, and
  no more than keep bytes_per_row × rows within CALL_BYTES; at least 1."""
  return max(1, min(int(most), MAX_ROWS, CALL_BYTES // max(int(bytes_per_row), 1)))


def check_result(count: int, bytes_per_input: int, argument: str, what: str, remedy: str
                 ) -> None:
  """InputError naming `argument` when `count` inputs of `bytes_per_input` bytes of `what`
  each exceed RESULT_BYTES; `remedy` says what to ask instead. For the per-input outputs that
  grow with the square of an input's length (attention weights [N, H, S, S]) or with the run's
  training set (kernel weights [N, n]), checked up front, before anything is computed."""
  total = count * bytes_per_input
  if total > RESULT_BYTES:
    raise InputError(f"{argument}: {what} of {count} inputs take {total:,} bytes, more than a "
                     f"prediction returns at once (research.predict.runs.RESULT_BYTES = "
                     f"{RESULT_BYTES:,}): {remedy}")


def in_batches(call: Callable, arrays: tuple[np.ndarray, ...], rows: int, *,
               whole: bool = False):
  """call(*batch) over consecutive batches of `rows` rows of `arrays` (each [N, …]), their
  outputs (a pytree of arrays [rows, …], None allowed) written into host arrays [N, …].
  Every call has min(rows, N) rows (`whole`: rows, also for fewer): the last batch is
  padded with copies of its last row, so that every call has one shape. Memory on the device
  does not grow with N."""
  count = len(arrays[0])
  size = rows if whole else min(rows, count)
  results = None
  for start in range(0, count, size):
    stop = min(start + size, count)
    batch = tuple(_padded(array[start:stop], size) for array in arrays)
    part = jax.device_get(call(*batch))
    if results is None:
      results = jax.tree.map(lambda leaf: np.empty((count, *np.shape(leaf)[1:]),
                                                   np.asarray(leaf).dtype), part)
    for out, leaf in zip(jax.tree.leaves(results), jax.tree.leaves(part), strict=True):
      out[start:stop] = leaf[:stop - start]
  return results


def _padded(rows: np.ndarray, size: int) -> np.ndarray:
  """rows [r, …] followed by copies of its last row up to [size, …]."""
  if len(rows) == size:
    return rows
  return np.concatenate([rows, np.repeat(rows[-1:], size - len(rows), axis=0)])


class ByIdentity:
  """`value`, equal only to another ByIdentity of the very same object: a restored run's
  model as a static argument of jax.jit (a flax Module hashes its fields, and the stack's
  config.model.recurrence, a ConfigDict, does not hash), compiled once per run."""

  def __init__(self, value: Any):
    self.value = value

  def __hash__(self) -> int:
    return id(self.value)

  def __eq__(self, other) -> bool:
    return isinstance(other, ByIdentity) and other.value is self.value


def apply_with_weights(model, variables, *args, **kwargs):
  """(model.apply(variables, *args, **kwargs), each block's attention weights in layer
  order, or None where a block computes none). Where the model's implementation does not
  give its weights, a second pass with implementation "dense" sows them."""
  if registry.gives_weights(model.implementation):
    outputs, state = model.apply(variables, *args, **kwargs, mutable=["intermediates"])
  else:
    outputs = model.apply(variables, *args, **kwargs)
    _, state = model.clone(implementation="dense").apply(variables, *args, **kwargs,
                                                         mutable=["intermediates"])
  return outputs, layer_weights(state.get("intermediates", {}), model.num_layers)


def layer_weights(intermediates, num_layers: int) -> tuple[jax.Array, ...] | None:
  """The attention weights each block sowed ("stack"/"block<i>"/…/"attention_weights"),
  in layer order; None where a block sowed none."""
  blocks = intermediates.get("stack", {})
  weights = []
  for layer in range(num_layers):
    sown = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
        blocks.get(f"block{layer}", {}))[0]
            if any(getattr(key, "key", None) == "attention_weights" for key in path)]
    if not sown:
      return None
    weights.append(sown[0])
  return tuple(weights)
