"""nmt_dates: a restored run translates texts of its own, with the attention of each output.

  run = training.restore("runs/nmt_dates")
  result = predict.translate(run, ["14 janvier 2024", "2024年1月14日"], beam_size=5)
  result.outputs               # ["2024-01-14", "2024-01-14"]
  result.attention[0]          # [len(output_tokens[0]), len(source_tokens[0])]
"""

import functools
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.data.text import BOS, EOS, detokenize, tokenize
from research.errors import InputError, excerpt
from research.models.decoding import beam_search, greedy_decode
from research.predict import runs
from research.predict.runs import (
  check_bool,
  check_experiment,
  check_int,
  check_result,
  in_batches,
  listed,
  row_bytes,
  rows_per_call,
)

Array = jax.Array
MAX_LENGTH_PENALTY = 10      # as config.decode.length_penalty: a larger α overflows lp(Y)


class Translations(NamedTuple):
  """What a run answers for N texts (lists of N, in the texts' order)."""
  texts: list[str]                  # the texts given
  outputs: list[str]                # each translation: its tokens before EOS, detokenized
  source_tokens: list[list[str]]    # each text's tokens as the model read them (length S_n)
  output_tokens: list[list[str]]    # each decoded token, its EOS ("<eos>") included when one
                                    # was decoded within the T + 1 steps (length T_n)
  attention: list[np.ndarray] | None  # [T_n, S_n] float32 each: row t the weights over the
                                    # source when output token t was decoded (each row sums
                                    # to 1; 0 everywhere with model.attention="none"); None
                                    # with translate(..., attention=False)
  scores: np.ndarray | None         # beam search: [N] float32 log P(Y | X) / lp(Y) of each
                                    # output; None for greedy decoding


