"""metrics.jsonl is append-only: a resume moves later records aside and keeps the prefix."""

import json

from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from research.training.metrics import METRICS_FILE, TENSORBOARD, MetricsWriter


def _write_history(path, steps, torn_tail=b""):
  lines = [json.dumps({"step": s, "train/loss": 1.0 / s}).encode() + b"\n" for s in steps]
  path.write_bytes(b"".join(lines) + torn_tail)
  return lines


def test_resume_moves_records_after_the_step_aside_and_keeps_the_prefix_bytes(tmp_path):
  path = tmp_path / METRICS_FILE
  lines = _write_history(path, range(10, 70, 10), torn_tail=b'{"step": 70, "train/lo')
  writer = MetricsWriter(str(tmp_path), resume_step=40)
  writer.close()
  assert [r["step"] for r in writer.history] == [10, 20, 30, 40]
  assert path.read_bytes() == b"".join(lines[:4])
  assert (tmp_path / "metrics.after_step_40.jsonl").read_bytes() == (
      b"".join(lines[4:]) + b'{"step": 70, "train/lo')
  _write_history(path, range(10, 60, 10))
  MetricsWriter(str(tmp_path), resume_step=40).close()      # a second resume from step 40
  assert (tmp_path / "metrics.after_step_40.1.jsonl").read_bytes() == lines[4]
  assert (tmp_path / "metrics.after_step_40.jsonl").read_bytes().startswith(lines[4])


def test_writes_append_after_a_resume(tmp_path):
  _write_history(tmp_path / METRICS_FILE, range(10, 40, 10))
  writer = MetricsWriter(str(tmp_path), resume_step=20)
  writer.write(30, {"train/loss": 0.5})
  writer.close()
  steps = [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
  assert steps == [10, 20, 30] and [r["step"] for r in writer.history] == [10, 20, 30]


def test_the_config_table_is_the_first_step_of_each_session_and_purged_with_it(tmp_path):
  """A resume shows its own config (here a longer num_steps) from the step after its
  checkpoint; resuming from the same checkpoint again replaces it (read as TensorBoard's
  server reads tensors)."""
  for resume_step, num_steps in ((0, 40), (20, 80), (20, 60)):
    MetricsWriter(str(tmp_path), resume_step,
                  config={"train.num_steps": num_steps, "experiment": "listops"}).close()
  accumulator = EventAccumulator(str(tmp_path / TENSORBOARD))
  accumulator.Reload()
  tables = [(e.step, make_ndarray(e.tensor_proto).tolist()) for e in accumulator.Tensors("config")]
  assert tables == [
      (1, [[b"train.num_steps", b"40"], [b"experiment", b'"listops"']]),
      (21, [[b"train.num_steps", b"60"], [b"experiment", b'"listops"']])]
