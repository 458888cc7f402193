"""The char_lm experiment: a byte-level language model of the Python standard library's source.

A LanguageModel (`make_model`) learns the next byte of windows of research/data/
python_corpus.py's training stream; the report scores every byte of the test files in bits per
byte beside zlib and xz on the same bytes (`test_metrics`), and draws samples.
"""

import json
import lzma
import math
import os
import sys
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.data import python_corpus
from research.data.stream import GeneratedStream, eval_batches
from research.errors import ConfigError, InputError
from research.experiments.stack_config import (
  check_stack_keys,
  check_stack_sizes,
  parameter_count,
  parameter_keys,
)
from research.models.kinds import BLOCK_KINDS, KINDS
from research.models.language_model import LanguageModel, sample
from research.training.config import (
  check_choice,
  check_host_memory,
  check_int,
  check_parameter_memory,
  check_positive,
)
from research.training.experiment import Inference, Model, Report, Workload, register

MANIFEST = "corpus_manifest.json"
SAMPLES = "samples.txt"
POSITIVE_INTS = ("model.embed_size", "data.context", "data.eval_windows", "data.test_lanes",
                 "data.test_chunk", "sample.num_samples", "sample.length")
NON_NEGATIVE_INTS = ("data.test_bytes", "data.test_stride", "sample.top_k")


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / model / sample value, naming the key."""
  d = config.data
  check_choice(config, "model.kind", KINDS)
  check_stack_keys(config, causal=True)
  check_choice(config, "data.include_tests", (True, False))
  check_positive(config, *POSITIVE_INTS)
  check_positive(config, *NON_NEGATIVE_INTS, "sample.temperature", allow_zero=True)
  check_int(config, *POSITIVE_INTS, *NON_NEGATIVE_INTS)
  if config.sample.top_k > 256:
    raise ConfigError(f"config.sample.top_k={config.sample.top_k} must be in 0 … 256 "
                      "(0: every byte)")
  if d.test_stride > d.context:
    raise ConfigError(f"config.data.test_stride={d.test_stride} must be <= config.data."
                      f"context={d.context} (0: half the context)")
  if d.stdlib and not os.path.isdir(d.stdlib):
    raise ConfigError(f"config.data.stdlib={d.stdlib!r} is not a directory; give a Python "
                      "library directory (a Lib), or '' for the running interpreter's")
  check_stack_sizes(config, d.context, f"config.data.context={d.context}")
  check_memory(config)


CORPUS_COPIES = 8        # host bytes per corpus byte: the files, the streams, the test lanes
# Host bytes per window byte: the int64 gather index, the uint8 gathered, the int32 window.
WINDOW_BYTES = 8 + 1 + 4


def check_memory(config) -> None:
  """The training batch and validation windows, the recurrent report's chunks (logits of
  test_lanes × test_chunk bytes) and the samples must fit the host's memory."""
  d, s, m = config.data, config.sample, config.model
  # the blocks (stack_config.parameter_count), or a GRU / LSTM layer's ≤ 4 h (h + e)
  if m.kind in BLOCK_KINDS:
    keys, count = parameter_keys(config, "data.context"), parameter_count(config, d.context)
  else:
    keys = ("model.num_layers", "model.hidden_size", "model.embed_size")
    count = m.num_layers * 4 * m.hidden_size * (m.hidden_size + m.embed_size)
  check_parameter_memory(config, keys, count + 256 * (m.embed_size + 2 * m.hidden_size))
  windows = config.train.batch_size + d.eval_windows
  check_host_memory(config, ("train.batch_size", "data.eval_windows", "data.context"),
                    windows * (d.context + 1) * WINDOW_BYTES,
                    f"{windows} windows of {d.context + 1} bytes")
  if config.model.kind not in BLOCK_KINDS:
    check_host_memory(config, ("data.test_lanes", "data.test_chunk"),
                      3 * d.test_lanes * d.test_chunk * 256 * 4,
                      "the logits of the test split's chunks")
  steps = len(s.prompt.encode("utf-8")) + 1 + s.length
  check_host_memory(config, ("sample.length", "sample.num_samples"),
                    steps * (32 + 8 * s.num_samples), "the samples (and a key per byte)")


