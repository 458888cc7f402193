"""The listops experiment: presets and variants, validation errors, the data written once and
read back (ours or LRA's file names), length buckets, and a tiny run end to end."""

import os
import sys
import threading
import time

import numpy as np
import pytest

from research import experiments
from research.data import listops as listops_data
from research.errors import InputError
from research.experiments import listops
from research.training.config import ConfigError, apply_overrides
from research.training.loop import train_and_evaluate
from research.training.train_step import learning_rate_schedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import listops as experiment  # noqa: E402

TINY = {"data.min_tree_length": 8, "data.max_tree_length": 150, "data.train_examples": 256,
        "data.eval_examples": 32, "data.test_examples": 48, "data.max_length": 128,
        "data.length_buckets": 2, "model.num_layers": 1, "model.hidden_size": 16,
        "model.num_heads": 2, "model.mlp_size": 32, "model.window": 4, "model.proj_len": 8,
        "train.batch_size": 16, "train.num_steps": 40, "train.warmup_steps": 10,
        "train.learning_rate": 3e-3, "train.log_every": 10, "train.eval_every": 20,
        "train.checkpoint_every": 20}


def tiny_config(tmp_path, arg="preset=cpu", **overrides):
  return apply_overrides(experiment.get_config(arg),
                         {**TINY, "data.dir": str(tmp_path / "data"), **overrides})


@pytest.mark.parametrize("preset", experiment.PRESETS)
@pytest.mark.parametrize("attention", experiment.SELF_ATTENTIONS)
def test_every_preset_and_attention_validates(preset, attention, tmp_path):
  config = experiment.get_config(f"preset={preset},attention={attention}")
  listops.validate(config)
  assert config.model.attention == attention


def test_the_lra_preset_is_lras_transformer_base_and_its_data():
  config = experiment.get_config()
  m, t, d = config.model, config.train, config.data
  assert (m.num_layers, m.hidden_size, m.num_heads, m.mlp_size, m.pooling, m.norm) == (
      6, 512, 8, 2048, "cls", "post")
  assert (t.batch_size, t.num_steps, t.warmup_steps, t.weight_decay, t.adam_b2) == (
      32, 5000, 1000, 0.1, 0.98)
  assert (d.min_tree_length, d.max_tree_length, d.max_length) == (500, 2000, 2000)
  assert listops.generated_directory(config) == os.path.join("data", "listops")
  # LRA: 0.05 · min(1, step / 1000) · rsqrt(max(step, 1000)) ("linear_warmup * rsqrt_decay")
  schedule = learning_rate_schedule(t)
  for step in (1, 500, 1000, 1500, 5000):
    lra = 0.05 * min(1.0, step / 1000) / np.sqrt(max(step, 1000))
    assert float(schedule(step)) == pytest.approx(lra, rel=1e-5)


def test_the_s5_preset_is_s5s_listops_command():
  """lindermanlab/S5 bin/run_experiments/run_lra_listops.sh: --d_model=128 --n_layers=8
  --bidirectional=True --blocks=8 --ssm_size_base=16 --activation_fn=half_glu2 --bsz=50
  --epochs=40 --lr_factor=3 --ssm_lr_base=0.001 --weight_decay=0.04 --p_dropout=0
  --warmup_end=1 (epochs of LRA's 96 000 trees), its run_train.py's prenorm=True and mean
  pooling; LayerNorm in place of its --batchnorm=True."""
  config = experiment.get_config("preset=s5")
  m, t = config.model, config.train
  assert (m.kind, m.hidden_size, m.num_layers, m.state_size, m.recurrence.s5.blocks,
          m.mixer_gate, m.mlp_size, m.norm, m.pooling, m.dropout_rate) == (
      "s5", 128, 8, 16, 8, "half_glu", 0, "pre", "mean", 0.0)
  assert (t.batch_size, t.num_steps, t.learning_rate, t.recurrence_learning_rate,
          t.weight_decay, t.warmup_steps, t.schedule) == (
      50, 40 * 1920, 0.003, 0.001, 0.04, 1920, "cosine")
  assert (config.data.train_examples, config.data.max_length) == (96_000, 2000)


def test_the_lru_preset_is_minimal_lrus_listops_command():
  """NicolasZucchet/minimal-LRU run_train.py's defaults with --epochs 40: 4 layers, d_model
  256, d_hidden 128, r in [0, 1], GLU, batch 64, lr 1e-3 and 0.5 × for the LRU, weight decay
  0.05, dropout 0.1, mean pooling, pre-norm (LayerNorm in place of its BatchNorm)."""
  config = experiment.get_config("preset=lru")
  m, t = config.model, config.train
  assert (m.kind, m.hidden_size, m.num_layers, m.state_size, m.recurrence.lru.r_min,
          m.recurrence.lru.r_max, m.mixer_gate, m.mlp_size, m.norm, m.pooling,
          m.dropout_rate) == ("lru", 256, 4, 128, 0.0, 1.0, "glu", 0, "pre", "mean", 0.1)
  assert (t.batch_size, t.num_steps, t.learning_rate, t.recurrence_learning_rate,
          t.weight_decay, t.warmup_steps) == (64, 40 * 1500, 1e-3, 5e-4, 0.05, 0)


