"""The notebooks' training progress: the loop's progress lines drawn as one bar with the ETA."""

import contextlib
import io
import sys

from research import notebook
from research.training.metrics import Progress


def test_the_loops_progress_lines_become_one_bar_per_run_and_nothing_else(monkeypatch):
  """Lines as the loop's own Progress prints them (not a copy of its format), a run's
  other stderr lines, and a second run (a sweep's next point) whose steps start again."""
  shown = io.StringIO()
  monkeypatch.setattr("sys.__stdout__", shown)        # no IPython kernel here: the fallback
  bar = notebook.ProgressBar("dates")
  with contextlib.redirect_stderr(bar):
    for num_steps in (40, 20):
      progress = Progress(num_steps, first_step=0)
      print("resuming from the checkpoint at step 0", file=sys.stderr)
      for step in range(10, num_steps + 1, 10):
        progress.update(step, loss=1.0 / step)
      progress.close()
  lines = [line for line in shown.getvalue().split("\r") if line]
  assert [line.split("  loss")[0] for line in lines] == [
      "dates  run 1  [#####---------------]  10/40", "dates  run 1  [##########----------]  20/40",
      "dates  run 1  [###############-----]  30/40", "dates  run 1  [####################]  40/40",
      "dates  run 2  [##########----------]  10/20", "dates  run 2  [####################]  20/20"]
  assert all(" steps/s  ETA " in line for line in lines)
  assert "resuming" not in shown.getvalue()
  assert lines[3].endswith("\n") and not lines[2].endswith("\n")   # a finished run ends its line
