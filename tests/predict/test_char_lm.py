"""research.predict.char_lm on a tiny char_lm run (a GRU, 2 steps, a library written here):
restored samples and scores equal the loop's own, bits per byte −log2 softmax of one pass
over the text, temperature 0 the argmax of one pass, top_k = 1 temperature 0; a transformer's
windows score as the experiment's evaluation does; the refusals (sizes and seeds beyond
what one call holds, with their range); a long text scored in windows of one shape as in one
call; a long prompt sampled by the blocks from its last context bytes as from all."""

import dataclasses
import math

import jax
import numpy as np
import pytest

from research.errors import InputError
from research.experiments import char_lm as experiment
from research.models import language_model
from research.predict import char_lm as predictor
from research.predict import runs as rules
from research.predict.char_lm import bits_per_byte, byte_bits, sample

from . import trained

pytestmark = pytest.mark.xdist_group("predict_char_lm")   # one worker: its trained fixtures run once

TINY = {"train.num_steps": 2, "train.batch_size": 4, "train.warmup_steps": 0,
        "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2,
        "data.context": 16, "data.eval_windows": 4, "data.test_bytes": 100,
        "data.test_lanes": 1, "data.test_chunk": 16, "model.hidden_size": 16,
        "model.embed_size": 8}
TEXT = "def f(x):\n  return 'é' * x\n\n\nprint(f(3))\n"       # 42 bytes: 3 chunks of 16


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def runs(tmp_path_factory):
  """(restored run, the same with the parameters the loop ended with) of a GRU trained on a
  library of 60 small modules."""
  root = tmp_path_factory.mktemp("char_lm")
  for i in range(60):
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib" / f"module_{i}.py").write_text(f"# module {i}\nx = {i}\n" * (1 + i % 5))
  config = trained.config("char_lm", "model=gru", {**TINY, "data.stdlib": str(root / "lib")})
  return trained.restored_and_final(config, str(root / "run"), report=False)


def log2_softmax(run, params=None):
  """tokens [B, L] -> log2 p of every byte after each position [B, L, 256], from one pass of
  the run's model (its parameters, or `params`), jit-compiled."""
  apply = lambda tokens: run.model.apply({"params": run.params if params is None else params},
                                         tokens)[0]
  return jax.jit(lambda tokens: jax.nn.log_softmax(apply(tokens)) / math.log(2))


def file_tokens(data: bytes, length: int | None = None) -> np.ndarray:
  """FILE_START (0) then data, padded with 0 to `length`: [1, length]."""
  tokens = np.frombuffer(b"\0" + data, np.uint8).astype(np.int32)
  return np.pad(tokens, (0, (length or len(tokens)) - len(tokens)))[None]


@pytest.mark.slow
def test_a_restored_run_samples_and_scores_as_the_loop_ended(runs):
  run, final = runs
  drawn = sample(run, "def ", length=12, seed=3, num_samples=2)
  assert drawn == sample(final, "def ", length=12, seed=3, num_samples=2)
  assert [len(s) for s in drawn] == [12, 12] and drawn[0] != drawn[1]
  trained.assert_bitwise_equal(byte_bits(run, TEXT), byte_bits(final, TEXT))


@pytest.mark.slow
def test_bits_per_byte_is_minus_log2_softmax_of_one_pass_over_the_file(runs):
  """A GRU reads the text in chunks of config.data.test_chunk = 16 bytes, its state carried:
  the same as one pass over FILE_START and the text."""
  run, _ = runs
  data = TEXT.encode("utf-8")
  tokens = file_tokens(data)
  expected = -log2_softmax(run)(tokens[:, :-1])[0, np.arange(len(data)), tokens[0, 1:]]
  bits = byte_bits(run, TEXT)
  assert bits.shape == (42,) and bits.dtype == np.float64
  np.testing.assert_allclose(bits, expected, rtol=1e-5)
  assert bits_per_byte(run, data) == pytest.approx(float(np.mean(expected)), rel=1e-6)
  assert bits_per_byte(run, TEXT) == bits_per_byte(run, data)


