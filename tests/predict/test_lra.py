"""research.predict.lra on a tiny Retrieval run (TSVs written here; 1 layer, 2 steps), restored,
and untrained Text, Image and Pathfinder runs: restored answers equal the loop's own; labels
and probabilities those of a direct model.apply on the tokens the experiment's own readers
make of the same input (files written in the data sets' forms, Pathfinder's generated);
attention rows that are distributions over the real keys (a pair's two documents each their
own); batches that answer as one; and the refusals."""

import dataclasses
import os
import pickle

import jax
import numpy as np
import pytest

from research.data import aan, imdb, pathfinder
from research.errors import InputError
from research.experiments import lra as experiment
from research.predict import lra as predictor
from research.predict import runs as rules
from research.predict.lra import classify_lra, encode_lra_inputs

from . import trained

pytestmark = pytest.mark.xdist_group("predict_lra")   # one worker: its trained fixtures run once

TINY = {"model.num_layers": 1, "model.hidden_size": 8, "model.num_heads": 2,
        "model.mlp_size": 8, "model.window": 4, "model.proj_len": 8, "model.block_size": 4,
        "model.state_size": 4, "train.batch_size": 8, "train.num_steps": 2,
        "train.warmup_steps": 1, "train.log_every": 1, "train.eval_every": 2,
        "train.checkpoint_every": 2}
# Retrieval's documents: a paper's text, and the TSV field LRA's release writes for it.
PAPERS = [("Attention is all\nyou need", b"b'Attention is all\\nyou need'"),
          ("Long Range Arena", b"b'Long Range Arena'"),
          ("d\xe9j\xe0 vu", b"b'd\\xc3\\xa9j\\xc3\\xa0 vu'"),
          ("S" * 80, b"b'" + b"S" * 80 + b"'")]


def tiny_config(task: str, **overrides):
  return trained.config("lra", f"task={task},preset=cpu", {**TINY, **overrides})


def forward(run, tokens, lengths):
  """The model's logits on tokens: model.apply, nothing of the predictor's."""
  return jax.jit(run.model.apply)({"params": run.params}, np.asarray(tokens, np.int32),
                                  np.asarray(lengths, np.int32))


def assert_answers_model_apply(result, run, tokens, lengths):
  logits = forward(run, tokens, lengths)
  np.testing.assert_array_equal(result.labels, np.argmax(logits, -1))
  np.testing.assert_allclose(result.probabilities, jax.nn.softmax(logits), rtol=1e-5,
                             atol=1e-7)
  names = predictor.CLASSES[run.config.data.task]
  assert result.classes == [names[label] for label in np.argmax(logits, -1)]


def assert_distributions_over_real_keys(weights, lengths):
  """weights [B, H, S, S]: each row sums to 1 over the keys t < length, 0 beyond."""
  for row, length in enumerate(lengths):
    np.testing.assert_allclose(weights[row, :, :, :length].sum(-1), 1.0, rtol=1e-5)
    assert np.all(weights[row, :, :, length:] == 0)


# ---- Pathfinder: generated images, as the run's data pipeline reads them back ------------

@pytest.fixture(scope="session")
def pathfinder_run(tmp_path_factory):
  """(an untrained run with its initial parameters, its config's test split: generated
  images written as LRA's PNGs and read back)."""
  config = tiny_config("pathfinder", **{
      "data.examples": 40, "data.dir": str(tmp_path_factory.mktemp("lra_pathfinder"))})
  return trained.untrained(config, initialised=True), experiment.read_splits(config)["test"]


@pytest.mark.slow
def test_generated_images_are_read_as_the_pipeline_reads_them_and_answered_as_model_apply(
    pathfinder_run):
  run, test = pathfinder_run
  images, _ = pathfinder.generate(run.config.data.seed, 40, 32, "easy")   # the test split: 36…
  np.testing.assert_array_equal(encode_lra_inputs(run, images[36:]).tokens, test["tokens"])
  result = classify_lra(run, images[36:])
  assert_answers_model_apply(result, run, test["tokens"], test["lengths"])
  np.testing.assert_array_equal(result.lengths, [1024] * 4)
  (weights,) = result.attention                     # mean pooling: no CLS position
  assert weights.shape == (4, 2, 1024, 1024)
  assert_distributions_over_real_keys(weights, result.lengths)


