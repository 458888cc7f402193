"""lra: a restored run classifies new input of its task (Text reviews, Retrieval pairs,
Image pictures, Pathfinder images), read as the experiment's readers read their files, with
each layer's attention; `classify_lra(training.restore(workdir), inputs)` (docs/trained_runs.md
has an example; ListOps, LRA's fifth task: predict/listops.py).
"""

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from research.data import aan, byte_text, cifar10
from research.errors import InputError, excerpt
from research.experiments.classification import BUCKET_MULTIPLE
from research.experiments.lra import BYTE_TASKS, TASKS, max_length
from research.predict.runs import (
  ByIdentity,
  apply_with_weights,
  as_array,
  check_bool,
  check_experiment,
  check_result,
  in_batches,
  listed,
  nbytes,
  rows_per_call,
)

Array = jax.Array
# Each task's classes in the order of its labels (research/data/: imdb, aan, cifar10, pathfinder).
CLASSES = {
    "text": ("negative", "positive"),
    "retrieval": ("not linked", "linked"),
    "image": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
              "truck"),
    "pathfinder": ("apart", "connected"),
}
GREY_LEVELS = 256


class LRAInputs(NamedTuple):
  """Inputs as the model reads them."""
  tokens: np.ndarray           # int32 [B, L] ([B, 2, L]: Retrieval's pairs), 0 pads the bytes
  lengths: np.ndarray          # int32 [B] ([B, 2]): the tokens read, at most the run's length


class LRAClassifications(NamedTuple):
  """What a run answers for B inputs."""
  labels: np.ndarray           # [B] int32: the predicted class, argmax of the logits
  classes: list[str]           # the predicted classes' names (CLASSES)
  probabilities: np.ndarray    # [B, C] float32: softmax of the logits, C = len(CLASSES[task])
  lengths: np.ndarray          # [B] int32 ([B, 2]): the tokens the model read of each input
  attention: list[np.ndarray] | None  # per layer [B, H, S, S] (Retrieval: [B, 2, H, S, S],
                               # each document's): the softmax weights over the keys (0 on
                               # the padding), S = L + 1 with config.model.pooling "cls"
                               # (position 0 the CLS vector, token t at t + 1), else L;
                               # linformer [.., S, proj_len], memory_compressed
                               # [.., S, ⌈S / c⌉]. None where the blocks compute no weights
                               # (kinds lru / s5; linear, performer, reformer, sinkhorn, a
                               # synthesizer over more than 256 tokens) or attention=False


def expected_inputs(config) -> str:
  """What a run of `config` takes, in words."""
  task, length = config.data.task, max_length(config)
  if task == "text":
    takes = ("a list of reviews (str, or UTF-8 bytes), whitespace stripped at both ends, "
             f"their first {length} bytes read")
  elif task == "retrieval":
    takes = ("a list of pairs (document, document) of papers' texts (str, or a field of LRA's "
             f"TSV as bytes), the first {length} bytes of each read")
  else:
    side = cifar10.SIDE if task == "image" else config.data.resolution
    takes = (f"ints 0–255 [B, {side}, {side}, 3] (RGB pictures, turned grey as LRA does) or "
             f"[B, {side}, {side}] (grey levels)" if task == "image"
             else f"ints 0–255 [B, {side}, {side}] (grey Pathfinder images)")
  return f"the {task} task's run takes {takes}"


def encode_lra_inputs(run, inputs) -> LRAInputs:
  """The tokens and lengths of `inputs` for the run's model (config.data.task's):

    text        reviews, str or bytes: UTF-8 bytes stripped of whitespace at both ends (as
                research/data/imdb.py reads a review's file), ids byte + 1, the first
                data.max_length kept (the rest cut, as the pipeline cuts)
    retrieval   pairs (document, document): a str is a paper's text, written as LRA's TSV
                writes texts (a Python bytes literal, str(text.encode()): "b'…'"); bytes are
                a TSV field as it stands (research/data/aan.py); ids byte + 1, the first
                data.max_length of each document kept
    image       [B, 32, 32, 3] RGB, turned grey as LRA does (cifar10.grey_levels), or
                [B, 32, 32] grey levels; 1024 tokens a picture, row by row
    pathfinder  [B, R, R] grey levels, R = data.resolution; R² tokens an image, row by row

  The byte tasks' tokens are padded to the longest input rounded up to a multiple of 64 (at
  most data.max_length), as the experiment's length buckets are. Refused before anything
  compiles (research.errors.InputError, one line naming the input by its index): nothing
  given, a str given instead of a list of them, what is not iterable; a text that is not a
  str or bytes, is not UTF-8, or is empty; a pair that is not two documents; an array of
  another shape or dtype than the task's, or a value outside 0–255 (its place named).
  """
  check_experiment(run, "lra", "encode_lra_inputs")
  config = run.config
  if config.data.task in BYTE_TASKS:
    return _encode_documents(config, inputs)
  return _encode_pixels(config, inputs)


