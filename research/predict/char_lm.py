"""char_lm: a restored run continues a prompt and scores a text in bits per byte.

  run = training.restore("runs/char_lm")
  predict.sample(run, "def ", length=200, temperature=0.8, num_samples=2)  # [b"...", b"..."]
  predict.bits_per_byte(run, open("mine.py", "rb").read())                 # e.g. 1.74
  predict.byte_bits(run, "import os\\n")      # [10] float64: −log2 p of each byte
"""

import functools
import math
import numbers

import jax
import numpy as np
import optax

from research.data.python_corpus import FILE_START
from research.errors import InputError, excerpt
from research.experiments.char_lm import window_losses
from research.models import language_model
from research.models.kinds import BLOCK_KINDS
from research.predict import runs
from research.predict.runs import ByIdentity, check_experiment, check_int, in_batches, rows_per_call

Array = jax.Array
SAMPLED_BYTES = 1 << 24  # num_samples × length: the bytes one call of sample draws at most
SEEDS = 1 << 32          # seeds 0 … 2**32 − 1: jax.random.key keeps 32 bits (x64 off)
LOGIT_BYTES = 256 * 4    # one position's logits: 256 float32


def sample(run, prompt: str | bytes, *, length: int, temperature: float = 1.0, top_k: int = 0,
           seed: int = 0, num_samples: int = 1) -> list[bytes]:
  """num_samples continuations of `prompt`, each `length` bytes (the prompt not included).

  The prompt is read as the experiment reads a file of its corpus (research/experiments/
  char_lm.py): its bytes (a str as UTF-8) after the byte FILE_START (0), from the model's zero
  state or with nothing before; an empty prompt asks for the start of a file. Sampling is
  language_model.sample, jit-compiled once per run, prompt length and setting: each byte drawn
  from softmax(logits / temperature) over the top_k most likely bytes (top_k = 0: all 256;
  temperature = 0: the most likely byte), from jax.random.key(seed). The blocks (kinds
  transformer, lru, s5) read the last config.data.context bytes before each draw, as they were
  trained, so of a longer prompt they are handed its last context bytes alone (the same
  samples; one compiled function for every longer prompt). A recurrent model reads the whole
  prompt in its first step.

  What one call holds is bounded, and refused beyond its bound (the range in the message):
  num_samples × length ≤ SAMPLED_BYTES = 2^24 drawn bytes (their ids, the random keys and the
  blocks' buffer of prompt and drawn bytes grow with it), and the logits of a step,
  num_samples × W × 256 float32 (W: the context for the blocks, the prompt's bytes + 1 for a
  recurrent model's first step), within research.predict.runs.CALL_BYTES (256 MiB). Seeds are
  0 … 2^32 − 1: jax.random.key keeps 32 bits of a seed (without x64), so 2^32 would draw what
  0 draws.

  Refused, before anything compiles (research.errors.InputError, one line naming the
  argument): a prompt that is not a str or bytes, or a str that UTF-8 cannot encode (a lone
  surrogate); a prompt too long for a recurrent model to read at once; num_samples or length
  not an int within the bounds above (a bool is not an int); temperature < 0 or not finite;
  top_k outside 0 … 256; a seed not an int in 0 … 2^32 − 1.
  """
  check_experiment(run, "char_lm", "sample")
  tokens = _tokens(_bytes(prompt, "prompt"))
  context = run.config.data.context
  if run.model.kind in BLOCK_KINDS:
    tokens = tokens[-context:]            # the blocks read no byte before the last context
  num_samples, length = _sample_sizes(run.model.kind, len(tokens), context, num_samples,
                                      length)
  if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
      or not math.isfinite(temperature) or temperature < 0):
    raise InputError(f"temperature={temperature!r} must be a number >= 0 (0: the most likely "
                     "byte)")
  top_k = check_int(top_k, "top_k", 0, language_model.VOCAB_SIZE, "0: every byte")
  seed = check_int(seed, "seed", 0, SEEDS - 1, "jax.random.key keeps 32 bits of a seed: "
                   f"{SEEDS} would repeat 0")
  drawn = _sample(ByIdentity(run.model), run.params, np.tile(tokens, (num_samples, 1)),
                  jax.random.key(seed), length=length, temperature=float(temperature),
                  top_k=top_k, context=context)
  return [bytes(row) for row in np.asarray(drawn, np.uint8)]