# ---- Retrieval: a trained run of pairs, restored ------------------------------------------

def write_aan(directory, pairs: list[tuple[bytes, bytes]]):
  """LRA's three AAN TSVs, each the same `pairs` (labels alternating 0, 1)."""
  os.makedirs(directory)
  for name in ("train", "eval", "test"):
    with open(os.path.join(directory, f"new_aan_pairs.{name}.tsv"), "wb") as f:
      for i, (first, second) in enumerate(pairs):
        f.write(b"\t".join([b"%d" % (i % 2), b"p%d" % i, b"q%d" % i, first, second]) + b"\n")


@pytest.fixture(scope="session")
def retrieval_runs(tmp_path_factory):
  """(restored run, the same with the loop's final parameters, the TSVs' folder)."""
  root = tmp_path_factory.mktemp("lra_retrieval")
  fields = [field for _, field in PAPERS]
  write_aan(root / "aan", [(a, b) for a in fields for b in fields])       # 16 pairs
  config = tiny_config("retrieval", **{"data.files": str(root / "aan"), "data.max_length": 64,
                                       "data.length_buckets": 1})
  return (*trained.restored_and_final(config, str(root / "run"), report=False), root / "aan")


@pytest.mark.slow
def test_a_restored_retrieval_run_answers_pairs_as_model_apply_on_the_tsvs_tokens(
    retrieval_runs, monkeypatch):
  run, final, files = retrieval_runs
  texts = [text for text, _ in PAPERS]
  pairs = [(a, b) for a in texts for b in texts]
  result = classify_lra(run, pairs)
  trained.assert_bitwise_equal(result, classify_lra(final, pairs))
  test = aan.read_split(files, "test", 64)            # the same pairs, as the TSVs hold them
  encoded = encode_lra_inputs(run, pairs)
  np.testing.assert_array_equal(encoded.tokens, test["tokens"])
  np.testing.assert_array_equal(encoded.lengths, test["lengths"])
  fields = [[field for _, field in PAPERS][i] for i in (2, 0)]
  np.testing.assert_array_equal(encode_lra_inputs(run, [fields]).tokens,    # fields as given
                                encode_lra_inputs(run, [(texts[2], texts[0])]).tokens)
  assert_answers_model_apply(result, run, test["tokens"], test["lengths"])
  (weights,) = result.attention                       # CLS pooling: position 0 the CLS
  assert weights.shape == (16, 2, 2, 65, 65)
  for document in (0, 1):
    assert_distributions_over_real_keys(weights[:, document], result.lengths[:, document] + 1)
  # Pair (a, b) reversed is (b, a): each document's weights move with it.
  swapped = classify_lra(run, [pair[::-1] for pair in pairs]).attention[0]
  np.testing.assert_allclose(swapped[:, ::-1], weights, rtol=1e-5, atol=1e-7)
  # 16 pairs in calls of 8, then of 3 (MAX_ROWS, the last padded): the same answers.
  shapes = trained.recording(monkeypatch, predictor, "_classify")
  monkeypatch.setattr(rules, "MAX_ROWS", 3)
  batched = classify_lra(run, iter(pairs))
  assert shapes == [(3, 2, 64)] * 6
  np.testing.assert_array_equal(batched.labels, result.labels)
  np.testing.assert_allclose(batched.probabilities, result.probabilities, rtol=1e-6)
  np.testing.assert_allclose(batched.attention[0], weights, rtol=1e-6, atol=1e-7)


# ---- Text and Image: untrained runs, the readers' tokens ----------------------------------

@pytest.fixture(scope="session")
def text_run():
  return trained.untrained(tiny_config("text", **{"data.files": "/", "data.max_length": 100}),
                           initialised=True)


