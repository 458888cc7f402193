"""The training progress (research/training/metrics.py Progress): tqdm's bar where it can be
redrawn in place, one line per update in a log; the run's other lines pass untouched."""

import io
import re
import sys

from research.training import metrics
from research.training.metrics import Progress


class Terminal(io.StringIO):
  def isatty(self) -> bool:
    return True


def train(num_steps: int, notice_at: int) -> None:
  """The loop's calls: a Progress, an update every 10 steps, a notice printed in between."""
  progress = Progress(num_steps, first_step=0)
  for step in range(10, num_steps + 1, 10):
    progress.update(step, loss=1.0 / step)
    if step == notice_at:
      print("warning: Weights & Biases failed to log (OSError: disk full)", file=sys.stderr)
  progress.close()


def test_a_terminal_gets_tqdms_bar_and_every_other_line(monkeypatch):
  stderr = Terminal()
  monkeypatch.setattr(sys, "stderr", stderr)
  train(40, notice_at=20)
  frames = [frame for frame in re.split(r"[\r\n]", stderr.getvalue()) if frame.strip()]
  final = [frame for frame in frames if "40/40" in frame]
  assert final and "100%" in final[-1] and "loss 0.025" in final[-1], frames
  assert "warning: Weights & Biases failed to log (OSError: disk full)" in stderr.getvalue()
  assert not any(re.match(r"step \d+/40  loss", frame) for frame in frames)


def test_a_log_gets_one_line_per_update_and_every_other_line(monkeypatch):
  stderr = io.StringIO()
  monkeypatch.setattr(sys, "stderr", stderr)
  monkeypatch.delitem(sys.modules, "ipykernel.zmqshell", raising=False)
  train(40, notice_at=20)
  lines = stderr.getvalue().splitlines()
  assert [line.split("  loss")[0] for line in lines if line.startswith("step ")] == [
      "step 10/40", "step 20/40", "step 30/40", "step 40/40"]
  assert lines[2] == "warning: Weights & Biases failed to log (OSError: disk full)"
  assert "\r" not in stderr.getvalue()


def test_a_jupyter_kernel_counts_as_redrawn_in_place(monkeypatch):
  """A kernel's streams are no terminals, yet a notebook draws tqdm's bar in place."""
  log = io.StringIO()
  monkeypatch.delitem(sys.modules, "ipykernel.zmqshell", raising=False)
  assert not metrics._redrawn_in_place(log)
  monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", object())
  assert metrics._redrawn_in_place(log)
