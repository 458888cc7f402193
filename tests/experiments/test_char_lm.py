"""The char_lm experiment: config and validation, the whole-file evaluation (lanes, carried
state, sliding windows) against direct computations written here, the compressor rows
against the files read back from the manifest (and the xz command), one tiny run."""

import functools
import json
import lzma
import math
import os
import re
import shutil
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research import experiments
from research.data import python_corpus
from research.errors import ConfigError, InputError
from research.experiments import char_lm
from research.models.language_model import LanguageModel
from research.training.config import apply_overrides
from research.training.loop import train_and_evaluate, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import char_lm as experiment  # noqa: E402

pytestmark = pytest.mark.usefixtures("highest_precision")
TEXTS = [b"import os\n", b"x = 1\n" * 7, b"def f():\n  return 2\n", b"#", b"pass\n" * 3]


@functools.cache
def model_and_params(kind: str):
  model = LanguageModel(kind=kind, hidden_size=16, num_layers=1, embed_size=8, num_heads=2)
  return model, jax.jit(model.init)(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))["params"]


def nll(model, params, tokens: np.ndarray) -> np.ndarray:
  """−ln p of each next byte of tokens [B, T + 1] in one pass: [B, T] float64."""
  logits, _ = jax.jit(model.apply)({"params": params}, jnp.asarray(tokens[:, :-1]))
  return np.asarray(optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.asarray(tokens[:, 1:])), np.float64)


# ---- Config -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["lstm", "gru", "transformer", "lru", "s5"])
def test_every_variant_validates(model):
  config = experiment.get_config(f"model={model}")
  assert config.experiment == "char_lm" and config.model.kind == model
  validate(config, experiments.get("char_lm"))


def test_the_default_is_a_recurrent_model_on_the_whole_test_split():
  config = experiment.get_config()
  assert config.model.kind in ("lstm", "gru") and config.data.test_bytes == 0
  assert config.data.stdlib == "" and config.data.include_tests


@pytest.mark.parametrize("overrides,message", [
    ({"model.kind": "xl"}, r"config.model.kind='xl' is not allowed; choose one of: 'rnn', "
                           r"'lstm', 'gru', 'transformer'"),
    ({"data.context": 0}, "config.data.context=0 must be a number > 0"),
    ({"data.test_stride": 999}, "config.data.test_stride=999 must be <= config.data.context"),
    ({"sample.top_k": 300}, "config.sample.top_k=300 must be in 0 … 256"),
    ({"sample.temperature": -1.0}, "config.sample.temperature=-1.0 must be a number >= 0"),
    ({"model.dropout_rate": 1.0}, r"config.model.dropout_rate=1.0 must be in \[0, 1\)"),
    ({"model.attention": "routing"}, "config.model.attention='routing' is not allowed; choose "
                                     "one of: 'full', 'local', 'longformer'"),
    ({"model.kind": "transformer", "model.attention": "linformer"},
     "config.model.attention: attention 'linformer' cannot be causal .*; a causal model takes "
     "one of full, local, longformer, sparse, bigbird, linear, performer, synthesizer, "
     "sinkhorn, reformer"),
    ({"model.mlp_size": -1}, "config.model.mlp_size=-1 must be a number >= 0"),
    ({"data.stdlib": "/no/such/dir"}, "config.data.stdlib='/no/such/dir' is not a directory"),
    ({"model.kind": "transformer", "model.num_heads": 3}, "config.model.num_heads=3 must divide"),
    ({"model.implementation": "fast"}, "config.model.implementation='fast' is not allowed"),
])
def test_bad_values_are_named_before_anything_is_built(overrides, message):
  config = apply_overrides(experiment.get_config(), overrides)
  with pytest.raises(ConfigError, match=message):
    validate(config, experiments.get("char_lm"))


@pytest.mark.parametrize("model", ["gru", "lru"])
def test_only_carried_state_models_size_the_test_chunks_logits(model):
  """The recurrent cells read the test split in chunks of test_lanes × test_chunk logits;
  the block models (transformer, LRU, S5) read windows of the context instead."""
  config = apply_overrides(experiment.get_config(f"model={model}"),
                           {"data.test_lanes": 10**6, "data.test_chunk": 10**6})
  if model == "gru":
    with pytest.raises(ConfigError, match="the logits of the test split's chunks"):
      validate(config, experiments.get("char_lm"))
  else:
    validate(config, experiments.get("char_lm"))


def test_an_unknown_variant_is_named():
  with pytest.raises(ConfigError, match="variant model='xl' is not allowed; choose one of: "
                                        "lstm, gru, transformer"):
    experiment.get_config("model=xl")


# ---- Data ---------------------------------------------------------------------------------

