"""mqar: a restored run answers associative-recall queries, with each layer's attention:
`recall` gives the token the run predicts after each queried position of sequences laid out
as research/data/mqar.py lays them out.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.errors import InputError
from research.predict.runs import (
  ByIdentity,
  apply_with_weights,
  as_array,
  check_bool,
  check_experiment,
  check_result,
  in_batches,
  nbytes,
  rows_per_call,
)

Array = jax.Array


class Recalls(NamedTuple):
  """A run's answers at K positions of B sequences."""
  tokens: np.ndarray           # [B, K] int32: the most likely next token at each position
  probabilities: np.ndarray    # [B, K] float32: its probability
  attention: list[np.ndarray] | None  # per layer [B, H, L, L]: the softmax weights of each
                               # query position over the keys (0 past the query: causal);
                               # None where the blocks compute no weights (recurrences,
                               # linear, performer, reformer, sinkhorn) or attention=False


def recall(run, inputs, positions, *, attention: bool = True) -> Recalls:
  """The run's answers after `positions` of `inputs` and, with `attention`, each layer's
  attention weights (a second pass with implementation "dense" where the model's own does
  not give them).

    run = training.restore("runs/mqar_cpu/<point>")
    batch = research.data.mqar.multi_query_recall(np.random.default_rng(1), 8, length=64,
                                                  num_pairs=8, vocab_size=512)
    answers = predict.recall(run, batch["inputs"], batch["positions"])
    answers.tokens              # [8, 8]: the token predicted after each queried key
    answers.attention[1][0]     # layer 1, the first sequence: [heads, 64, 64], causal

  Inputs: tokens, ints [B, L] in 0 … V − 1 with L = config.data.length and V =
  config.data.vocab_size (research/data/mqar.py lays them out: keys 1 … V/2 − 1, values
  V/2 … V − 1), and positions, ints [B, K] in 0 … L − 1: where to read the next token (K ≥ 1,
  the queries' positions for the task's answers). Refused before anything compiles
  (research.errors.InputError, one line naming what was given and what the run takes):
  another rank or length, an empty batch, a float, a token or a position out of range (its
  place named), more positions a sequence than it has (K > L), attention not a bool.

  The sequences go through the model at most config.train.batch_size at a time (fewer where
  their outputs would pass research.predict.runs.CALL_BYTES a call), the last batch padded
  with copies of its last sequence: one compiled function per (rows, K), memory on the device
  that does not grow with B, the answers gathered on the host. The attention weights
  (attention=True, the default), B · H · L² floats a layer, are refused up front beyond
  research.predict.runs.RESULT_BYTES (2 GiB) in all, naming attention=True; attention=False
  answers any number of sequences.
  """
  check_experiment(run, "mqar", "recall")
  attention = check_bool(attention, "attention")
  d = run.config.data
  inputs = _ints(inputs, "inputs", 2, d.vocab_size, "a token")
  positions = _ints(positions, "positions", 2, d.length, "a position")
  if inputs.shape[1] != d.length:
    raise InputError(f"inputs has {inputs.shape[1]} tokens a sequence; the run takes "
                     f"config.data.length={d.length}")
  if positions.shape[0] != inputs.shape[0] or not 1 <= positions.shape[1] <= d.length:
    raise InputError(f"positions must be [{inputs.shape[0]}, K] with 1 ≤ K ≤ {d.length} (a "
                     f"sequence's positions) for inputs of {inputs.shape[0]} sequences, got "
                     f"shape {positions.shape}")
  model = ByIdentity(run.model)
  call = lambda inputs, positions: _recall(model, run.params, inputs, positions,
                                           attention=attention)
  one = jax.eval_shape(call, inputs[:1], positions[:1])
  check_result(len(inputs), nbytes(one[2]), "attention=True",
               f"the attention weights of {len(one[2] or ())} layers (length {d.length})",
               "pass attention=False, or fewer sequences at once")
  tokens, probabilities, weights = in_batches(
      call, (inputs, positions), rows_per_call(nbytes(one), run.config.train.batch_size))
  return Recalls(tokens, probabilities, None if weights is None else list(weights))


def _ints(array, name: str, rank: int, bound: int, what: str) -> np.ndarray:
  """`array` as int32 [B ≥ 1, …] of rank `rank` with values in 0 … bound − 1; InputError."""
  array = as_array(array, name, f"it must be ints of shape [B ≥ 1, …] (rank {rank})")
  if array.ndim != rank or not array.size or not np.issubdtype(array.dtype, np.integer):
    raise InputError(f"{name} must be ints of shape [B ≥ 1, …] (rank {rank}), got "
                     f"{array.dtype} of shape {array.shape}")
  bad = np.argwhere((array < 0) | (array >= bound))
  if len(bad):
    raise InputError(f"{name}{list(map(int, bad[0]))} = {array[tuple(bad[0])]}: {what} of the "
                     f"run must be in 0 … {bound - 1}")
  return array.astype(np.int32)


@functools.partial(jax.jit, static_argnames=("model", "attention"))
def _recall(model: ByIdentity, params, inputs: Array, positions: Array, *, attention: bool):
  """(tokens [B, K], their probabilities [B, K], per-layer weights or None)."""
  model, variables = model.value, {"params": params}
  if attention:
    (logits, _), weights = apply_with_weights(model, variables, inputs,
                                              logit_positions=positions)
  else:
    (logits, _), weights = model.apply(variables, inputs, logit_positions=positions), None
  probabilities = jax.nn.softmax(logits)
  tokens = logits.argmax(-1)
  return (tokens.astype(jnp.int32),
          jnp.take_along_axis(probabilities, tokens[..., None], -1)[..., 0], weights)
