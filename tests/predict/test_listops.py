"""research.predict.listops on a tiny listops run (2 layers, 2 steps): restored answers equal
the loop's own, labels the argmax of model.apply, attention rows that are distributions over
the real keys, the data pipeline's token ids, and the refusals; batches of one shape answer as one batch,
attention weights beyond RESULT_BYTES refused up front."""

import dataclasses

import jax
import numpy as np
import pytest

from research.data import listops as listops_data
from research.errors import InputError
from research.experiments import listops as experiment
from research.predict import listops as predictor
from research.predict import runs as rules
from research.predict.listops import classify, encode_expressions

from . import trained

pytestmark = pytest.mark.xdist_group("predict_listops")   # one worker: its trained fixtures run once

TINY = {"data.min_tree_length": 8, "data.max_tree_length": 60, "data.train_examples": 16,
        "data.eval_examples": 8, "data.test_examples": 8, "data.max_length": 64,
        "data.length_buckets": 1, "model.num_layers": 2, "model.hidden_size": 8,
        "model.num_heads": 2, "model.mlp_size": 16, "train.batch_size": 8,
        "train.num_steps": 2, "train.warmup_steps": 1, "train.log_every": 1,
        "train.eval_every": 2, "train.checkpoint_every": 2}
EXPRESSIONS = ["( ( ( [MAX 2 ) 9 ) ] )", "[SM 4 [MIN 7 3 ] 8 [MED 1 5 6 ] ]", "7"]


def bracketed(tree) -> str:
  """The tree's bracketed text, "[MAX 2 9 [MIN 4 7 ] 0 ]" (LRA's without the parentheses)."""
  if isinstance(tree, int):
    return str(tree)
  operator, arguments = tree
  return " ".join([operator, *map(bracketed, arguments), "]"])


def tiny_config(data_dir: str):
  return trained.config("listops", "preset=cpu", {**TINY, "data.dir": data_dir})


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def untrained():
  """A run of the tiny config, untrained and unwritten (its data never generated)."""
  return trained.untrained(tiny_config("unused"))


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def runs(tmp_path_factory):
  """(restored run, the same with the parameters the loop ended with)."""
  root = tmp_path_factory.mktemp("listops")
  config = tiny_config(str(root / "data"))
  experiment.split_files(config)    # the data first: the loop then compiles no placeholder step
  return trained.restored_and_final(config, str(root / "run"))


@pytest.mark.slow
def test_a_restored_run_classifies_as_the_loop_ended_and_as_model_apply(runs):
  run, final = runs
  result = classify(run, EXPRESSIONS)
  trained.assert_bitwise_equal(result, classify(final, EXPRESSIONS))
  assert result.tokens == [["MAX", "2", "9"], "SM 4 MIN 7 3 8 MED 1 5 6".split(), ["7"]]
  np.testing.assert_array_equal(result.lengths, [3, 10, 1])
  ids = np.zeros((3, 64), np.int32)            # padded to a multiple of 64, as the buckets are
  for row, tokens in enumerate(result.tokens):
    ids[row, :len(tokens)] = [experiment.token_ids(False)[t] for t in tokens]
  logits = jax.jit(run.model.apply)({"params": run.params}, ids, result.lengths)
  np.testing.assert_array_equal(result.labels, np.argmax(logits, -1))
  np.testing.assert_allclose(result.probabilities, jax.nn.softmax(logits), rtol=1e-5)
  # Each layer's weights (CLS at position 0): rows are distributions over the real keys.
  assert len(result.attention) == 2
  for weights in result.attention:
    assert weights.shape == (3, 2, 65, 65)
    for row, length in enumerate(result.lengths + 1):
      np.testing.assert_allclose(weights[row, :, :, :length].sum(-1), 1.0, rtol=1e-5)
      assert np.all(weights[row, :, :, length:] == 0)


def test_generated_expressions_read_as_the_data_pipeline_reads_them(untrained):
  run = untrained
  (trees,) = listops_data.draw_split_trees(5, (6,), (8, 60))
  sources = [listops_data.to_source(tree) for tree in trees]
  pipeline = experiment.encode([(s, 0) for s in sources], "generated", False, 64)
  encoded = encode_expressions(run, sources)
  width = encoded.ids.shape[1]
  np.testing.assert_array_equal(encoded.ids, pipeline["tokens"][:, :width])
  assert not pipeline["tokens"][:, width:].any()
  np.testing.assert_array_equal(encoded.lengths, pipeline["lengths"])
  # The bracketed tree alone reads the same tokens (LRA's tokenizer drops the brackets).
  np.testing.assert_array_equal(encode_expressions(run, list(map(bracketed, trees))).ids,
                                encoded.ids)