@pytest.fixture(scope="session")
def image_run():
  return trained.untrained(tiny_config("image", **{"data.files": "/"}), initialised=True)


REVIEWS = [b"  A fine film.\n", "d\xe9j\xe0 vu, <br />again", "x" * 150]


@pytest.mark.slow
def test_reviews_are_read_as_imdbs_reader_reads_them_and_answered_as_model_apply(text_run,
                                                                                 tmp_path):
  for name, review in zip(("0_1.txt", "1_1.txt", "2_1.txt"), REVIEWS, strict=True):
    (tmp_path / "test" / "neg").mkdir(parents=True, exist_ok=True)
    (tmp_path / "test" / "neg" / name).write_bytes(
        review.encode() if isinstance(review, str) else review)
  (tmp_path / "test" / "pos").mkdir()
  (tmp_path / "test" / "pos" / "0_9.txt").write_bytes(b"the end")
  split = imdb.read_split(tmp_path, "test", 100)
  result = classify_lra(text_run, [*REVIEWS, "the end"])
  encoded = encode_lra_inputs(text_run, [*REVIEWS, "the end"])
  assert encoded.tokens.shape == (4, 100)     # 100 bytes kept: rounded up to 128, capped
  np.testing.assert_array_equal(encoded.tokens, split["tokens"])
  np.testing.assert_array_equal(result.lengths, split["lengths"])
  assert result.lengths[2] == 100                 # 150 bytes, cut as the pipeline cuts
  assert_answers_model_apply(result, text_run, split["tokens"], split["lengths"])
  for weights in result.attention:            # CLS pooling
    assert weights.shape == (4, 2, 101, 101)
    assert_distributions_over_real_keys(weights, result.lengths + 1)
  short = encode_lra_inputs(text_run, ["the end"])
  assert short.tokens.shape == (1, 64)        # one bucket of 64 bytes
  np.testing.assert_array_equal(short.tokens, split["tokens"][3:, :64])


@pytest.mark.slow
def test_pictures_are_read_as_cifars_reader_reads_them_and_answered_as_model_apply(image_run,
                                                                                  tmp_path):
  rgb = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), np.uint8)
  with open(tmp_path / "test_batch", "wb") as f:       # CIFAR-10's form: channel-planar rows
    pickle.dump({b"data": rgb.transpose(0, 3, 1, 2).reshape(3, 3072),
                 b"labels": [0, 1, 2]}, f, protocol=2)
  test = experiment.cifar10.read_split(tmp_path, "test")
  encoded = encode_lra_inputs(image_run, rgb)
  np.testing.assert_array_equal(encoded.tokens, test["tokens"])
  grey = test["tokens"].reshape(3, 32, 32)
  np.testing.assert_array_equal(encode_lra_inputs(image_run, grey).tokens, test["tokens"])
  result = classify_lra(image_run, rgb.astype(np.int64), attention=False)
  assert result.attention is None
  assert_answers_model_apply(result, image_run, test["tokens"], np.full(3, 1024))


# ---- Refusals ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def untrained_runs(tmp_path_factory):
  """An unwritten run of each task, without parameters (for what is refused first)."""
  files = str(tmp_path_factory.mktemp("lra_files"))
  return {task: trained.untrained(tiny_config(task, **overrides)) for task, overrides in (
      ("text", {"data.files": files, "data.max_length": 100}),
      ("retrieval", {"data.files": files, "data.max_length": 100}),
      ("image", {"data.files": files}), ("pathfinder", {"data.dir": files}))}


PICTURE = np.zeros((1, 32, 32, 3), np.uint8)