def check_test_memory(config, test_bytes: int) -> None:
  """The transformer's report reads the test split (test_bytes) in windows of `context`
  bytes every `stride`: every window's tokens and weights must fit the host's memory."""
  d = config.data
  stride = d.test_stride or max(d.context // 2, 1)
  windows = d.test_lanes + test_bytes // stride
  check_host_memory(config, ("data.test_stride", "data.context"),
                    windows * (d.context + 1) * (WINDOW_BYTES + 1),
                    f"the {windows} windows that read the {test_bytes} bytes of the test split")


def load_corpus(config) -> python_corpus.Corpus:
  """The corpus of config.data; InputError if a split is empty or too short to train on.

  The library's .py files (config.data.stdlib, "" for the running interpreter's;
  config.data.include_tests), split 90 / 5 / 5 by a hash of each file's path; `build` prints
  the manifest and writes it as corpus_manifest.json.
  """
  d = config.data
  root = os.path.abspath(d.stdlib or python_corpus.stdlib_directory())
  paths = python_corpus.list_files(root, include_tests=d.include_tests)
  size = python_corpus.total_bytes(root, paths)      # the bytes, the streams, the lanes
  check_host_memory(config, ("data.stdlib",), CORPUS_COPIES * size,
                    f"the {len(paths)} .py files ({size} bytes) under {root}")
  corpus = python_corpus.load(root, include_tests=d.include_tests)
  sizes = {split: sum(map(len, data)) for split, data in corpus.contents.items()}
  if not all(corpus.files.values()) or sizes["train"] <= d.context + 1:
    counts = ", ".join(f"{split} {len(paths)} files ({sizes[split]} bytes)"
                       for split, paths in corpus.files.items())
    raise InputError(f"{corpus.root}: its .py files split into {counts}; every split needs a "
                     f"file and training more than config.data.context + 1 = {d.context + 1} "
                     "bytes")
  return corpus


def make_model(config) -> LanguageModel:
  """`LanguageModel(**config.model, max_length=config.data.context)`
  (research/models/language_model.py); its blocks' keys are the stack's
  (research/experiments/stack_config.py), the self-attention causal."""
  return LanguageModel(**config.model, max_length=config.data.context)


def window_losses(model: LanguageModel, params, tokens: jax.Array, rng: jax.Array | None = None
                  ) -> jax.Array:
  """Cross-entropy (nats) of each next byte of windows tokens [B, L + 1]: [B, L]; with an
  rng, in training mode (dropout drawn from it)."""
  logits, _ = model.apply({"params": params}, tokens[:, :-1], train=rng is not None,
                          rngs=None if rng is None else {"dropout": rng})
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])


# ---- Whole-file evaluation ------------------------------------------------------------

def lanes(texts: list[bytes], num_lanes: int) -> tuple[np.ndarray, np.ndarray]:
  """Lays whole texts end to end in num_lanes lanes, each text after a FILE_START byte.

  The longest texts are placed first, each into the lane with the fewest bytes so far, so
  the longest lane is about max(longest text, total / num_lanes); within a lane the texts
  keep their order. Lanes are padded with FILE_START to the longest.

  Returns tokens [num_lanes, T + 1] int32 and scored [num_lanes, T] bool: True where
  tokens[:, t + 1] is a byte of a text (not a FILE_START or padding). scored.sum() equals
  the texts' total length.
  """
  members, loads = [[] for _ in range(num_lanes)], np.zeros(num_lanes, np.int64)
  for i in sorted(range(len(texts)), key=lambda i: -len(texts[i])):
    lane = int(np.argmin(loads))
    members[lane].append(i)
    loads[lane] += len(texts[i]) + 1
  tokens = np.full((num_lanes, loads.max() + 1), python_corpus.FILE_START, np.int32)
  scored = np.zeros((num_lanes, loads.max()), bool)
  for lane, chosen in enumerate(members):
    position = 0
    for i in sorted(chosen):
      data = np.frombuffer(texts[i], np.uint8)
      tokens[lane, position + 1:position + 1 + len(data)] = data   # after its FILE_START
      scored[lane, position:position + len(data)] = True
      position += len(data) + 1
  return tokens, scored


