"""Workdir metrics: metrics.jsonl, TensorBoard events, a live progress line."""

import json
import math
import os
import sys
import time

import jax
from tensorboardX import SummaryWriter

METRICS_FILE = "metrics.jsonl"


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or Inf."""


class MetricsWriter:
  """Appends {"step": n, "train/loss": ..., ...} lines; only process 0 writes.

  On resume, `truncate(step)` drops records after the restored step so that the file
  reads as if the run had never stopped.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0
    self.history: list[dict] = []
    self.tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard")) if self.enabled else None

  def truncate(self, step: int) -> None:
    if os.path.exists(self.path):
      with open(self.path) as f:
        self.history = [r for r in map(json.loads, f) if r["step"] <= step]
    if self.enabled:
      with open(self.path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in self.history)

  def write(self, step: int, metrics: dict) -> None:
    record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
    self.history.append(record)
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for name, value in metrics.items():
      self.tensorboard.add_scalar(name, float(value), step)
    self.tensorboard.flush()

  def close(self) -> None:
    if self.tensorboard is not None:
      self.tensorboard.close()


class Progress:
  """One live line: step, loss, steps/s, ETA (rewritten in place on a terminal)."""

  def __init__(self, num_steps: int, first_step: int):
    self.num_steps, self.last_step, self.last_time = num_steps, first_step, time.perf_counter()
    self.live = sys.stderr.isatty()
    self.enabled = jax.process_index() == 0

  def update(self, step: int, loss: float) -> float:
    """Returns steps/s since the previous update."""
    now = time.perf_counter()
    rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
    self.last_step, self.last_time = step, now
    eta = (self.num_steps - step) / rate if rate > 0 else float("inf")
    line = (f"step {step}/{self.num_steps}  loss {loss:.4g}  {rate:.2f} steps/s  "
            f"ETA {_duration(eta)}")
    if self.enabled:
      print(("\r" + line + "\033[K") if self.live else line, end="" if self.live else "\n",
            file=sys.stderr, flush=True)
    return rate

  def close(self) -> None:
    if self.enabled and self.live:
      print(file=sys.stderr)


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  minutes, seconds = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