@pytest.mark.slow
def test_temperature_0_draws_the_argmax_and_top_k_1_too(runs):
  """From an empty prompt: the start of a file, FILE_START alone."""
  run, _ = runs
  prompt, length = b"", 10
  greedy = sample(run, prompt, length=length, temperature=0, num_samples=2)
  assert greedy[0] == greedy[1]
  tokens = file_tokens(prompt, len(prompt) + 1 + length)       # the bytes after, filled in
  one_pass = log2_softmax(run)
  for t in range(len(prompt), len(prompt) + length):           # causal: later bytes unread
    tokens[0, t + 1] = np.argmax(one_pass(tokens)[0, t])
  assert greedy[0] == bytes(tokens[0, len(prompt) + 1:].astype(np.uint8))
  assert sample(run, prompt, length=length, temperature=1.0, top_k=1, seed=7) == greedy[:1]


@pytest.mark.slow
def test_a_transformer_scores_in_windows_as_the_experiments_evaluation():
  """Windows of the context (16 bytes) every stride (4): the experiment's test/bits_per_byte
  of the text alone; the first window's bytes −log2 softmax of one pass."""
  config = trained.config("char_lm", "model=transformer", {
      **TINY, "data.test_stride": 4, "model.hidden_size": 8, "model.num_layers": 1,
      "model.num_heads": 2, "model.mlp_size": 16})
  run = trained.untrained(config)
  run = dataclasses.replace(run, params=jax.jit(run.experiment.build_model(config).init)(
      jax.random.key(0)))
  data = TEXT.encode("utf-8")
  bits = byte_bits(run, data)
  evaluation = experiment.test_metrics(config, run.model, run.params, [data])
  assert float(np.mean(bits)) == pytest.approx(evaluation["test/bits_per_byte"], rel=1e-6)
  tokens = file_tokens(data)
  first = -log2_softmax(run)(tokens[:, :16])[0, np.arange(16), tokens[0, 1:17]]
  np.testing.assert_allclose(bits[:16], first, rtol=1e-5)


# ---- Refusals, on a run built without data or parameters ------------------------------------

@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def untrained():
  return trained.untrained(trained.config("char_lm", "model=gru", TINY))


GRU_SAMPLES = rules.CALL_BYTES // (5 * 1024)   # "def " and FILE_START: 5 positions' logits
RANGE = {"length": "length={!r} must be an int in 1 … 16777216 (num_samples × length ≤ "
                   "SAMPLED_BYTES = 16,777,216 bytes drawn at once, num_samples=1)",
         "num_samples": f"num_samples={{!r}} must be an int in 1 … {GRU_SAMPLES} (a step's "
                        "logits, num_samples × 5 positions × 256 float32, within "
                        "research.predict.runs.CALL_BYTES = 268,435,456)",
         "seed": "seed={!r} must be an int in 0 … 4294967295 (jax.random.key keeps 32 bits of "
                 "a seed: 4294967296 would repeat 0)"}


@pytest.mark.parametrize("options, message", [
    ({"prompt": 7}, "prompt must be a str or bytes, got a int"),
    ({"prompt": "a\ud800b"}, r"prompt 'a\ud800b' cannot be encoded as UTF-8 (surrogates not "
                             r"allowed: '\ud800' at character 1)"),
    *[({name: value}, RANGE[name].format(value)) for name, values in (
        ("length", (0, -1, 2.5, True, "8", 2**24 + 1, 10**9, 2**31, 2**40, 2**64)),
        ("num_samples", (0, -1, 1.0, True, GRU_SAMPLES + 1, 10**9, 2**40)),
        ("seed", (-1, 2**32, 2**63, 2**64, 1.5, "0", True, None))) for value in values],
    ({"num_samples": 2, "length": 2**23 + 1},
     "length=8388609 must be an int in 1 … 8388608 (num_samples × length ≤ SAMPLED_BYTES = "
     "16,777,216 bytes drawn at once, num_samples=2)"),
    ({"prompt": b"x" * 2**18}, "prompt of 262144 bytes is longer than a gru model reads "
                                     "at once: at most 262143 bytes"),
    ({"temperature": -0.5}, "temperature=-0.5 must be a number >= 0 (0: the most likely byte)"),
    ({"temperature": float("nan")}, "temperature=nan must be a number >= 0"),
    ({"top_k": 257}, "top_k=257 must be an int in 0 … 256 (0: every byte)"),
    ({"top_k": -1}, "top_k=-1 must be an int in 0 … 256"),
])
def test_sampling_settings_the_model_cannot_take_are_refused(untrained, options, message):
  """Sizes whose output or state would not fit, and seeds jax.random.key would overflow on
  or wrap (2**32 is key(0)), are refused with the range: no OverflowError or MemoryError."""
  with pytest.raises(InputError) as raised:
    sample(untrained, **{"prompt": "def ", "length": 8, **options})
  assert str(raised.value).startswith(message), raised.value