def _sample_sizes(kind: str, prompt_tokens: int, context: int, num_samples, length
                  ) -> tuple[int, int]:
  """(num_samples, length) as ints within what one call of the sampler holds: the logits
  of a step (num_samples × W positions × 256 float32, W = the context for the blocks, the
  prompt's tokens for a recurrent model's first step) within runs.CALL_BYTES, and
  num_samples × length drawn bytes within SAMPLED_BYTES. InputError naming the prompt,
  num_samples or length, with its range, otherwise."""
  width = context if kind in BLOCK_KINDS else prompt_tokens
  most = runs.CALL_BYTES // (width * LOGIT_BYTES)
  if kind not in BLOCK_KINDS and most < 1:
    raise InputError(f"prompt of {prompt_tokens - 1} bytes is longer than a {kind} model reads "
                     f"at once: at most {runs.CALL_BYTES // LOGIT_BYTES - 1} bytes (its logits, "
                     "(bytes + 1) × 256 float32, within research.predict.runs.CALL_BYTES = "
                     f"{runs.CALL_BYTES:,})")
  num_samples = check_int(num_samples, "num_samples", 1, max(most, 1),
                          f"a step's logits, num_samples × {width} positions × 256 float32, "
                          f"within research.predict.runs.CALL_BYTES = {runs.CALL_BYTES:,}")
  length = check_int(length, "length", 1, SAMPLED_BYTES // num_samples,
                     f"num_samples × length ≤ SAMPLED_BYTES = {SAMPLED_BYTES:,} bytes drawn at "
                     f"once, num_samples={num_samples}")
  return num_samples, length