def classify_lra(run, inputs, *, attention: bool = True) -> LRAClassifications:
  """The run's model on `inputs` (its task's, read as `encode_lra_inputs` reads them): the
  predicted classes, their probabilities and, with `attention`, each layer's attention
  weights (a second pass with implementation "dense" where the model's own implementation
  does not compute them).

  The inputs go through the model at most config.train.batch_size at a time (fewer where
  their outputs would pass research.predict.runs.CALL_BYTES a call), the last batch padded
  with copies of its last input: one compiled function per padded length and batch size,
  memory on the device that does not grow with B, the answers gathered on the host. The
  attention weights grow with B · H · S² a layer (S = 1 025 for a CIFAR-10 picture): beyond
  research.predict.runs.RESULT_BYTES (2 GiB) in all they are refused up front, naming
  attention=True; attention=False classifies any number of inputs. InputError for what
  `encode_lra_inputs` refuses, and for attention not a bool.
  """
  check_experiment(run, "lra", "classify_lra")
  attention = check_bool(attention, "attention")
  encoded = encode_lra_inputs(run, inputs)
  model, arrays = ByIdentity(run.model), (encoded.tokens, encoded.lengths)
  call = lambda tokens, lengths: _classify(model, run.params, tokens, lengths,
                                           attention=attention)
  one = jax.eval_shape(call, *(array[:1] for array in arrays))
  layers = len(one[2] or ())
  check_result(len(encoded.tokens), nbytes(one[2]), "attention=True",
               f"the attention weights of {layers} layer{'s' * (layers != 1)} (inputs of "
               f"{encoded.tokens.shape[-1]} tokens)", "pass attention=False, or fewer inputs "
               "at once")
  labels, probabilities, weights = in_batches(
      call, arrays, rows_per_call(nbytes(one), run.config.train.batch_size))
  names = CLASSES[run.config.data.task]
  return LRAClassifications(labels, [names[label] for label in labels], probabilities,
                            encoded.lengths, None if weights is None else list(weights))


@functools.partial(jax.jit, static_argnames=("model", "attention"))
def _classify(model: ByIdentity, params, tokens: Array, lengths: Array, *, attention: bool):
  """(labels [B], probabilities [B, C], per-layer weights or None) of model.value; a pair's
  weights [2B, …] (both documents through one stack) as [B, 2, …]."""
  model = model.value
  variables = {"params": params}
  if not attention:
    logits, weights = model.apply(variables, tokens, lengths), None
  else:
    logits, weights = apply_with_weights(model, variables, tokens, lengths)
  if weights is not None and tokens.ndim == 3:
    weights = tuple(w.reshape(tokens.shape[0], 2, *w.shape[1:]) for w in weights)
  return logits.argmax(-1).astype(np.int32), jax.nn.softmax(logits), weights


# ---- The byte tasks: reviews and pairs of papers ---------------------------------------