def test_the_bounds_of_sampling_are_what_one_call_holds(untrained):
  """A prompt one byte shorter than the refused one is taken by the GRU for one sample, not
  for two; the largest num_samples × length passes the checks (refused at temperature only)."""
  with pytest.raises(InputError, match="^num_samples=2 must be an int in 1 … 1 "):
    sample(untrained, b"x" * (2**18 - 1), length=1, num_samples=2)
  for num_samples, length in ((1, 2**24), (GRU_SAMPLES, 2**24 // GRU_SAMPLES)):
    with pytest.raises(InputError, match="^temperature="):
      sample(untrained, "def ", length=length, num_samples=num_samples, temperature=-1)


@pytest.mark.parametrize("text, message", [
    ("", "text is empty: give at least one byte to score"),
    (b"", "text is empty"),
    (["def"], "text must be a str or bytes, got a list"),
])
def test_texts_the_model_cannot_score_are_refused(untrained, text, message):
  for score in (byte_bits, bits_per_byte):
    with pytest.raises(InputError) as raised:
      score(untrained, text)
    assert str(raised.value).startswith(message), raised.value


def test_a_run_of_another_experiment_is_refused(untrained):
  config = untrained.config.copy_and_resolve_references()
  config.experiment = "nmt_dates"
  other = dataclasses.replace(untrained, config=config)
  for function, call in (("sample", lambda: sample(other, "def ", length=4)),
                         ("bits_per_byte", lambda: bits_per_byte(other, "def"))):
    with pytest.raises(InputError, match=f"^{function} answers char_lm runs; the run in "
                                         r"\(untrained\) is a nmt_dates run$"):
      call()


# ---- Bounded memory: windows in batches, a long prompt cut to the blocks' context ----------

@pytest.fixture(scope="session")
def transformer():
  """A char_lm transformer of context 16, stride 4, train.batch_size 4, initial parameters."""
  config = trained.config("char_lm", "model=transformer", {
      **TINY, "data.test_stride": 4, "model.hidden_size": 8, "model.num_layers": 1,
      "model.num_heads": 2, "model.mlp_size": 16})
  return trained.untrained(config, initialised=True)




@pytest.mark.slow
def test_a_long_text_is_scored_in_windows_of_one_shape_as_in_one_call(transformer, monkeypatch):
  """2 000 bytes: 497 windows of 16 bytes (+ 1 target), cut from the text 4 at a time
  (config.train.batch_size), every call [4, 17]; the same bits as one call of 512 windows."""
  text = bytes(np.random.default_rng(0).integers(32, 127, 2000, dtype=np.uint8))
  reference = byte_bits(trained.with_batch_size(transformer, 512), text)
  shapes, window_nats = [], predictor._window_nats
  monkeypatch.setattr(predictor, "_window_nats", lambda model, params, windows: (
      shapes.append(windows.shape), window_nats(model, params, windows))[1])
  bits = byte_bits(transformer, text)
  assert bits.shape == (2000,) and np.all(np.isfinite(bits)) and np.all(bits > 0)
  assert len(shapes) == -(-497 // 4) and set(shapes) == {(4, 17)}
  np.testing.assert_allclose(bits, reference, rtol=1e-6)
  monkeypatch.setattr(rules, "MAX_ROWS", 1)               # a bound below the batch size
  shapes.clear()
  np.testing.assert_allclose(byte_bits(transformer, text), reference, rtol=1e-6)
  assert len(shapes) == 497 and set(shapes) == {(1, 17)}


@pytest.mark.slow
def test_the_blocks_sample_a_long_prompt_from_its_last_context_bytes_as_from_all(transformer):
  """language_model.sample over the whole 60-byte prompt draws what sample draws from its
  last 16 bytes (the context), the one compiled shape of every longer prompt."""
  prompt = b"def f(x):\n  return x * 2\n\n\nprint(f(3), f(4), f(5), f(6))\n"
  tokens = np.tile(np.frombuffer(b"\0" + prompt, np.uint8).astype(np.int32), (3, 1))
  full = jax.jit(lambda params, tokens, key: language_model.sample(
      transformer.model, params, tokens, key, length=12, temperature=1.0, top_k=0, context=16))(
          transformer.params, tokens, jax.random.key(5))
  drawn = sample(transformer, prompt, length=12, seed=5, num_samples=3)
  assert drawn == [bytes(row) for row in np.asarray(full, np.uint8)]
  assert len(set(drawn)) == 3
