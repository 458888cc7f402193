"""sequence_tasks: a restored run's answers for input arrays of its task (copy, reverse,
recall or the adding problem, as research/data/sequence_tasks.py makes them):
`predict_sequences` gives the classes and their probabilities, or the adding problem's sums.
"""

import functools
from typing import NamedTuple

import jax
import numpy as np

from research.errors import InputError
from research.experiments.sequence_tasks import sequence_length
from research.models.kinds import RECURRENT
from research.predict.runs import (
  ByIdentity,
  as_array,
  check_experiment,
  in_batches,
  row_bytes,
  rows_per_call,
)

Array = jax.Array


class SequencePredictions(NamedTuple):
  """A run's answers for B inputs."""
  predictions: np.ndarray      # copy / reverse: [B, L] int32, the class of the symbol output at
                               # each position (class s: token s + 1; the task scores the last
                               # K); recall: [B] int32, the queried value's class; adding: [B]
                               # float32, the sum
  probabilities: np.ndarray | None  # softmax of the outputs, [B, L, n] or [B, n]; None (adding)
  outputs: np.ndarray          # the model's outputs as they are, float32: logits [B, L, n]
                               # (copy, reverse), [B, n] (recall), or [B, 1] (adding)


def expected_inputs(config) -> str:
  """What a run of `config` takes, in words."""
  d, length = config.data, sequence_length(config)
  form = ("floats [B, L, 2] (value, marker)" if d.task == "adding"
          else f"ints [B, L] with tokens 0 … {top_token(config)}")
  steps = (f"any L ≥ 1 (model.kind={config.model.kind}; trained with L = {length})"
           if config.model.kind in RECURRENT else
           f"L = {length} (model.kind={config.model.kind} takes the length it was trained with)")
  return f"a run of task {d.task} takes {form}, {steps}"


def top_token(config) -> int:
  """The largest token of a token task: n + 1 (copy, reverse) or 2n (recall)."""
  n = config.data.num_symbols
  return 2 * n if config.data.task == "recall" else n + 1


def check_inputs(config, inputs) -> np.ndarray:
  """`inputs` as the model takes them (int32 tokens or float32 features).

  The inputs are those of the run's task (config.data.task, research/data/sequence_tasks.py),
  of L = sequence_length(config) steps (research/experiments/sequence_tasks.py: K + T + 1 + K
  for copy and reverse, 2K + T + 1 for recall, T for adding); the recurrent kinds (rnn, lstm,
  gru) take any L ≥ 1, the blocks the length they were trained with:

    copy, reverse  ints [B, L], tokens 0 … n + 1 (0 blank, s + 1 symbol s, n + 1 delimiter)
    recall         ints [B, L], tokens 0 … 2n (s + 1 key s, n + 1 + v value v)
    adding         floats [B, L, 2] (value, marker), finite

  with n = config.data.num_symbols. Refused before anything compiles (research.errors.
  InputError naming what was given and what the run takes): another dtype, rank, L or
  channel count, an empty batch, a token out of range (its position named), a non-finite
  value.
  """
  takes = expected_inputs(config)
  inputs = as_array(inputs, "inputs", takes)
  adding = config.data.task == "adding"
  if not np.issubdtype(inputs.dtype, np.floating if adding else np.integer):
    raise InputError(f"inputs of dtype {inputs.dtype}: {takes}")
  steps_taken = (lambda steps: steps >= 1) if config.model.kind in RECURRENT else (
      lambda steps: steps == sequence_length(config))
  if not (inputs.ndim == (3 if adding else 2) and inputs.shape[0] >= 1
          and steps_taken(inputs.shape[1]) and (not adding or inputs.shape[2] == 2)):
    raise InputError(f"inputs of shape {list(inputs.shape)}: {takes}")
  with np.errstate(over="ignore"):     # a float64 beyond float32's range: refused below
    bad = np.argwhere(~np.isfinite(inputs.astype(np.float32)) if adding else
                      (inputs < 0) | (inputs > top_token(config)))
  if len(bad):
    where = ", ".join(map(str, bad[0]))
    raise InputError(f"inputs[{where}] is {inputs[tuple(bad[0])]}: {takes}"
                     + (", finite in float32" if adding else ""))
  return inputs.astype(np.float32 if adding else np.int32)


def predict_sequences(run, inputs) -> SequencePredictions:
  """The run's model on `inputs` (an array of its task's form, `check_inputs`): the classes
  and their probabilities, or the adding problem's sums.

    run = training.restore("runs/copy_gru")
    batch = research.data.sequence_tasks.copy_memory(np.random.default_rng(1), 4, length=10,
                                                     num_symbols=8, num_items=8)
    answers = predict.predict_sequences(run, batch["inputs"])
    answers.predictions[:, -8:]          # the 8 symbols' classes due at the last positions

  The inputs go through the model at most config.train.batch_size at a time (fewer where
  their outputs would pass research.predict.runs.CALL_BYTES a call), the last batch padded
  with copies of its last input: one compiled function per batch shape, memory on the device
  that does not grow with B, the answers gathered on the host.
  """
  check_experiment(run, "sequence_tasks", "predict_sequences")
  inputs = check_inputs(run.config, inputs)
  model, adding = ByIdentity(run.model), run.config.data.task == "adding"
  call = lambda inputs: _predict(model, run.params, inputs, adding=adding)
  rows = rows_per_call(row_bytes(call, (inputs,)), run.config.train.batch_size)
  return SequencePredictions(*in_batches(call, (inputs,), rows))


@functools.partial(jax.jit, static_argnames=("model", "adding"))
def _predict(model: ByIdentity, params, inputs: Array, *, adding: bool):
  """(predictions, probabilities or None, outputs) of model.value on inputs."""
  outputs = model.value.apply({"params": params}, inputs)
  if adding:
    return outputs[:, 0], None, outputs
  return outputs.argmax(-1).astype(np.int32), jax.nn.softmax(outputs), outputs