def carried_state_nats(model: LanguageModel, params, tokens: np.ndarray, scored: np.ndarray,
                       chunk: int) -> float:
  """Σ −ln p over the scored bytes, a recurrent model reading each lane of tokens [N, T + 1]
  in chunks of `chunk` bytes with its state carried from chunk to chunk."""

  @jax.jit
  def step(params, carry, inputs, targets, weights):
    logits, carry = model.apply({"params": params}, inputs, carry)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return carry, jnp.where(weights, losses, 0.0)

  num_lanes, length = scored.shape
  padded = -(-length // chunk) * chunk
  tokens = np.pad(tokens, ((0, 0), (0, padded - length)))
  scored = np.pad(scored, ((0, 0), (0, padded - length)))
  carry, sums = model.initial_carry(num_lanes), []
  for start in range(0, padded, chunk):
    carry, losses = step(params, carry, tokens[:, start:start + chunk],
                       tokens[:, start + 1:start + chunk + 1], scored[:, start:start + chunk])
    sums.append(losses)
  return _total(sums)


def sliding_window_nats(model: LanguageModel, params, tokens: np.ndarray, scored: np.ndarray,
                        context: int, stride: int, batch_size: int) -> float:
  """Σ −ln p over the scored bytes, a model reading windows of `context` bytes of each lane
  of tokens [N, T + 1] that advance by `stride`: window k starts at k·stride and scores its
  last `stride` positions (window 0 all of them), so each position is scored exactly once."""

  @jax.jit
  def step(params, windows, weights):
    return jnp.where(weights, window_losses(model, params, windows), 0.0)

  num_lanes, length = scored.shape
  count = 1 + -(-max(length - context, 0) // stride)             # windows per lane
  padded = (count - 1) * stride + context
  tokens = np.pad(tokens, ((0, 0), (0, padded - length)))
  scored = np.pad(scored, ((0, 0), (0, padded - length)))
  starts = np.arange(count) * stride
  offsets = starts[:, None] + np.arange(context)                 # [count, context]
  window_part = np.ones((count, context), bool)
  window_part[1:, :context - stride] = False                     # scored by earlier windows
  windows = tokens[:, starts[:, None] + np.arange(context + 1)].reshape(-1, context + 1)
  weights = (scored[:, offsets] & window_part).reshape(-1, context)
  keep = weights.any(axis=1)                                     # skip all-padding windows
  windows, weights = windows[keep], weights[keep]
  rows = -(-len(windows) // batch_size) * batch_size
  windows = np.pad(windows, ((0, rows - len(windows)), (0, 0)))
  weights = np.pad(weights, ((0, rows - len(weights)), (0, 0)))
  sums = [step(params, windows[i:i + batch_size], weights[i:i + batch_size])
          for i in range(0, rows, batch_size)]
  return _total(sums)


def _total(losses: list[jax.Array]) -> float:
  """Σ of per-byte losses, summed in float64 on the host."""
  return float(sum(np.asarray(x, np.float64).sum() for x in jax.device_get(losses)))


def compressed_bits_per_byte(data: bytes) -> dict[str, float]:
  """zlib -9 and xz -9e (Python's zlib and lzma) of data: bits per byte of data."""
  return {"zlib": 8 * len(zlib.compress(data, 9)) / len(data),
          "xz": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)}


def test_metrics(config, model: LanguageModel, params, texts: list[bytes]) -> dict[str, float]:
  """test/* on texts: the test split, its first config.data.test_bytes bytes with
  test_bytes > 0, else all of it (files ordered by hash, so a cut keeps a random sample of
  whole files).

    test/bits_per_byte       −Σ log2 p(byte | what came before) / bytes, every byte of every
                             file scored once, files read whole from their first byte. The
                             files are laid end to end, each after a byte 0, in
                             config.data.test_lanes lanes of whole files and about equal
                             length (`lanes`), read in parallel. A recurrent model carries its
                             state through a lane in chunks of config.data.test_chunk bytes
                             (exactly one pass over the lane). The transformer reads windows
                             of `context` bytes advancing by config.data.test_stride (0: half
                             the context) and scores each window's last `stride` bytes (the
                             first window all of its bytes): every byte sees at least
                             context − stride bytes before it, or all of them near a lane's start.
    test/zlib_bits_per_byte  8 · len(zlib.compress(data, 9)) / len(data)
    test/xz_bits_per_byte    8 · len(lzma.compress(data, preset=9 | PRESET_EXTREME)) / len(data)
                             (= xz -9e), data the same bytes as one concatenated stream: like
                             the models, the compressors may use earlier files (file by file,
                             zlib does 4% and xz 22% worse on Python 3.11's test split)
    test/bytes, test/files   how much was scored; perf/test_seconds the time it took
  """
  d, started = config.data, time.perf_counter()
  tokens, scored = lanes(texts, d.test_lanes)
  if model.kind in BLOCK_KINDS:      # no carried state: windows of the context
    nats = sliding_window_nats(model, params, tokens, scored, d.context,
                               d.test_stride or max(d.context // 2, 1), config.train.batch_size)
  else:
    nats = carried_state_nats(model, params, tokens, scored, d.test_chunk)
  data = b"".join(texts)
  compressed = compressed_bits_per_byte(data)
  return {"test/bits_per_byte": nats / math.log(2) / len(data),
          "test/zlib_bits_per_byte": compressed["zlib"],
          "test/xz_bits_per_byte": compressed["xz"],
          "test/bytes": float(len(data)), "test/files": float(len(texts)),
          "perf/test_seconds": time.perf_counter() - started}


# ---- Samples ------------------------------------------------------------------------------

def draw_samples(config, model: LanguageModel, params) -> str:
  """samples.txt: the settings, then each sample (prompt + continuation, bytes decoded as
  UTF-8 with replacement characters): config.sample.num_samples continuations of
  config.sample.prompt (read as the start of a file) of config.sample.length bytes, drawn with
  config.sample.temperature and top_k."""
  s = config.sample
  prompt = bytes([python_corpus.FILE_START]) + s.prompt.encode("utf-8")
  prompts = jnp.tile(jnp.frombuffer(prompt, jnp.uint8).astype(jnp.int32), (s.num_samples, 1))
  draw = jax.jit(lambda params, prompts, rng: sample(
      model, params, prompts, rng, length=s.length, temperature=s.temperature, top_k=s.top_k,
      context=config.data.context))
  rng = jax.random.fold_in(jax.random.key(config.seed), 2)
  tokens = np.asarray(jax.device_get(draw(params, prompts, rng)), np.uint8)
  header = (f"# {s.num_samples} samples of {s.length} bytes after the prompt {s.prompt!r} read "
            f"as the start of a file; {model.kind}, temperature {s.temperature}, top_k "
            f"{s.top_k or 'off'}\n")
  bodies = [f"\n# ---- sample {i}\n{s.prompt}{bytes(row).decode('utf-8', 'replace')}\n"
            for i, row in enumerate(tokens)]
  return header + "".join(bodies)


# ---- The task -----------------------------------------------------------------------------

def build_model(config, read=None) -> Model:
  """make_model(config), initialised on a window of config.data.context bytes; no extras
  (the vocabulary is the 256 bytes, python_corpus.FILE_START = 0 before each file)."""
  del read     # the corpus manifest the run writes is not needed
  model = make_model(config)
  return Model(model, lambda rng: model.init(
      rng, jnp.zeros((1, config.data.context), jnp.int32))["params"])


def inference(config, model, extras) -> Inference:
  """The next-byte logits [B, L, 256] of windows of L = config.data.context bytes [B, L],
  from the start of each window (a recurrent model from a zero state)."""
  del extras     # none: the vocabulary is the bytes
  context = config.data.context

  def function(params, window):
    logits, _ = model.apply({"params": params}, window)
    return {"logits": logits}

  start = python_corpus.FILE_START
  return Inference(
      function,
      {"bytes": (jax.ShapeDtypeStruct((1, context), jnp.int32),
                 f"windows of {context} bytes as ints 0 … 255, a text read as the start of a "
                 f"file after the byte {start} that precedes every file in training; a shorter "
                 "text padded at the end with anything (the model is causal: position t reads "
                 "bytes 0 … t only)")},
      {"logits": "logits[:, t]: the unnormalised log-probabilities of the "
                 "byte after position t (softmax over the last axis)"},
      {"vocabulary": "the bytes 0 … 255", "file_start": start, "context": context})


def build(config) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py.

  Training: batch n is config.train.batch_size windows of config.data.context + 1 bytes at
  offsets in the training stream (files preceded by the byte 0, windows may span files)
  drawn by GeneratedStream, block j of its rows from np.random.default_rng([config.seed, n,
  j]); the loss is the mean cross-entropy (nats) of the next byte at every position, from a
  zero state (recurrent) or no earlier context. Periodic evaluation: config.data.eval_windows
  validation windows drawn once from SeedSequence(config.seed, spawn_key=(1,)), scored the
  same way: eval/loss (nats per byte) and eval/bits_per_byte. The report: `test_metrics` and
  `draw_samples`.
  """
  d, (model, init, _) = config.data, build_model(config)
  corpus = load_corpus(config)
  if model.kind in BLOCK_KINDS:
    check_test_memory(config, sum(map(len, corpus.texts("test", d.test_bytes))))
  manifest = corpus.manifest()
  if jax.process_index() == 0:
    print(python_corpus.describe(manifest) + f" -> {MANIFEST}", file=sys.stderr, flush=True)
  train_stream = corpus.stream("train")
  eval_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(1,)))
  validation = python_corpus.random_windows(corpus.stream("validation"), eval_rng,
                                            d.eval_windows, d.context)

  def generate(rng, batch_size):
    return {"tokens": python_corpus.random_windows(train_stream, rng, batch_size, d.context)}

  def loss(params, batch, rng):
    nats = window_losses(model, params, batch["tokens"], rng).mean()
    return nats, {"bits_per_byte": nats / math.log(2)}

  def evaluate(params, batch):
    nats = window_losses(model, params, batch["tokens"]).sum(axis=1)          # [B]
    count = jnp.full(nats.shape, batch["tokens"].shape[1] - 1, jnp.float32)
    return {"loss": (nats, count), "bits_per_byte": (nats / math.log(2), count)}

  def report(params) -> Report:
    metrics = test_metrics(config, model, params, corpus.texts("test", d.test_bytes))
    return Report(metrics=metrics, texts={SAMPLES: draw_samples(config, model, params)})

  return Workload(init=init, train_data=GeneratedStream(generate, config.train.batch_size,
                                                    config.seed),
              eval_data=eval_batches({"tokens": validation}, config.train.batch_size),
              loss=loss, evaluate=evaluate, report=report,
              files={MANIFEST: json.dumps(manifest, indent=2) + "\n"})


register("char_lm", validate=validate, build=build, build_model=build_model,
         inference=inference)
