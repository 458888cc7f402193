"""research.predict.mqar on a tiny mqar run (2 steps): restored answers equal the loop's own
and the argmax of the model's whole-sequence logits at the positions, attention rows are
causal distributions, the batches join seamlessly (one shape a call), attention weights
beyond RESULT_BYTES refused up front, and the refusals."""

import dataclasses

import jax
import numpy as np
import pytest

from research.data.mqar import multi_query_recall
from research.errors import InputError
from research.predict import mqar as predictor
from research.predict import runs as rules
from research.predict.mqar import recall

from . import trained

pytestmark = pytest.mark.xdist_group("predict_mqar")   # one worker: its trained run once

TINY = {"data.length": 16, "data.num_pairs": 4, "data.vocab_size": 32,
        "data.train_examples": 64, "data.eval_examples": 16, "model.hidden_size": 16,
        "train.batch_size": 8, "train.num_steps": 2, "train.warmup_steps": 1,
        "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2}


def tiny_config():
  return trained.config("mqar", "preset=cpu", TINY)


def sequences(count: int, seed: int = 1):
  return multi_query_recall(np.random.default_rng(seed), count, length=16, num_pairs=4,
                            vocab_size=32)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
  return trained.restored_and_final(tiny_config(), str(tmp_path_factory.mktemp("mqar")))


@pytest.mark.slow
def test_a_restored_run_answers_as_the_loop_ended_and_as_its_whole_logits(runs, monkeypatch):
  run, final = runs
  batch = sequences(5)
  result = recall(run, batch["inputs"], batch["positions"])
  trained.assert_bitwise_equal(result, recall(final, batch["inputs"], batch["positions"]))
  logits, _ = jax.jit(run.model.apply)({"params": run.params}, batch["inputs"])
  at = np.asarray(logits)[np.arange(5)[:, None], batch["positions"]]      # [5, 4, V]
  np.testing.assert_array_equal(result.tokens, at.argmax(-1))
  np.testing.assert_allclose(result.probabilities, jax.nn.softmax(at).max(-1), rtol=1e-5)
  (first, second) = result.attention                        # two layers of one head
  for weights in (first, second):
    assert weights.shape == (5, 1, 16, 16)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(np.ones((16, 16)), 1)[None, None] * weights == 0)   # causal
  monkeypatch.setattr(rules, "MAX_ROWS", 2)               # 5 sequences in 3 calls
  trained.assert_bitwise_equal(recall(run, batch["inputs"], batch["positions"]), result)


@pytest.fixture(scope="session")
def untrained():
  return trained.untrained(tiny_config(), initialised=True)


@pytest.mark.parametrize("inputs, positions, message", [
    (np.zeros((2, 15), int), np.zeros((2, 4), int), "inputs has 15 tokens a sequence; the run "
                                                    "takes config.data.length=16"),
    (np.zeros((0, 16), int), np.zeros((0, 4), int), r"inputs must be ints of shape \[B ≥ 1"),
    (np.zeros((2, 16)), np.zeros((2, 4), int), "got float64 of shape"),
    (np.full((2, 16), 32), np.zeros((2, 4), int), r"inputs\[0, 0\] = 32: a token of the run "
                                                  "must be in 0 … 31"),
    (np.zeros((2, 16), int), np.array([[0, 1, 2, 16], [0, 0, 0, 0]]),
     r"positions\[0, 3\] = 16: a position of the run must be in 0 … 15"),
    (np.zeros((2, 16), int), np.zeros((3, 4), int), r"positions must be \[2, K\] with 1 ≤ K ≤ 16 "
                                                    r"\(a sequence's positions\) for inputs of "
                                                    r"2 sequences, got shape \(3, 4\)"),
    (np.zeros((2, 16), int), np.zeros((2, 17), int), r"positions must be \[2, K\] with 1 ≤ K ≤ 16"),
    (np.zeros((2, 16), int), np.zeros((2, 0), int), r"positions must be ints of shape"),
    ([[1] * 16, [2] * 15], np.zeros((2, 4), int), r"inputs is not an array \(.*\): it must be "
                                                  r"ints of shape \[B ≥ 1, …\] \(rank 2\)"),
    (np.zeros((2, 16), bool), np.zeros((2, 4), int), "got bool of shape"),
    (np.full((2, 16), 2**40), np.zeros((2, 4), int), r"inputs\[0, 0\] = 1099511627776: a token"),
])
def test_bad_input_is_refused_in_one_line(untrained, inputs, positions, message):
  with pytest.raises(InputError, match=message) as error:
    recall(untrained, inputs, positions)
  assert "\n" not in str(error.value)


# ---- Bounded memory: batches of one shape, attention weights refused beyond the bound -------



@pytest.mark.slow
def test_sequences_in_batches_answer_as_in_one_batch(untrained, monkeypatch):
  """19 sequences: 10 calls of 2 (MAX_ROWS forced, the last padded) answer as one call of
  19, with and without attention."""
  batch = sequences(19, seed=3)
  shapes = trained.recording(monkeypatch, predictor, "_recall")
  config = untrained.config.copy_and_resolve_references()
  config.train.batch_size = 19
  whole = recall(dataclasses.replace(untrained, config=config), batch["inputs"],
                 batch["positions"])
  assert shapes == [(19, 16)]
  monkeypatch.setattr(rules, "MAX_ROWS", 2)
  shapes.clear()
  batched = recall(untrained, batch["inputs"], batch["positions"])
  assert shapes == [(2, 16)] * 10
  np.testing.assert_array_equal(batched.tokens, whole.tokens)
  np.testing.assert_allclose(batched.probabilities, whole.probabilities, rtol=1e-6)
  for got, expected in zip(batched.attention, whole.attention, strict=True):
    assert got.shape == expected.shape == (19, 1, 16, 16)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
  plain = recall(untrained, batch["inputs"], batch["positions"], attention=False)
  assert plain.attention is None
  np.testing.assert_array_equal(plain.tokens, whole.tokens)
  np.testing.assert_allclose(plain.probabilities, whole.probabilities, rtol=1e-6)


def test_attention_weights_beyond_the_bound_are_refused_before_anything_runs(untrained,
                                                                             monkeypatch):
  shapes = trained.recording(monkeypatch, predictor, "_recall")
  per_sequence = 2 * 1 * 16 * 16 * 4                   # 2 layers of 1 head, [16, 16] float32
  monkeypatch.setattr(rules, "RESULT_BYTES", 4 * per_sequence)
  batch = sequences(5)
  with pytest.raises(InputError) as raised:
    recall(untrained, batch["inputs"], batch["positions"])
  assert str(raised.value) == (
      f"attention=True: the attention weights of 2 layers (length 16) of 5 inputs take "
      f"{5 * per_sequence:,} bytes, more than a prediction returns at once (research.predict."
      f"runs.RESULT_BYTES = {4 * per_sequence:,}): pass attention=False, or fewer sequences "
      "at once")
  assert shapes == []
  assert recall(untrained, batch["inputs"], batch["positions"], attention=False).tokens.shape \
      == (5, 4)
  with pytest.raises(InputError, match="^attention='yes' must be True or False$"):
    recall(untrained, batch["inputs"], batch["positions"], attention="yes")