@pytest.mark.parametrize("expressions, message", [
    ([], "no expressions to classify"),
    ("[MAX 2 9 ]", "expressions must be a list of ListOps expressions, got one string "
                   "'[MAX 2 9 ]': give [expression]"),
    (b"[MAX 2 9 ]", "got one bytes b'[MAX 2 9 ]': give [expression]"),
    (7, "expressions must be a list of ListOps expressions, got a int, which is not iterable"),
    (np.array("[MAX 2 9 ]"), "got a ndarray, which is not iterable"),
    (["[MAX 2 9 ]", 7], "expressions[1] is a int, not a string"),
    (["[MAX 2 9 ]", "( )"], "expressions[1] has no ListOps token"),
    (["[MAX 2 ADD 9 ]"], "expressions[0]: token 2 (from 0), 'ADD', is not in the run's "
                         "vocabulary (config.data.brackets=False: 0 1 2"),
    (["[MAX 2 19 ]"], "token 2 (from 0), '19', is not"),
    (["[MAX 2, 9 ]"], "expressions[0] holds ',' at character 6"),
    (["7", "[SM " + "1 " * 64 + "]"], "expressions[1] has 65 tokens, more than the run's "
                                      "model takes (config.data.max_length=64)"),
])
def test_input_the_model_cannot_take_is_refused_naming_it(untrained, expressions, message):
  with pytest.raises(InputError) as raised:
    classify(untrained, expressions)
  assert message in str(raised.value)


def test_a_run_of_another_experiment_is_refused(untrained):
  config = untrained.config.copy_and_resolve_references()
  config.experiment = "char_lm"
  with pytest.raises(InputError, match="classify answers listops runs; the run in .* is a "
                                       "char_lm run"):
    classify(dataclasses.replace(untrained, config=config), EXPRESSIONS)


# ---- Bounded memory: batches of one shape, attention weights refused beyond the bound -------

@pytest.fixture(scope="session")
def initialised():
  """A run of the tiny config with its model's initial parameters (train.batch_size 8)."""
  return trained.untrained(tiny_config("unused"), initialised=True)






@pytest.mark.slow
def test_expressions_in_batches_answer_as_in_one_batch(initialised, monkeypatch):
  """7 expressions: one call of 7 (within train.batch_size 8), then 4 calls of 2 (MAX_ROWS
  forced to 2, the last padded), the same answers and attention; a generator, a tuple and a
  numpy array of the expressions answer as the list does."""
  expressions = EXPRESSIONS * 2 + ["[MAX 1 [MIN 2 3 ] ]"]
  shapes = trained.recording(monkeypatch, predictor, "_classify")
  whole = classify(initialised, expressions)
  assert shapes == [(7, 64)]
  monkeypatch.setattr(rules, "MAX_ROWS", 2)
  shapes.clear()
  batched = classify(initialised, expressions)
  assert shapes == [(2, 64)] * 4
  assert batched.tokens == whole.tokens
  np.testing.assert_array_equal(batched.labels, whole.labels)
  np.testing.assert_array_equal(batched.lengths, whole.lengths)
  np.testing.assert_allclose(batched.probabilities, whole.probabilities, rtol=1e-6)
  for got, expected in zip(batched.attention, whole.attention, strict=True):
    assert got.shape == expected.shape == (7, 2, 65, 65)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
  for given in ((e for e in expressions), tuple(expressions), np.array(expressions)):
    trained.assert_bitwise_equal(classify(initialised, given), batched)


@pytest.mark.slow
def test_many_expressions_go_through_in_bounded_batches(initialised, monkeypatch):
  """3 000 expressions without attention: calls of train.batch_size rows (1024 here, the
  last padded), each expression's answer that of the expression alone."""
  expressions = [EXPRESSIONS[i % 3] for i in range(3000)]
  shapes = trained.recording(monkeypatch, predictor, "_classify")
  result = classify(trained.with_batch_size(initialised, 1024), expressions, attention=False)
  assert shapes == [(1024, 64)] * 3 and result.attention is None
  assert result.labels.shape == (3000,) and result.probabilities.shape == (3000, 10)
  alone = classify(initialised, EXPRESSIONS, attention=False)
  np.testing.assert_array_equal(result.labels, np.tile(alone.labels, 1000))
  np.testing.assert_allclose(result.probabilities, np.tile(alone.probabilities, (1000, 1)),
                             rtol=1e-5)


def test_attention_weights_beyond_the_bound_are_refused_before_anything_runs(initialised,
                                                                             monkeypatch):
  """100 000 expressions: 2 layers × 2 heads × 65² float32 each, 6.76 GB, beyond RESULT_BYTES;
  refused naming attention=True, the size and the bound, before any call."""
  shapes = trained.recording(monkeypatch, predictor, "_classify")
  with pytest.raises(InputError) as raised:
    classify(initialised, ["[MAX 2 9 ]"] * 100_000)
  assert str(raised.value) == (
      "attention=True: the attention weights of 2 layers (padded length 64) of 100000 inputs "
      f"take {100_000 * 2 * 2 * 65 * 65 * 4:,} bytes, more than a prediction returns at once "
      f"(research.predict.runs.RESULT_BYTES = {rules.RESULT_BYTES:,}): pass attention=False, "
      "or fewer expressions at once")
  monkeypatch.setattr(rules, "RESULT_BYTES", 3 * 2 * 2 * 65 * 65 * 4)    # 3 expressions' worth
  assert len(classify(initialised, EXPRESSIONS).attention) == 2
  with pytest.raises(InputError, match="^attention=True: .* of 4 inputs take 270,400 bytes"):
    classify(initialised, EXPRESSIONS + ["7"])
  assert shapes == [(3, 64)]
  with pytest.raises(InputError, match="^attention=1 must be True or False$"):
    classify(initialised, EXPRESSIONS, attention=1)
