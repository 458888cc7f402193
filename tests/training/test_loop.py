"""train_and_evaluate end to end on a tiny config, in process."""

import json
import logging
import os

import numpy as np
import pytest
import tiny

import research.tasks.sequence_tasks as sequence_tasks
from research.training.loop import train_and_evaluate
from research.training.metrics import NonFiniteLossError
from research.training.sweep import run_sweep


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_trains_once_compiled_and_fills_the_workdir(tmp_path, capsys):
  workdir = str(tmp_path)
  final = train_and_evaluate(tiny.config(), workdir)
  records = _records(workdir)
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert [r["step"] for r in records if "train/loss" in r] == list(range(10, 61, 10))
  assert losses[-1] < 0.7 * losses[0]
  assert [r["step"] for r in records if "eval/loss" in r] == [30, 60]
  assert final["eval/loss"] == records[-1]["eval/loss"]
  assert final["perf/train_step_traces"] == 1
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20", "40", "60"]
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["hidden_size"] == 16
  with open(os.path.join(workdir, "loss.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  assert any(name.startswith("events.out.tfevents") for name in events)
  assert "step 60/60  loss" in capsys.readouterr().err


class _PoisonedStream:
  """Wraps a stream so that the batches of steps >= first_bad hold NaN inputs."""

  def __init__(self, stream, first_bad):
    self.stream, self.first_bad, self.batch_size = stream, first_bad, stream.batch_size

  def __next__(self):
    batch = next(self.stream)
    if self.stream.get_state()["step"] >= self.first_bad:
      batch = {**batch, "inputs": np.full_like(batch["inputs"], np.nan)}
    return batch

  def get_state(self):
    return self.stream.get_state()

  def set_state(self, state):
    self.stream.set_state(state)


def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
  build = sequence_tasks.build
  monkeypatch.setattr(sequence_tasks, "build", lambda config: build(config)._replace(
      train_data=_PoisonedStream(build(config).train_data, first_bad=26)))
  with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 26.*checkpoint \(step 20\)"):
    train_and_evaluate(tiny.config(), str(tmp_path))
  assert os.listdir(tmp_path / "checkpoints") == ["20"]


def test_unreadable_latest_checkpoint_falls_back_with_a_warning(tmp_path, caplog, capsys):
  workdir = str(tmp_path)
  train_and_evaluate(tiny.config(), workdir)
  for root, _, files in os.walk(tmp_path / "checkpoints" / "60" / "state"):
    for name in files:
      open(os.path.join(root, name), "w").close()          # truncate every file
  with caplog.at_level(logging.WARNING):
    train_and_evaluate(tiny.config(**{"train.num_steps": 80}), workdir)
  assert "checkpoint at step 60 cannot be read" in caplog.text
  assert "resuming from the checkpoint at step 40" in capsys.readouterr().err
  assert os.path.isdir(tmp_path / "checkpoints_unreadable" / "60")
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int)[-1] == "80"


def test_sweep_writes_a_summary_and_skips_finished_points(tmp_path):
  config = tiny.config(**{"train.num_steps": 20, "train.eval_every": 20})
  points = [{"model.kind": "rnn"}, {"model.kind": "gru"}]
  rows = run_sweep(config, points, str(tmp_path))
  assert [r["model.kind"] for r in rows] == ["rnn", "gru"]
  assert rows[0]["eval/loss"] != rows[1]["eval/loss"]
  done = tmp_path / "model.kind=gru" / "final_metrics.json"
  stamp = os.path.getmtime(done)
  assert run_sweep(config, points, str(tmp_path)) == rows
  assert os.path.getmtime(done) == stamp
  with open(tmp_path / "summary.csv") as f:
    header, *lines = f.read().splitlines()
  assert header.startswith("model.kind,") and "eval/loss" in header and len(lines) == 2
  with open(tmp_path / "summary.md") as f:
    assert f.read().splitlines()[2].startswith("| rnn |")