@pytest.mark.parametrize("task, inputs, message", [
    ("text", [], "no inputs to classify: give a list of reviews (the text task's run takes"),
    ("text", "a review", "inputs must be a list of reviews, got one string 'a review': give "
                         "[review]"),
    ("text", 7, "inputs must be a list of reviews, got a int, which is not iterable"),
    ("text", ["fine", 7], "inputs[1] is a int, not a str or bytes"),
    ("text", ["fine", " \n\t"], "inputs[1] is empty or whitespace alone: ' \\n\\t'"),
    ("text", [b"\xff\xfe"], "inputs[0] is not UTF-8 text (invalid start byte at byte 0)"),
    ("text", ["a \ud800"], "inputs[0] holds '\\ud800' at character 2, which UTF-8 cannot"),
    ("retrieval", ["one paper"], "inputs[0] must be a pair (document, document), got one str "
                                 "'one paper'"),
    ("retrieval", [("a", "b", "c")], "inputs[0] must be a pair (document, document), got a "
                                     "tuple of 3"),
    ("retrieval", [{"a": 1}], "inputs[0] must be a pair (document, document), got a dict"),
    ("retrieval", [("a", "")], "inputs[0][1] is empty: give the paper's text"),
    ("retrieval", [("a", None)], "inputs[0][1] is a NoneType, not a str or bytes"),
    ("image", PICTURE[:, :16], "inputs of shape [1, 16, 32, 3]: the image task's run takes "
                               "ints 0–255 [B, 32, 32, 3] (RGB pictures"),
    ("image", PICTURE[:0], "inputs of shape [0, 32, 32, 3]"),
    ("image", PICTURE / 255, "inputs of dtype float64: the image task's run takes ints 0–255"),
    ("image", PICTURE.astype(np.int16) + np.eye(32, dtype=np.int16)[None, :, :, None] * 256,
     "inputs[0, 0, 0, 0] is 256: the image task's run takes ints 0–255"),
    ("image", [[[1, 2]], [[3]]], "inputs is not an array ("),
    ("pathfinder", np.zeros((2, 64, 64), np.uint8), "inputs of shape [2, 64, 64]: the "
                                                    "pathfinder task's run takes ints 0–255 "
                                                    "[B, 32, 32] (grey Pathfinder images)"),
    ("pathfinder", np.full((1, 32, 32), -1), "inputs[0, 0, 0] is -1"),
    ("pathfinder", PICTURE, "inputs of shape [1, 32, 32, 3]"),
])
def test_input_the_run_cannot_take_is_refused_in_one_line(untrained_runs, task, inputs,
                                                          message):
  with pytest.raises(InputError) as raised:
    classify_lra(untrained_runs[task], inputs)
  assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_run_of_another_experiment_and_a_bad_attention_are_refused(untrained_runs):
  run = untrained_runs["pathfinder"]
  config = run.config.copy_and_resolve_references()
  config.experiment = "listops"
  with pytest.raises(InputError, match="^classify_lra answers lra runs; the run in .* is a "
                                       "listops run$"):
    classify_lra(dataclasses.replace(run, config=config), PICTURE[:, :, :, 0])
  with pytest.raises(InputError, match="^attention='yes' must be True or False$"):
    classify_lra(run, PICTURE[:, :, :, 0], attention="yes")


def test_attention_weights_beyond_the_bound_are_refused_before_anything_runs(image_run,
                                                                             monkeypatch):
  """1 layer × 2 heads × 1025² float32 a picture (CLS pooling): 5 pictures beyond a bound of
  4 pictures' worth, refused before any call."""
  calls = trained.recording(monkeypatch, predictor, "_classify")
  per_picture = 2 * 1025 * 1025 * 4
  monkeypatch.setattr(rules, "RESULT_BYTES", 4 * per_picture)
  with pytest.raises(InputError) as raised:
    classify_lra(image_run, np.zeros((5, 32, 32), np.uint8))
  assert str(raised.value) == (
      f"attention=True: the attention weights of 1 layer (inputs of 1024 tokens) of 5 inputs "
      f"take {5 * per_picture:,} bytes, more than a prediction returns at once "
      f"(research.predict.runs.RESULT_BYTES = {4 * per_picture:,}): pass attention=False, or "
      "fewer inputs at once")
  assert calls == []