@pytest.mark.parametrize("overrides, message", [
    ({"model.attention": "routing"}, "model.attention='routing' is not allowed; choose one of: "
                                     "'full', 'local', 'longformer', 'sparse'"),
    ({"model.pooling": "max"}, "model.pooling='max' is not allowed; choose one of: 'cls', 'mean'"),
    ({"model.num_heads": 3}, "model.num_heads=3 must divide config.model.hidden_size=16"),
    ({"data.min_tree_length": 149}, "min_tree_length=149 and max_tree_length=150 leave no length"),
    ({"data.files": "/nonexistent"}, "data.files='/nonexistent' is not a directory"),
])
def test_bad_values_are_named_before_anything_is_built(overrides, message, tmp_path):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    listops.validate(tiny_config(tmp_path, **overrides))
  assert not os.path.exists(tmp_path / "data")


def test_length_buckets_are_rounded_quantiles_ending_at_max_length():
  lengths = np.arange(1, 401)
  assert listops.bucket_boundaries(lengths, 4, 512) == (128, 256, 320, 512)
  assert listops.bucket_boundaries(lengths, 1, 512) == (512,)
  assert listops.bucket_boundaries(np.full(10, 30), 4, 100) == (64, 100)


def test_the_data_is_written_once_in_lras_layout_and_read_back(tmp_path):
  config = tiny_config(tmp_path)
  paths = listops.split_files(config)
  assert sorted(os.listdir(listops.generated_directory(config))) == [
      "test.tsv", "train.tsv", "val.tsv"]
  with open(paths["train"]) as f:
    assert f.readline() == "Source\tTarget\n"
  stamps = {split: os.stat(path).st_mtime_ns for split, path in paths.items()}
  data = listops.load_data(config)                       # reads, does not redraw
  assert {split: os.stat(path).st_mtime_ns for split, path in paths.items()} == stamps
  assert {s: len(a["labels"]) for s, a in data.splits.items()} == {
      "train": 256, "val": 32, "test": 48}
  # Token ids follow LRA's tokens (brackets dropped), 0 pads, truncated to max_length.
  source, label = listops_data.read_split(paths["test"])[0]
  words = [w for w in source.replace("(", " ").replace(")", " ").replace("[", " ").split()
           if w != "]"][:128]
  vocabulary = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "MIN", "MAX", "MED", "SM")
  test = data.splits["test"]
  assert test["lengths"][0] == len(words) and test["labels"][0] == label
  np.testing.assert_array_equal(test["tokens"][0, :len(words)],
                                [vocabulary.index(w) + 1 for w in words])
  assert not test["tokens"][0, len(words):].any()


def test_two_runs_generating_one_split_set_write_it_once_and_read_it_whole(tmp_path, monkeypatch,
                                                                          capsys):
  config = tiny_config(tmp_path)
  directory = listops.generated_directory(config)
  write, writes = listops_data.write_splits, []

  def slow_write(*args):           # long enough for the second run to find the files missing
    writes.append(args)
    time.sleep(0.5)
    return write(*args)

  monkeypatch.setattr(listops_data, "write_splits", slow_write)
  found = []
  runs = [threading.Thread(target=lambda: found.append(listops.split_files(config)))
          for _ in range(2)]
  for run in runs:
    run.start()
  for run in runs:
    run.join(60)
  assert len(writes) == 1 and len(found) == 2 and found[0] == found[1]
  assert sorted(os.listdir(directory)) == ["test.tsv", "train.tsv", "val.tsv"]
  assert capsys.readouterr().err == (f"waiting for another process generating {directory} "
                                     f"(lock {directory}.lock)\n")
  data = listops.load_data(config)
  assert {s: len(a["labels"]) for s, a in data.splits.items()} == {
      "train": 256, "val": 32, "test": 48}


def test_lras_own_file_names_are_read_and_a_foreign_token_is_named(tmp_path):
  for split in ("train", "val", "test"):
    with open(tmp_path / f"basic_{split}.tsv", "w") as f:
      f.write("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [MIN 2 ) 9 ) ] )\t2\n")
  config = tiny_config(tmp_path, **{"data.files": str(tmp_path), "data.length_buckets": 1})
  listops.validate(config)
  data = listops.load_data(config)
  np.testing.assert_array_equal(data.splits["val"]["labels"], [9, 2])
  with open(tmp_path / "basic_test.tsv", "a") as f:
    f.write("( ( ( [MAX 2 ) X ) ] )\t9\n")
  with pytest.raises(InputError, match=r"basic_test.tsv:4: token 'X' is not ListOps'"):
    listops.load_data(config)
  os.remove(tmp_path / "basic_val.tsv")
  with pytest.raises(ConfigError, match="has no val.tsv"):
    listops.validate(config)


@pytest.mark.slow
@pytest.mark.long
def test_a_tiny_run_trains_in_buckets_and_reports_test_accuracy(tmp_path):
  config = tiny_config(tmp_path, "preset=cpu,attention=longformer")
  final = train_and_evaluate(config, str(tmp_path / "run"), experiments.get("listops"))
  data = listops.load_data(config)
  # One compiled step per bucket a batch came from; the test split is scored whole.
  assert 1 <= final["perf/train_step_traces"] <= len(data.boundaries) == 2
  correct = final["test/accuracy"] * 48
  assert correct == pytest.approx(round(correct), abs=1e-4)
  assert not [key for key in final if key.startswith("lra/")]   # LRA's figures are not measured
  assert final["perf/step_memory_mib"] > 0
  # 40 steps learn at least the label prior: below the uniform guess's ln 10.
  assert final["eval/loss"] < np.log(10)