def small_library(root) -> None:
  """120 modules of distinct text: every split gets some (checked by the tests)."""
  for i in range(120):
    path = root / f"pkg{i % 7}" / f"module_{i}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(f"# module {i}\n".encode() + bytes([65 + i % 26]) * (50 + i))


def test_batches_are_windows_of_the_training_split_a_function_of_seed_and_step(tmp_path):
  small_library(tmp_path)
  config = apply_overrides(experiment.get_config(), {
      "data.stdlib": str(tmp_path), "data.context": 16, "data.eval_windows": 40,
      "train.batch_size": 8, "seed": 3})
  validate(config, experiments.get("char_lm"))
  task = char_lm.build(config)
  corpus = python_corpus.load(str(tmp_path))
  assert all(corpus.files.values())
  streams = {split: corpus.stream(split).tobytes() for split in corpus.files}
  batches = [next(task.train_data)["tokens"] for _ in range(3)]
  for batch in batches:
    assert batch.shape == (8, 17) and batch.dtype == np.int32
    assert all(bytes(row.astype(np.uint8)) in streams["train"] for row in batch)
  assert not np.array_equal(batches[0], batches[1])
  task.train_data.set_state({"step": 1})                       # a resumed run
  np.testing.assert_array_equal(next(task.train_data)["tokens"], batches[1])
  again = char_lm.build(config)
  np.testing.assert_array_equal(next(again.train_data)["tokens"], batches[0])
  # Validation windows come from the validation split only; padding rows weigh 0.
  windows = [(row, w) for b in task.eval_data for row, w in zip(b["tokens"], b["weight"])]
  assert len(windows) == 40 and sum(w for _, w in windows) == 40
  assert all(bytes(row.astype(np.uint8)) in streams["validation"] for row, _ in windows)
  manifest = json.loads(task.files[char_lm.MANIFEST])
  assert manifest["splits"]["train"]["paths"] == corpus.files["train"]


def test_a_library_too_small_to_split_is_named(tmp_path):
  (tmp_path / "os.py").write_bytes(b"import abc\n")
  config = apply_overrides(experiment.get_config(), {"data.stdlib": str(tmp_path)})
  with pytest.raises(InputError, match=f"{tmp_path}: its .py files split into train"):
    char_lm.build(config)


# ---- Whole-file evaluation ----------------------------------------------------------------

@pytest.mark.parametrize("num_lanes", [1, 2, 3, 8])
def test_lanes_hold_every_text_once_after_its_file_start(num_lanes):
  tokens, scored = char_lm.lanes([*TEXTS, b""], num_lanes)
  assert tokens.shape == (num_lanes, scored.shape[1] + 1) and tokens.dtype == np.int32
  assert scored.sum() == sum(map(len, TEXTS))
  # The runs of scored bytes are the texts, each after a FILE_START, in their order.
  found = []
  for lane in range(num_lanes):
    edges = np.flatnonzero(np.diff(np.r_[0, scored[lane].astype(int), 0]))
    runs = [bytes(tokens[lane, a + 1:b + 1].astype(np.uint8)) for a, b in edges.reshape(-1, 2)]
    assert all(tokens[lane, a] == python_corpus.FILE_START for a, _ in edges.reshape(-1, 2))
    assert [TEXTS.index(r) for r in runs] == sorted(TEXTS.index(r) for r in runs)
    found += runs
  assert sorted(found) == sorted(TEXTS)
  # Longest first into the shortest lane: no lane exceeds an even share by a whole text.
  sizes = [len(t) + 1 for t in [*TEXTS, b""]]
  assert scored.shape[1] <= sum(sizes) / num_lanes + max(sizes)
  assert scored.shape[1] >= max(sizes[1], sum(sizes) / num_lanes)


@pytest.mark.slow
@pytest.mark.parametrize("kind,chunk", [("lstm", 1), ("gru", 7)])
def test_carried_state_in_chunks_equals_one_pass_over_each_lane(kind, chunk):
  model, params = model_and_params(kind)
  tokens, scored = char_lm.lanes(TEXTS, 2)
  expected = (nll(model, params, tokens) * scored).sum()
  ours = char_lm.carried_state_nats(model, params, tokens, scored, chunk)
  assert ours == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("context,stride", [(13, 5), (8, 8)])
