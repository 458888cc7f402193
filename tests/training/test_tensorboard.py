"""Our TensorBoard event files, read back with TensorBoard's own EventAccumulator."""

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from research.training.metrics import EventWriter


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} as TensorBoard shows the run in `logdir`."""
  accumulator = EventAccumulator(str(logdir))
  accumulator.Reload()
  return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
          for tag in accumulator.Tags()["scalars"]}


def test_scalars_read_back_with_tensorboards_reader(tmp_path):
  writer = EventWriter(str(tmp_path))
  writer.scalars(50, {"train/loss": 0.25, "train/grad_norm": 3.5e-7})
  (path,) = tmp_path.iterdir()
  assert path.name.startswith("events.out.tfevents.") and writer.path == str(path)
  assert _scalars(tmp_path) == {"train/loss": [(50, 0.25)],   # flushed before closing
                                "train/grad_norm": [(50, np.float32(3.5e-7))]}
  writer.scalars(2**40, {"eval/accuracy": 1.0})
  writer.close()
  accumulator = EventAccumulator(str(tmp_path))
  accumulator.Reload()
  assert accumulator.file_version == 2 and accumulator.FirstEventTimestamp() > 1.7e9
  assert accumulator.Scalars("eval/accuracy")[0].step == 2**40
  assert accumulator.Scalars("eval/accuracy")[0].wall_time > 1.7e9


def test_a_resumed_run_purges_the_steps_after_its_checkpoint(tmp_path):
  first = EventWriter(str(tmp_path))
  for step in (10, 20, 30):
    first.scalars(step, {"train/loss": step / 10})
  first.close()
  resumed = EventWriter(str(tmp_path), purge_step=21)
  for step in (30, 40):
    resumed.scalars(step, {"train/loss": step})
  resumed.close()
  assert _scalars(tmp_path) == {"train/loss": [(10, 1.0), (20, 2.0), (30, 30.0), (40, 40.0)]}


def test_a_table_reads_back_as_the_text_plugins_string_tensor(tmp_path):
  EventWriter(str(tmp_path)).table(1, "config", [["train.learning_rate", "0.001"],
                                                 ["experiment", '"nmt_dates"']])
  accumulator = EventAccumulator(str(tmp_path))
  accumulator.Reload()
  assert accumulator.Tags()["tensors"] == ["config"]
  (event,) = accumulator.Tensors("config")
  assert accumulator.SummaryMetadata("config").plugin_data.plugin_name == "text"
  assert event.step == 1 and make_ndarray(event.tensor_proto).tolist() == [
      [b"train.learning_rate", b"0.001"], [b"experiment", b'"nmt_dates"']]
