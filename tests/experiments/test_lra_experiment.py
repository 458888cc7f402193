"""The lra experiment: every task, preset and attention validates; each task's files (small
ones written here in the distributed forms) become the models' inputs; Pathfinder is
generated once and read back; bad values are named before anything is read or written; and
a tiny Retrieval run (pairs, two towers, length buckets) trains and reports test accuracy."""

import os
import pickle
import sys

import numpy as np
import pytest

from research import experiments, files
from research.data import pathfinder
from research.errors import ConfigError, InputError
from research.experiments import lra
from research.training.config import apply_overrides
from research.training.loop import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import lra as experiment  # noqa: E402

TINY_MODEL = {"model.num_layers": 1, "model.hidden_size": 16, "model.num_heads": 2,
              "model.mlp_size": 16, "model.window": 4, "model.proj_len": 8,
              "model.block_size": 4, "model.state_size": 4}


def config(arg: str, **overrides):
  """experiments/lra.py's config for `arg` with `overrides` (data.dir: Pathfinder's alone)."""
  loaded = experiment.get_config(arg)
  if "dir" not in loaded.data:
    overrides.pop("data.dir", None)
  return apply_overrides(loaded, overrides)


@pytest.mark.parametrize("task, preset", experiment.PRESETS)
def test_every_task_preset_and_attention_validates(task, preset, tmp_path):
  files = {} if task == "pathfinder" else {"data.files": str(tmp_path)}
  for attention in experiment.SELF_ATTENTIONS:
    lra.validate(config(f"task={task},preset={preset},attention={attention}",
                        **{**files, "data.dir": str(tmp_path / "data")}))
  for kind in ("lru", "s5"):
    lra.validate(config(f"task={task},preset={preset},kind={kind}",
                        **{**files, "data.dir": str(tmp_path / "data")}))
  assert not os.path.exists(tmp_path / "data")          # validating generates nothing


@pytest.mark.parametrize("arg, overrides, message", [
    ("task=image", {"data.files": "/nonexistent"},
     "config.data.files='/nonexistent' is not a directory; give the cifar-10-batches-py folder"),
    ("task=pathfinder", {"data.resolution": 48},
     "config.data.resolution=48 is not allowed; choose one of: 32, 64, 128, 256"),
    ("task=pathfinder", {"data.difficulty": "baseline"},
     "config.data.difficulty='baseline' is not allowed; choose one of: 'easy', 'intermediate', "
     "'hard'"),
    ("task=retrieval,preset=cpu,attention=local", {"data.files": ".", "model.window": 2000},
     "config.model.window=2000 must be at most the longest input, 1001 positions"),
])
def test_bad_values_are_named_before_anything_is_read(arg, overrides, message, tmp_path):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    lra.validate(config(arg, **{"data.dir": str(tmp_path / "data"), **overrides}))
  assert not os.path.exists(tmp_path / "data")


def test_the_files_a_task_reads_are_asked_for_when_it_builds_and_not_to_compile(tmp_path):
  cfg = config("task=text", **{"data.dir": str(tmp_path / "data")})
  lra.validate(cfg)                                   # --compile_only needs no data
  assert lra.placeholder_data(cfg).splits["train"]["tokens"].shape == (32, 4000)
  with pytest.raises(ConfigError, match="config.data.files='' but the text task reads its data "
                                        "from your files: give --config.data.files=DIR, DIR "
                                        "the aclImdb folder"):
    lra.load_data(cfg)


def test_path_x_is_pathfinders_preset_alone():
  with pytest.raises(ValueError, match="preset='path_x' is Pathfinder's"):
    experiment.get_config("task=image,preset=path_x")
  assert experiment.get_config("preset=path_x").data.resolution == 128


def _aan_fields(i: int) -> tuple[int, bytes, bytes]:
  """Pair i of the AAN files written here: its label (alternating) and its two text fields
  (LRA's b'…' literals): the first all "a" when linked, all "z" when not."""
  label = i % 2
  return label, b"b'" + (b"a" if label else b"z") * (i + 3) + b"'", b"b'" + b"cd" * (i + 2) + b"'"


def _aan(directory, pairs: int):
  """LRA's three AAN TSVs: label, two ids, two texts, `pairs` rows each (_aan_fields)."""
  os.makedirs(directory)
  for name in ("train", "eval", "test"):
    with open(os.path.join(directory, f"new_aan_pairs.{name}.tsv"), "wb") as f:
      for i in range(pairs):
        label, first, second = _aan_fields(i)
        f.write(b"\t".join([str(label).encode(), b"p%d" % i, b"q%d" % i, first, second]) + b"\n")