def test_sliding_windows_score_each_byte_once_with_its_window(context, stride):
  model, params = model_and_params("transformer")
  tokens, scored = char_lm.lanes(TEXTS, 2)
  # Position t is scored by window 0 if t < context, else by the latest window holding it:
  # the one starting at the multiple of stride at or above t − context + 1.
  lanes, positions = np.nonzero(scored)
  starts = np.where(positions < context, 0, -(-(positions - context + 1) // stride) * stride)
  padded = np.pad(tokens, ((0, 0), (0, context + stride)))
  windows = np.stack([padded[lane, s:s + context + 1] for lane, s in zip(lanes, starts)])
  expected = nll(model, params, windows)[np.arange(len(windows)), positions - starts].sum()
  ours = char_lm.sliding_window_nats(model, params, tokens, scored, context, stride, 4)
  assert ours == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_uniform_logits_score_exactly_8_bits_per_byte(kind):
  model, params = model_and_params(kind)
  params = {**params, "head": jax.tree.map(jnp.zeros_like, params["head"])}
  config = apply_overrides(experiment.get_config(f"model={kind}"),
                           {"data.context": 16, "data.test_lanes": 3, "data.test_chunk": 7})
  metrics = char_lm.test_metrics(config, model, params, TEXTS)
  assert metrics["test/bits_per_byte"] == pytest.approx(8.0, abs=1e-7)
  assert metrics["test/bytes"] == sum(map(len, TEXTS)) and metrics["test/files"] == len(TEXTS)


def test_the_compressor_rows_are_zlib_9_and_xz_9e_of_the_concatenation():
  data = b"".join(TEXTS) * 50
  rows = char_lm.compressed_bits_per_byte(data)
  assert rows["zlib"] == 8 * len(zlib.compress(data, 9)) / len(data)
  assert zlib.decompress(zlib.compress(data, 9)) == data
  assert rows["xz"] == 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)
  if shutil.which("xz"):       # the command the issue names: xz -9e
    command = subprocess.run(["xz", "-9e", "-c"], input=data, capture_output=True, check=True)
    assert rows["xz"] == 8 * len(command.stdout) / len(data)


# ---- End to end -----------------------------------------------------------------------------

TINY = {"train.num_steps": 6, "train.batch_size": 8, "train.log_every": 3,
        "train.eval_every": 3, "train.checkpoint_every": 6, "train.warmup_steps": 0,
        "data.context": 32, "data.eval_windows": 16, "data.test_bytes": 3000,
        "data.test_lanes": 4, "data.test_chunk": 256, "model.hidden_size": 16,
        "model.embed_size": 8, "sample.num_samples": 2, "sample.length": 20}


@pytest.mark.slow
def test_a_tiny_run_reports_bits_per_byte_beside_zlib_and_xz_on_the_same_bytes(tmp_path):
  config = apply_overrides(experiment.get_config("model=gru"), TINY)
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(config, workdir, experiments.get("char_lm"))
  with open(os.path.join(workdir, "final_metrics.json")) as f:
    written = json.load(f)
  for key in ("test/bits_per_byte", "test/zlib_bits_per_byte", "test/xz_bits_per_byte",
              "eval/bits_per_byte", "eval/loss"):
    assert written[key] == pytest.approx(final[key]) and math.isfinite(final[key])
  assert final["test/bits_per_byte"] < 8.5            # six steps: near uniform, not broken
  # The compressors saw exactly the first 3000 bytes of the test files the manifest lists,
  # read here from the library directly.
  with open(os.path.join(workdir, char_lm.MANIFEST)) as f:
    manifest = json.load(f)
  data = b""
  for path in manifest["splits"]["test"]["paths"]:
    with open(os.path.join(manifest["stdlib"], path), "rb") as f:
      data += f.read()
  data = data[:3000]
  assert final["test/bytes"] == 3000
  assert final["test/zlib_bits_per_byte"] == 8 * len(zlib.compress(data, 9)) / 3000
  assert final["test/xz_bits_per_byte"] == 8 * len(
      lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / 3000
  with open(os.path.join(workdir, char_lm.SAMPLES), encoding="utf-8") as f:
    samples = f.read()
  assert samples.count("# ---- sample") == 2 and "def " in samples


def test_the_docs_state_each_default_models_parameter_count():
  """docs/results/char_lm.md's "GRU 1 × 256 (the default, 0.33M parameters), LSTM … (0.41M),
  transformer … (0.46M), LRU … (0.40M), S5 … (0.36M)" counted from each variant's config
  (shapes only, nothing initialised)."""
  with open(os.path.join(ROOT, "docs", "results", "char_lm.md"), encoding="utf-8") as f:
    text = " ".join(f.read().split())
  for kind in ("gru", "lstm", "transformer", "lru", "s5"):
    config = experiment.get_config(f"model={kind}")
    model = char_lm.make_model(config)
    shapes = jax.eval_shape(model.init, jax.random.key(0),
                            jnp.zeros((1, config.data.context), jnp.int32))
    count = sum(x.size for x in jax.tree.leaves(shapes))
    stated = re.search(rf"{kind} [^()]*\((?:the default, )?([\d.]+)M(?: parameters)?\)", text,
                       re.IGNORECASE)
    assert stated, f"docs/results/char_lm.md states no parameter count for char_lm's {kind}"
    assert f"{count / 1e6:.2f}" == stated.group(1), (kind, count, stated.group(1))