def _encode_documents(config, inputs) -> LRAInputs:
  """Text's reviews [B] or Retrieval's pairs [B, 2] as byte ids, padded as a length bucket."""
  pairs = TASKS[config.data.task].pairs
  noun, item = ("pairs of documents", "(document, document)") if pairs else ("reviews",
                                                                             "review")
  inputs = listed(inputs, "inputs", noun, item)
  if not inputs:
    raise InputError(f"no inputs to classify: give a list of {noun} ({expected_inputs(config)})")
  longest = max_length(config)
  documents = [_pair(given, f"inputs[{index}]") if pairs
               else [_review(given, f"inputs[{index}]")]
               for index, given in enumerate(inputs)]
  kept = min(longest, aan.LRA_TEXT_CUT) if pairs else longest     # bytes read of a document
  most = max(min(len(text), kept) for texts in documents for text in texts)
  width = min(longest, -(-most // BUCKET_MULTIPLE) * BUCKET_MULTIPLE)
  tokens = np.zeros((len(documents), len(documents[0]), width), np.int32)
  lengths = np.zeros(tokens.shape[:2], np.int32)
  for row, texts in enumerate(documents):
    for column, text in enumerate(texts):
      lengths[row, column] = byte_text.encode_into(tokens[row, column, :kept], text)
  return LRAInputs(tokens, lengths) if pairs else LRAInputs(tokens[:, 0], lengths[:, 0])


def _review(review, where: str) -> bytes:
  """A review's bytes as research/data/imdb.py reads a review's file: whitespace stripped."""
  data = _utf8(review, where).strip()
  if not data:
    raise InputError(f"{where} is empty or whitespace alone: {_shown(review)}")
  return data


def _pair(pair, where: str) -> tuple[bytes, bytes]:
  """A pair's two documents as LRA's TSV fields: a str written as a bytes literal."""
  sized = isinstance(pair, Sequence) or (isinstance(pair, np.ndarray) and pair.ndim == 1)
  if isinstance(pair, str | bytes) or not sized or len(pair) != 2:
    what = (f"one {type(pair).__name__} {_shown(pair)}" if isinstance(pair, str | bytes)
            else f"a {type(pair).__name__}" + (f" of {len(pair)}" if sized else ""))
    raise InputError(f"{where} must be a pair (document, document), got {what}")
  fields = []
  for column, document in enumerate(pair):
    here = f"{where}[{column}]"
    field = _utf8(document, here)
    if not field:
      raise InputError(f"{here} is empty: give the paper's text")
    fields.append(str(field).encode("ascii") if isinstance(document, str) else field)
  return tuple(fields)


def _utf8(document, where: str) -> bytes:
  """A str's UTF-8 bytes, or bytes that are UTF-8 text (as the data sets' files are)."""
  if isinstance(document, str):
    try:
      return document.encode("utf-8")
    except UnicodeEncodeError as error:      # a lone surrogate
      raise InputError(f"{where} holds {document[error.start]!r} at character {error.start}, "
                       "which UTF-8 cannot encode") from None
  if not isinstance(document, bytes):
    raise InputError(f"{where} is a {type(document).__name__}, not a str or bytes")
  try:
    document.decode("utf-8")
  except UnicodeDecodeError as error:
    raise InputError(f"{where} is not UTF-8 text ({error.reason} at byte {error.start})"
                     ) from None
  return document


def _shown(text: str | bytes) -> str:
  return excerpt(text) if isinstance(text, str) else repr(text[:60])


# ---- The pixel tasks: CIFAR-10 pictures and Pathfinder images ----------------------------

def _encode_pixels(config, inputs) -> LRAInputs:
  """Image's pictures or Pathfinder's images as their grey levels, row by row [B, R²]."""
  takes = expected_inputs(config)
  images = as_array(inputs, "inputs", takes)
  side = cifar10.SIDE if config.data.task == "image" else config.data.resolution
  rgb = config.data.task == "image" and images.ndim == 4
  if not (images.ndim >= 1 and images.shape[0] >= 1
          and images.shape[1:] == ((side, side, 3) if rgb else (side, side))):
    raise InputError(f"inputs of shape {list(images.shape)}: {takes}")
  if not np.issubdtype(images.dtype, np.integer):
    raise InputError(f"inputs of dtype {images.dtype}: {takes}")
  outside = np.argwhere((images < 0) | (images >= GREY_LEVELS))
  if len(outside):
    place = tuple(outside[0])
    raise InputError(f"inputs[{', '.join(map(str, place))}] is {images[place]}: {takes}")
  pixels = images.astype(np.uint8)
  if rgb:      # [B, 32, 32, 3] -> the pickles' channel-planar rows [B, 3 · 1024]
    pixels = cifar10.grey_levels(pixels.transpose(0, 3, 1, 2).reshape(len(pixels), -1))
  tokens = pixels.reshape(len(pixels), -1).astype(np.int32)
  return LRAInputs(tokens, np.full(len(tokens), tokens.shape[1], np.int32))
