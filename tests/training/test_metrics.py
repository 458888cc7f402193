"""metrics.jsonl is append-only: a resume moves later records aside and keeps the prefix;
every metrics file is valid JSON, a non-finite value read back as the float it was."""

import json
import math

import numpy as np
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from research.training import loop, sweep, workdir
from research.training.metrics import MetricsWriter
from research.training.workdir import METRICS_FILE, TENSORBOARD


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


def _strict(text: str):
  """json.loads as RFC 8259 reads it: NaN, Infinity and -Infinity are no JSON."""
  def refuse(token):
    raise ValueError(f"{token} is not JSON")
  return json.loads(text, parse_constant=refuse)


NON_FINITE = {"step": 7, "train/grad_norm": float("inf"), "train/low": float("-inf"),
              "eval/x": float("nan"), "nested": {"values": [1.5, float("inf"), (float("nan"),)]},
              "diverged": "loss is nan at step 3", "a string": "inf", "finite": 0.1}


def _same(a, b) -> bool:
  """Whether b, read back, is a: NaN equal to NaN, a tuple of a read back as a list."""
  if isinstance(a, dict):
    return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)):
    return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
  if isinstance(a, float) and math.isnan(a):
    return isinstance(b, float) and math.isnan(b)
  return a == b and type(a) is type(b)


def test_non_finite_values_are_valid_json_strings_read_back_as_floats(tmp_path):
  text = workdir.dumps(NON_FINITE)
  assert _strict(text)["train/grad_norm"] == "inf" and _strict(text)["eval/x"] == "nan"
  assert _strict(text)["nested"]["values"] == [1.5, "inf", ["nan"]]
  back = workdir.loads(text)
  # every non-finite float comes back; the string "inf" too reads as the float (documented)
  assert _same({**NON_FINITE, "a string": float("inf")}, back)
  assert back["diverged"] == "loss is nan at step 3" and back["finite"] == 0.1
  assert math.isinf(workdir.loads('{"x": Infinity}')["x"])      # an earlier version's file
  workdir.write_json(str(tmp_path / "final_metrics.json"), NON_FINITE)
  _strict((tmp_path / "final_metrics.json").read_text())
  assert _same({**NON_FINITE, "a string": float("inf")},
               workdir.read_json(str(tmp_path / "final_metrics.json")))


def test_metrics_jsonl_records_non_finite_values_as_valid_json_and_reads_them_back(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  writer.write(10, {"train/loss": 0.5, "train/grad_norm": np.float32("inf")})
  writer.write(20, {"train/loss": float("nan")})
  writer.close()
  lines = (tmp_path / METRICS_FILE).read_text().splitlines()
  assert [_strict(line) for line in lines] == [
      {"step": 10, "train/loss": 0.5, "train/grad_norm": "inf"}, {"step": 20, "train/loss": "nan"}]
  history = workdir.read_history(str(tmp_path))
  assert history[0]["train/grad_norm"] == float("inf") and math.isnan(history[1]["train/loss"])
  resumed = MetricsWriter(str(tmp_path), resume_step=10)        # a resume reads them too
  resumed.close()
  assert resumed.history == [{"step": 10, "train/loss": 0.5, "train/grad_norm": float("inf")}]


def test_a_checkpoints_unlogged_metrics_round_trip_bit_for_bit_as_valid_json():
  rows = [{"loss": np.float32(0.25), "grad_norm": np.float32("inf")},
          {"loss": np.float32("nan"), "grad_norm": np.float32("-inf")}]
  encoded = loop._to_json(rows)
  _strict(json.dumps(encoded, allow_nan=False))
  back = loop._from_json(json.loads(json.dumps(encoded)))
  for row, read in zip(rows, back, strict=True):
    for key, value in row.items():
      assert read[key].dtype == value.dtype and read[key].tobytes() == value.tobytes()


def test_a_sweep_reads_a_points_non_finite_final_metrics_back(tmp_path):
  workdir.write_json(str(tmp_path / "final_metrics.json"), {"eval/loss": float("inf")})
  assert sweep._finished(str(tmp_path)) == {"eval/loss": float("inf")}
