"""research.predict.mqar on a tiny mqar run (2 steps): restored answers equal the loop's own
and the argmax of the model's whole-sequence logits at the positions, attention rows are
causal distributions, the batches join seamlessly, and the refusals."""

import jax
import numpy as np
import pytest

from research.data.mqar import multi_query_recall
from research.errors import InputError
from research.predict import mqar as predictor
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
  monkeypatch.setattr(predictor, "BATCH", 2)               # 5 sequences in 3 calls
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
    (np.zeros((2, 16), int), np.zeros((3, 4), int), r"positions must be \[2, K ≥ 1\]"),
])
def test_bad_input_is_refused_in_one_line(untrained, inputs, positions, message):
  with pytest.raises(InputError, match=message) as error:
    recall(untrained, inputs, positions)
  assert "\n" not in str(error.value)