def test_each_task_reads_its_files_into_the_models_inputs(tmp_path):
  _aan(tmp_path / "aan", 6)
  retrieval = lra.load_data(config("task=retrieval,preset=cpu", **{
      "data.files": str(tmp_path / "aan"), "data.max_length": 16, "data.length_buckets": 1}))
  train = retrieval.splits["train"]
  assert train["tokens"].shape == (6, 2, 16) and retrieval.boundaries == (16,)
  for i in range(6):
    label, *fields = _aan_fields(i)
    assert train["labels"][i] == label
    for document, field in enumerate(fields):
      kept = min(len(field), 16)                       # LRA's bytes, ids byte + 1, 0 pads
      assert train["lengths"][i, document] == kept
      np.testing.assert_array_equal(train["tokens"][i, document],
                                    [byte + 1 for byte in field[:kept]] + [0] * (16 - kept))

  cifar = tmp_path / "cifar-10-batches-py"
  os.makedirs(cifar)
  rgb = np.random.default_rng(0).integers(0, 256, (10, 3072), np.uint8)
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    with open(cifar / name, "wb") as f:
      pickle.dump({b"data": rgb, b"labels": list(range(10))}, f)
  image = lra.load_data(config("task=image", **{"data.files": str(cifar)}))
  assert image.boundaries == ()
  assert {split: a["tokens"].shape for split, a in image.splits.items()} == {
      "train": (45, 1024), "val": (5, 1024), "test": (10, 1024)}
  np.testing.assert_array_equal(image.splits["test"]["lengths"], 1024)


def test_pathfinder_is_generated_once_in_lras_layout_and_read_back(tmp_path):
  cfg = config("task=pathfinder,preset=cpu", **{"data.dir": str(tmp_path / "data"),
                                                "data.examples": 40})
  assert lra.generates_data(cfg)
  data = lra.load_data(cfg)
  assert not lra.generates_data(cfg)
  assert {split: len(a["labels"]) for split, a in data.splits.items()} == {
      "train": 32, "val": 4, "test": 4}
  images, labels = pathfinder.generate(0, 40, 32, "easy")[:2]
  np.testing.assert_array_equal(data.splits["train"]["tokens"], images[:32].reshape(32, 1024))
  np.testing.assert_array_equal(data.splits["test"]["labels"], labels[36:])
  folder = os.path.join(lra.generated_root(cfg), "pathfinder32", "curv_baseline")
  assert sorted(os.listdir(folder)) == ["generated.json", "imgs", "metadata"]


def test_generated_pathfinder_is_read_under_its_lock_and_whole(tmp_path, capsys):
  cfg = config("task=pathfinder,preset=cpu", **{"data.dir": str(tmp_path / "data"),
                                                "data.examples": 20})
  root = lra.generated_root(cfg)
  folder, lock = (pathfinder.release_folder(root, 32, "easy"),
                  pathfinder.generation_lock(root, 32, "easy"))
  lra.load_data(cfg)
  assert sorted(os.listdir(os.path.dirname(folder))) == ["curv_baseline", "curv_baseline.lock"]
  with files.locked(lock, "a test reading", shared=True):      # readers share it
    assert len(lra.load_data(cfg).splits["train"]["labels"]) == 16
  assert capsys.readouterr().err == ""
  open(os.path.join(folder, "imgs", "0", "sample_3.png"), "wb").close()    # emptied since
  with pytest.raises(InputError) as error:
    lra.load_data(cfg)
  assert str(error.value) == (f"{folder}: 19 readable images, its generated.json records 20 "
                              f"(generated images, changed since: delete {folder} to generate "
                              "them again)")


@pytest.mark.slow
def test_a_tiny_retrieval_run_trains_two_towers_in_buckets_and_reports_test_accuracy(tmp_path):
  _aan(tmp_path / "aan", 48)
  cfg = config("task=retrieval,preset=cpu", **{
      "data.files": str(tmp_path / "aan"), "data.max_length": 64, "data.length_buckets": 2,
      **TINY_MODEL, "train.batch_size": 8, "train.num_steps": 30, "train.warmup_steps": 5,
      "train.learning_rate": 3e-3, "train.log_every": 10, "train.eval_every": 30,
      "train.checkpoint_every": 30})
  final = train_and_evaluate(cfg, str(tmp_path / "run"), experiments.get("lra"))
  assert 1 <= final["perf/train_step_traces"] <= 2           # one step per bucket
  correct = final["test/accuracy"] * 48
  assert correct == pytest.approx(round(correct), abs=1e-4)   # the whole test split, scored
  assert final["eval/loss"] < np.log(2)      # the first text says the label: learnt