def byte_bits(run, text: str | bytes) -> np.ndarray:
  """−log2 p of each byte of `text` [N] float64: the experiment's test/bits_per_byte on one
  file, −Σ log2 p(byte | FILE_START and the bytes before it) / bytes, byte by byte.

  The text is read as the experiment reads a file of its corpus: its bytes (a str as UTF-8)
  after the byte FILE_START (0), from the model's zero state or with nothing before. A
  recurrent model reads it in chunks of config.data.test_chunk bytes carrying its state; the
  blocks read windows of config.data.context bytes advancing by config.data.test_stride (0:
  half the context), each byte scored in the last window that holds it (the first window
  scores all of its bytes), so every byte sees at least context − stride bytes before it, or
  all of them near the start. The windows are cut from the text batch by batch (at most
  config.train.batch_size a call, research/predict/runs.py), so a text of 10^7 bytes is scored
  in memory that grows with the text alone.

  Refused, before anything compiles (research.errors.InputError, one line naming the
  argument): a text that is not a str or bytes, or a str that UTF-8 cannot encode (a lone
  surrogate); an empty text.
  """
  check_experiment(run, "char_lm", "byte_bits")
  data = _bytes(text, "text")
  if not data:
    raise InputError("text is empty: give at least one byte to score")
  model, d = ByIdentity(run.model), run.config.data
  tokens = _tokens(data)                                        # [N + 1]: FILE_START, text
  if run.model.kind in BLOCK_KINDS:
    nats = _windows_nats(model, run.params, tokens, d.context,
                         d.test_stride or max(d.context // 2, 1), run.config.train.batch_size)
  else:
    nats = _carried_nats(model, run.params, tokens, d.test_chunk)
  return np.asarray(nats, np.float64) / math.log(2)


def bits_per_byte(run, text: str | bytes) -> float:
  """The mean of byte_bits(run, text): the experiment's test/bits_per_byte on `text` alone.
  InputError for what byte_bits refuses."""
  check_experiment(run, "char_lm", "bits_per_byte")
  return float(byte_bits(run, text).mean())


def _bytes(value: str | bytes, name: str) -> bytes:
  """A prompt's or text's bytes (a str encoded as UTF-8); InputError naming `name`."""
  if isinstance(value, bytes):
    return value
  if not isinstance(value, str):
    raise InputError(f"{name} must be a str or bytes, got a {type(value).__name__}")
  try:
    return value.encode("utf-8")
  except UnicodeEncodeError as error:
    raise InputError(f"{name} {excerpt(value)} cannot be encoded as UTF-8 ({error.reason}: "
                     f"{value[error.start:error.end]!r} at character {error.start})") from None


def _tokens(data: bytes) -> np.ndarray:
  """FILE_START then the bytes of data: [len(data) + 1] int32."""
  return np.frombuffer(bytes([FILE_START]) + data, np.uint8).astype(np.int32)


def _carried_nats(model: ByIdentity, params, tokens: np.ndarray, chunk: int) -> np.ndarray:
  """−ln p of each next token of tokens [N + 1]: [N], read in chunks of `chunk` tokens with
  the recurrent state carried from chunk to chunk."""
  count = len(tokens) - 1
  padded = -(-count // chunk) * chunk
  tokens = np.pad(tokens, (0, padded + 1 - len(tokens)))[None]              # [1, padded + 1]
  carry, nats = model.value.initial_carry(1), []
  for start in range(0, padded, chunk):
    carry, losses = _chunk_nats(model, params, carry, tokens[:, start:start + chunk],
                                tokens[:, start + 1:start + chunk + 1])
    nats.append(losses[0])
  return np.concatenate(jax.device_get(nats))[:count]


@functools.partial(jax.jit, static_argnames="model")
def _chunk_nats(model: ByIdentity, params, carry, inputs: Array, targets: Array):
  """(the carry after inputs [1, C], −ln p of each target [1, C])."""
  logits, carry = model.value.apply({"params": params}, inputs, carry)
  return carry, optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def _windows_nats(model: ByIdentity, params, tokens: np.ndarray, context: int, stride: int,
                  batch_size: int) -> np.ndarray:
  """−ln p of each next token of tokens [N + 1]: [N], from windows of `context` inputs
  starting every `stride` tokens, runs.rows_per_call windows per call (at most batch_size),
  each cut from the tokens as its batch is called. Position p is scored by window 0 when
  p < context, else by window k = ⌈(p − context + 1) / stride⌉, the last that holds it."""
  count = len(tokens) - 1
  windows = 1 + -(-max(count - context, 0) // stride)
  starts = np.arange(windows) * stride
  tokens = np.pad(tokens, (0, starts[-1] + context + 1 - len(tokens)))
  offsets = np.arange(context + 1)
  nats = in_batches(lambda first: _window_nats(model, params, tokens[first[:, None] + offsets]),
                    (starts,), rows_per_call(context * LOGIT_BYTES, batch_size),
                    whole=True)                                            # [windows, context]
  positions = np.arange(count)
  window = np.where(positions < context, 0, -(-(positions - context + 1) // stride))
  return nats[window, positions - starts[window]]


@functools.partial(jax.jit, static_argnames="model")
def _window_nats(model: ByIdentity, params, windows: Array) -> Array:
  """−ln p of each next token of windows [B, L + 1]: [B, L]."""
  return window_losses(model.value, params, windows)


@functools.partial(jax.jit, static_argnames=("model", "length", "temperature", "top_k",
                                             "context"))
def _sample(model: ByIdentity, params, prompts: Array, rng: Array, *, length: int,
            temperature: float, top_k: int, context: int) -> Array:
  """language_model.sample of model.value: prompts [B, P] -> bytes [B, length]."""
  return language_model.sample(model.value, params, prompts, rng, length=length,
                               temperature=temperature, top_k=top_k, context=context)
