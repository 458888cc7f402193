"""TensorBoard scalar event files, written with the `tensorboard` package's protocol buffers
and TFRecord writer: no TensorFlow, no torch.

An event file holds one serialised `Event` per record: the file version first, then, for a
resumed run, a START session log at `purge_step` (TensorBoard then drops the events at steps
>= purge_step that an earlier writer of the run left), then one `Summary` per `scalars` call
(simple values) or `table` call (a string tensor for the text plugin), flushed to disk before
it returns.

Not `tensorboard.summary.writer.event_file_writer.EventFileWriter`: it opens its file through
`tensorboard.compat.tf`, which imports TensorFlow wherever that is installed (Colab), and
writes from a background thread, so a full disk would surface a call later.
"""

import os
import socket
import time

import numpy as np
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.metadata import create_summary_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util.tensor_util import make_tensor_proto


class EventWriter:
  """Appends scalar summaries to a new event file in `logdir`."""

  def __init__(self, logdir: str, purge_step: int | None = None):
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    self.path = os.path.join(logdir, f"events.out.tfevents.{time.time():.0f}."
                                     f"{socket.gethostname()}.{os.getpid()}")
    self.records = RecordWriter(open(self.path, "ab"))
    self._write(Event(file_version="brain.Event:2"))
    if purge_step is not None:
      self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

  def _write(self, event: Event) -> None:
    event.wall_time = time.time()
    self.records.write(event.SerializeToString())

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """One event holding every value at `step`, flushed to disk."""
    self._write(Event(step=step, summary=Summary(value=[
        Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])))
    self.records.flush()

  def table(self, step: int, tag: str, rows: list[list[str]]) -> None:
    """A table of strings [rows, columns] at `step`, as the text plugin shows it (TensorBoard's
    TEXT tab draws a 2-D string tensor as a table, each cell as Markdown), flushed to disk."""
    self._write(Event(step=step, summary=Summary(value=[Summary.Value(
        tag=tag, metadata=create_summary_metadata(display_name=tag, description=""),
        tensor=make_tensor_proto(np.array(rows, dtype=object)))])))
    self.records.flush()

  def close(self) -> None:
    self.records.close()