def encode_texts(run, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
  """The source ids [N, S] int32 (0 pads), lengths [N] int32 and tokens of `texts` for the
  run's model.

  A text is read as the run's data pipeline reads a source (research/experiments/
  nmt_dates.py): `tokenize(text, level)` (characters, or a corpus's words with
  config.data.level="word"), the ids of the run's source vocabulary, padded with 0 to the
  longest source of the run's data S = extras["max_source_length"], as its evaluation
  batches are. Refused (research.errors.InputError, one line naming the text by its index):
  no texts, one string given instead of a list of them, or what is not iterable; a text that
  is not a str or has no token; characters (words) outside the run's source vocabulary,
  named; a text of more than S tokens.
  """
  check_experiment(run, "nmt_dates", "encode_texts")
  texts = listed(texts, "texts", "texts", "text")
  if not texts:
    raise InputError("no texts to translate: give a list of at least one text")
  vocab, level = run.extras["source_vocab"], run.extras["level"]
  longest = run.extras["max_source_length"]
  unit = "characters" if level == "char" else "words"
  tokens = []
  for index, text in enumerate(texts):
    where = f"texts[{index}]"
    if not isinstance(text, str):
      raise InputError(f"{where} is a {type(text).__name__}, not a str")
    words = tokenize(text, level)
    if not words:
      raise InputError(f"{where} has no {unit[:-1]} to translate: {excerpt(text)}")
    unknown = sorted({word for word in words if word not in vocab.ids})
    if unknown:
      known = vocab.tokens[4:]
      shown = repr("".join(known)) if level == "char" else "run.extras['source_vocab'].tokens"
      raise InputError(f"{where} {excerpt(text)} has {unit} outside the run's source "
                       f"vocabulary: {', '.join(map(repr, unknown))}; it knows {len(known)} "
                       f"{unit}: {shown}")
    if len(words) > longest:
      raise InputError(f"{where} {excerpt(text)} is {len(words)} {unit} long; the run's model "
                       f"takes at most {longest} (the longest source of its data)")
    tokens.append(words)
  ids = np.zeros((len(tokens), longest), np.int32)
  for row, words in enumerate(tokens):
    ids[row, :len(words)] = vocab.encode(words)
  return ids, np.array(list(map(len, tokens)), np.int32), tokens


def translate(run, texts: Sequence[str], *, beam_size: int = 1, length_penalty: float = 0.6,
              attention: bool = True) -> Translations:
  """The run's translations of `texts` (read as `encode_texts` reads them), with their
  attention.

  beam_size: 1 decodes greedily (the most likely token at each step), K > 1 keeps K
  hypotheses per text ranked by log P(Y | X) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^α with
  α = length_penalty (0: by log P alone; it plays no part in greedy decoding); K is at most
  the target vocabulary's size (max_beam_size). attention=False leaves the weights out
  (Translations.attention None).

  The texts are decoded (research/models/decoding.py) for T + 1 steps, T =
  extras["max_target_length"] (the longest target and its EOS), at most
  config.train.batch_size at a time (fewer where a batch's beams and outputs would pass
  research.predict.runs.CALL_BYTES), the last batch padded with copies of its last text: one
  compiled function per batch size and beam size, memory on the device that does not grow
  with the number of texts, the answers gathered on the host. Any iterable of texts (a
  generator too) is read once, into the list Translations.texts.

  Greedy decoding returns its own attention weights. Beam search returns none: the weights
  of the hypothesis it chose are those of the model's teacher-forced pass (its __call__) over
  BOS + the hypothesis' tokens, the pass training takes; for the greedy hypothesis this pass
  gives greedy decoding's weights (tests/predict/test_nmt_dates.py). The attention weights
  (attention=True, the default), [T + 1, S] float32 a text, are refused up front beyond
  research.predict.runs.RESULT_BYTES (2 GiB) in all, naming attention=True; attention=False
  translates any number of texts.

  Refused, before anything compiles (research.errors.InputError, one line): what
  `encode_texts` refuses; beam_size not an int in 1 … the target vocabulary's size
  (max_beam_size: a beam that wide keeps every continuation of the first step);
  length_penalty outside [0, 10]; attention not a bool; attention weights beyond the bound
  above.
  """
  check_experiment(run, "nmt_dates", "translate")
  beam_size = check_int(beam_size, "beam_size", 1, max_beam_size(run),
                        "1: greedy decoding; at most the target vocabulary's size")
  if (not isinstance(length_penalty, numbers.Real) or isinstance(length_penalty, bool)
      or not 0 <= length_penalty <= MAX_LENGTH_PENALTY):
    raise InputError(f"length_penalty={length_penalty!r} must be a number in [0, "
                     f"{MAX_LENGTH_PENALTY}] (GNMT's α is 0.6–1; 0: rank by log P alone)")
  attention = check_bool(attention, "attention")
  texts = listed(texts, "texts", "texts", "text")            # read once: a generator too
  ids, lengths, source_tokens = encode_texts(run, texts)
  max_len = run.extras["max_target_length"] + 1      # the target and its EOS
  check_result(len(ids), max_len * ids.shape[1] * 4 if attention else 0, "attention=True",
               f"the attention weights [{max_len}, {ids.shape[1]}] a text", "pass "
               "attention=False, or fewer texts at once")
  call = functools.partial(_decode, run.model, run.params, beam_size=beam_size,
                           max_len=max_len, length_penalty=float(length_penalty))
  computed = row_bytes(functools.partial(call, attention=True), (ids, lengths)) + (
      beam_size * 4 * (len(run.extras["target_vocab"].tokens) + 6 * max_len))  # a step's beams
  tokens, scores, weights = in_batches(functools.partial(call, attention=attention),
                                       (ids, lengths),
                                       rows_per_call(computed, run.config.train.batch_size))
  target_vocab, level = run.extras["target_vocab"], run.extras["level"]
  outputs, output_tokens, rows = [], [], []
  for row, source in enumerate(source_tokens):
    decoded = tokens[row].tolist()
    count = decoded.index(EOS) + 1 if EOS in decoded else max_len
    outputs.append(detokenize(target_vocab.decode(decoded), level))
    output_tokens.append([target_vocab.tokens[i] for i in decoded[:count]])
    if attention:
      rows.append(weights[row, :count, :len(source)])
  return Translations(texts, outputs, source_tokens, output_tokens,
                      rows if attention else None, None if beam_size == 1 else scores)


def max_beam_size(run) -> int:
  """The widest beam translate takes for the run: its target vocabulary's size V (a beam of
  V already keeps every continuation of the first step), no wider than keeps one text's
  beam state (K × (V + 6 · steps) int32 / float32) within research.predict.runs.CALL_BYTES."""
  vocab = len(run.extras["target_vocab"].tokens)
  steps = run.extras["max_target_length"] + 1
  return max(1, min(vocab, runs.CALL_BYTES // (4 * (vocab + 6 * steps))))


def _decode(model, params, source: Array, source_lengths: Array, *, beam_size: int,
            max_len: int, length_penalty: float, attention: bool):
  """(tokens [B, max_len], scores [B] (zeros for greedy decoding), the attention weights
  [B, max_len, S] or, without `attention`, None) of greedy decoding (beam_size 1) or
  _beam_search."""
  if beam_size == 1:
    tokens, weights = greedy_decode(model, params, source, source_lengths, bos_id=BOS,
                                    eos_id=EOS, max_len=max_len)
    scores = jnp.zeros(tokens.shape[:1], jnp.float32)
  else:
    tokens, scores, weights = _beam_search(model, params, source, source_lengths,
                                           beam_size=beam_size, max_len=max_len,
                                           length_penalty=length_penalty)
  return tokens, scores, weights if attention else None


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "max_len"))
def _beam_search(model, params, source: Array, source_lengths: Array, *, beam_size: int,
                 max_len: int, length_penalty: float) -> tuple[Array, Array, Array]:
  """beam_search's tokens [B, max_len] and scores [B], and the teacher-forced attention
  weights [B, max_len, S] over BOS + its tokens (rows after the EOS row are not read)."""
  tokens, scores = beam_search(model, params, source, source_lengths, beam_size=beam_size,
                               bos_id=BOS, eos_id=EOS, max_len=max_len,
                               length_penalty=length_penalty)
  target_in = jnp.concatenate([jnp.full_like(tokens[:, :1], BOS), tokens[:, :-1]], axis=1)
  _, weights = model.apply({"params": params}, source, source_lengths, target_in)
  return tokens, scores, weights
