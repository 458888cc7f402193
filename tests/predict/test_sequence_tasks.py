"""research.predict.sequence_tasks: a tiny RNN trained 2 steps on the adding problem answers,
once restored, as the loop's final parameters do and as model.apply does, at its length and
another; a copy-task RNN (initial parameters) its classes and probabilities, in batches of
one shape as in one call; the refusals."""

import jax
import numpy as np
import pytest

from research.data import sequence_tasks as data
from research.errors import InputError
from research.predict import runs as rules
from research.predict import sequence_tasks as predictor
from research.predict.sequence_tasks import predict_sequences

from . import trained

ADDING = {"data.length": 12, "data.eval_examples": 8, "model.hidden_size": 4,
          "train.batch_size": 8, "train.num_steps": 2, "train.warmup_steps": 1,
          "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2}
COPY = {"data.length": 4, "data.num_items": 3, "data.num_symbols": 4, "model.hidden_size": 4}


def config(variant: str, overrides: dict):
  return trained.config("sequence_tasks", variant, overrides)


@pytest.fixture(scope="module")
def adding_runs(tmp_path_factory):
  """(restored adding-problem RNN, the same with the loop's final parameters)."""
  return trained.restored_and_final(config("task=adding,model=rnn", ADDING),
                                    str(tmp_path_factory.mktemp("adding") / "run"))


def apply(run, inputs):
  return jax.jit(run.model.apply)({"params": run.params}, inputs)


@pytest.mark.slow
def test_a_restored_run_sums_as_the_loop_ended_and_as_model_apply(adding_runs):
  run, final = adding_runs
  for length in (12, 7):                   # its length, and another: an RNN takes any
    inputs = data.adding_problem(np.random.default_rng(length), 3, length=length)["inputs"]
    answers = predict_sequences(run, inputs.astype(np.float64))
    trained.assert_bitwise_equal(answers, predict_sequences(final, inputs))
    outputs = apply(run, inputs)                                                 # [3, 1]
    np.testing.assert_allclose(answers.outputs, outputs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(answers.predictions, answers.outputs[:, 0])
    assert answers.probabilities is None and answers.predictions.dtype == np.float32


def copy_inputs(batch: int, seed: int = 1) -> np.ndarray:
  return data.copy_memory(np.random.default_rng(seed), batch, length=4, num_symbols=4,
                          num_items=3)["inputs"]                                # [B, 11]


@pytest.mark.slow
def test_a_copy_run_gives_each_positions_class_and_probabilities():
  run = trained.untrained(config("task=copy,model=rnn", COPY), initialised=True)
  inputs = copy_inputs(5)
  answers = predict_sequences(run, inputs)
  logits = apply(run, inputs)                                                   # [5, 11, 4]
  np.testing.assert_allclose(answers.outputs, logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(answers.predictions, np.argmax(answers.outputs, -1))
  np.testing.assert_allclose(np.log(answers.probabilities),
                             logits - np.log(np.exp(logits).sum(-1, keepdims=True)), atol=1e-5)


COPY_TAKES = "a run of task copy takes ints [B, L] with tokens 0 … 5, L = 11 (model.kind=" \
             "transformer takes the length it was trained with)"
ADDING_TAKES = "a run of task adding takes floats [B, L, 2] (value, marker), any L ≥ 1 " \
               "(model.kind=rnn; trained with L = 12)"


@pytest.mark.parametrize("task, inputs, message", [
    ("copy", copy_inputs(2).astype(np.float32), f"inputs of dtype float32: {COPY_TAKES}"),
    ("copy", copy_inputs(2) > 0, "inputs of dtype bool: "),
    ("copy", copy_inputs(2)[:, :10], f"inputs of shape [2, 10]: {COPY_TAKES}"),
    ("copy", copy_inputs(2)[:, :, None], "inputs of shape [2, 11, 1]: "),
    ("copy", copy_inputs(2)[:0], "inputs of shape [0, 11]: "),
    ("copy", np.where(np.arange(11) == 6, 6, copy_inputs(2)), f"inputs[0, 6] is 6: {COPY_TAKES}"),
    ("copy", np.where(np.arange(11) == 6, -1, copy_inputs(2)), "inputs[0, 6] is -1: "),
    ("copy", [[1, 2], [3]], "inputs is not an array ("),
    ("adding", np.ones((2, 12, 2), np.int32), f"inputs of dtype int32: {ADDING_TAKES}"),
    ("adding", np.ones((2, 12, 3)), "inputs of shape [2, 12, 3]: "),
    ("adding", np.ones((2, 0, 2)), "inputs of shape [2, 0, 2]: "),
    ("adding", np.where(np.arange(2) == 1, np.nan, np.ones((2, 12, 2))),
     f"inputs[0, 0, 1] is nan: {ADDING_TAKES}, finite in float32"),
    ("adding", np.full((1, 12, 2), 1e300), "inputs[0, 0, 0] is 1e+300: "),
])
def test_input_the_model_cannot_take_is_refused_naming_it(task, inputs, message):
  run = trained.untrained(config(f"task={task},model=transformer", COPY) if task == "copy"
                          else config("task=adding,model=rnn", ADDING))
  with pytest.raises(InputError) as raised:
    predict_sequences(run, inputs)
  assert message in str(raised.value)


# ---- Bounded memory: batches of one shape ----------------------------------------------------

@pytest.mark.slow
def test_many_inputs_go_through_in_batches_of_one_shape_as_in_one(monkeypatch):
  """A copy-task RNN (train.batch_size 64 by default): 1 000 inputs in 16 calls of 64 (the
  last padded) answer as one call of 1 000; 7 in 4 calls of 2 (MAX_ROWS forced) as in calls
  of 64 (to float32 rounding: XLA's CPU products differ in their last bits between shapes)."""
  run = trained.untrained(config("task=copy,model=rnn", COPY), initialised=True)
  shapes, predict_batch = [], predictor._predict

  def predict_recorded(model, params, inputs, **options):
    if isinstance(inputs, np.ndarray):          # not jax.eval_shape's tracing
      shapes.append(inputs.shape)
    return predict_batch(model, params, inputs, **options)

  monkeypatch.setattr(predictor, "_predict", predict_recorded)
  inputs = copy_inputs(1000, seed=2)
  answers = predict_sequences(run, inputs)
  assert run.config.train.batch_size == 64 and shapes == [(64, 11)] * 16
  assert answers.predictions.shape == (1000, 11) and answers.outputs.shape == (1000, 11, 4)
  outputs = apply(run, inputs)                                           # one call of 1 000
  np.testing.assert_allclose(answers.outputs, outputs, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(answers.predictions, np.argmax(outputs, -1))
  shapes.clear()
  monkeypatch.setattr(rules, "MAX_ROWS", 2)
  few = predict_sequences(run, inputs[:7])
  assert shapes == [(2, 11)] * 4
  np.testing.assert_array_equal(few.predictions, answers.predictions[:7])
  np.testing.assert_allclose(few.outputs, answers.outputs[:7], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(few.probabilities, answers.probabilities[:7], rtol=1e-6)
