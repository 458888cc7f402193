"""listops: a restored run classifies ListOps expressions, with each layer's attention.

  run = training.restore("runs/listops_cpu/model.attention=full")   # one point of the sweep
  result = predict.classify(run, ["( ( ( [MAX 2 ) 9 ) ] )", "[SM 4 [MIN 7 3 ] 8 ]"])
  result.labels                # [2]: each expression's predicted value, 0–9
  result.attention[0][1]       # layer 0, the second expression: [heads, P, P]
"""

import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from research.data import listops
from research.errors import InputError, excerpt
from research.experiments.classification import BUCKET_MULTIPLE
from research.predict.runs import (
  ByIdentity,
  apply_with_weights,
  check_bool,
  check_experiment,
  check_result,
  in_batches,
  listed,
  nbytes,
  rows_per_call,
)

Array = jax.Array
# What LRA's ListOps text is made of; LRA's tokenizer (brackets=False) drops anything else.
FOREIGN_CHARACTER = re.compile(r"[^A-Za-z0-9()\[\]\s]")


class Encoded(NamedTuple):
  """Expressions as the model reads them."""
  ids: np.ndarray              # [B, P] int32 token ids (0 pads), P the padded length
  lengths: np.ndarray          # [B] int32 tokens of each expression
  tokens: list[list[str]]      # each expression's tokens (listops.tokenize)


class Classifications(NamedTuple):
  """What a run answers for B expressions."""
  labels: np.ndarray           # [B] int32: the predicted value 0–9, argmax of the logits
  probabilities: np.ndarray    # [B, 10] float32: softmax of the logits
  tokens: list[list[str]]      # each expression's tokens, as the model read them
  attention: list[np.ndarray] | None  # per layer [B, H, S, S]: the softmax weights over the
                               # keys (0 on the padding), S = P + 1 with config.model.pooling
                               # "cls" (position 0 the CLS vector, token t at t + 1), else P;
                               # linformer [B, H, S, proj_len], memory_compressed
                               # [B, H, S, ⌈S / c⌉]. None where the blocks compute no weights
                               # (kinds lru / s5; linear, performer, reformer, sinkhorn, a
                               # synthesizer over more than 256 tokens) or attention=False
  lengths: np.ndarray          # [B] int32 tokens of each expression


def encode_expressions(run, expressions: Sequence[str]) -> Encoded:
  """The token ids of `expressions`, padded to P, for the run's model.

  An expression is read as the run's data pipeline reads a TSV source
  (research/experiments/listops.py: `listops.tokenize` with config.data.brackets, the ids of
  `token_ids`): LRA's text with its parentheses ("( ( ( [MAX 2 ) 9 ) ] )") or the bracketed
  tree alone ("[MAX 2 9 ]"); LRA's tokens (brackets=False) also read "MAX 2 9". The
  expressions are padded to the longest of them rounded up to a multiple of 64 (at most
  config.data.max_length), as the experiment's length buckets are.

  Refused, before anything compiles (research.errors.InputError, one line naming the
  expression by its index): no expressions, a string given instead of a list of them, or
  what is not iterable (any iterable is read once, into a list); an expression without a
  token; a character outside ListOps' text (letters, digits, spaces, "(", ")", "[", "]":
  LRA's tokenizer would drop it unread); a token outside the run's vocabulary (named, with
  its position); more tokens than config.data.max_length.
  """
  check_experiment(run, "listops", "encode_expressions")
  expressions = listed(expressions, "expressions", "ListOps expressions", "expression")
  if not expressions:
    raise InputError("no expressions to classify: give a list of ListOps expressions")
  ids, brackets = run.extras["token_ids"], run.config.data.brackets
  max_length = run.config.data.max_length
  tokens = []
  for index, expression in enumerate(expressions):
    where = f"expressions[{index}]"
    if not isinstance(expression, str):
      raise InputError(f"{where} is a {type(expression).__name__}, not a string")
    foreign = FOREIGN_CHARACTER.search(expression)
    if foreign:
      raise InputError(f"{where} holds {foreign.group()!r} at character {foreign.start()}, "
                       "which ListOps' text has not (letters, digits, spaces, ( ) [ ])")
    words = listops.tokenize(expression, brackets)
    if not words:
      raise InputError(f"{where} has no ListOps token: {excerpt(expression)}")
    unknown = next((i for i, word in enumerate(words) if word not in ids), None)
    if unknown is not None:
      raise InputError(f"{where}: token {unknown} (from 0), {words[unknown]!r}, is not in the "
                       f"run's vocabulary (config.data.brackets={brackets}: {' '.join(ids)})")
    if len(words) > max_length:
      raise InputError(f"{where} has {len(words)} tokens, more than the run's model takes "
                       f"(config.data.max_length={max_length})")
    tokens.append(words)
  longest = max(map(len, tokens))
  padded = min(max_length, -(-longest // BUCKET_MULTIPLE) * BUCKET_MULTIPLE)
  array = np.zeros((len(tokens), padded), np.int32)
  for row, words in enumerate(tokens):
    array[row, :len(words)] = [ids[word] for word in words]
  return Encoded(array, np.array(list(map(len, tokens)), np.int32), tokens)


def classify(run, expressions: Sequence[str], *, attention: bool = True) -> Classifications:
  """The run's model on `expressions` (ListOps text, read as `encode_expressions` reads it):
  the predicted values, their probabilities and, with `attention`, each layer's attention
  weights (a second pass with implementation "dense" where the model's own implementation
  does not compute them).

  The expressions go through the model at most config.train.batch_size at a time (fewer
  where their outputs would pass research.predict.runs.CALL_BYTES a call), the last batch
  padded with copies of its last expression: one compiled function per padded length P and
  batch size, memory on the device that does not grow with their number, the answers
  gathered on the host. The attention weights (attention=True, the default) grow with
  B · H · S² a layer: beyond research.predict.runs.RESULT_BYTES (2 GiB) in all they are
  refused up front, naming attention=True; attention=False classifies any number of
  expressions. InputError for what `encode_expressions` refuses, and for attention not a bool.
  """
  check_experiment(run, "listops", "classify")
  attention = check_bool(attention, "attention")
  encoded = encode_expressions(run, expressions)
  model, arrays = ByIdentity(run.model), (encoded.ids, encoded.lengths)
  call = lambda ids, lengths: _classify(model, run.params, ids, lengths, attention=attention)
  one = jax.eval_shape(call, *(array[:1] for array in arrays))
  check_result(len(encoded.ids), nbytes(one[2]), "attention=True",
               f"the attention weights of {len(one[2] or ())} layers (padded length "
               f"{encoded.ids.shape[1]})", "pass attention=False, or fewer expressions at once")
  labels, probabilities, weights = in_batches(
      call, arrays, rows_per_call(nbytes(one), run.config.train.batch_size))
  return Classifications(labels, probabilities, encoded.tokens,
                         None if weights is None else list(weights), encoded.lengths)


@functools.partial(jax.jit, static_argnames=("model", "attention"))
def _classify(model: ByIdentity, params, ids: Array, lengths: Array, *, attention: bool):
  """(labels [B], probabilities [B, 10], per-layer weights or None) of model.value."""
  model = model.value
  variables = {"params": params}
  if not attention:
    logits, weights = model.apply(variables, ids, lengths), None
  else:
    logits, weights = apply_with_weights(model, variables, ids, lengths)
  return logits.argmax(-1).astype(np.int32), jax.nn.softmax(logits), weights

