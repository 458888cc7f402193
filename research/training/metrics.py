"""Workdir metrics: metrics.jsonl, TensorBoard events, a live progress line, and the one JSON
encoding of every metrics file the runtime writes.

Every metrics file is valid JSON (RFC 8259, which has no NaN or Infinity): metrics.jsonl,
final_metrics.json (a run's, a sweep point's), a checkpoint's not yet logged metrics. A
non-finite float (a float16 run's skipped step has an infinite train/grad_norm; a diverged
metric) is written as the string "nan", "inf" or "-inf" (`dumps`; what Python's str and
float() use, so a sweep's summary.csv reads alike), and read back as that float (`loads`,
`decoded`, `read_json`).
"""

import contextlib
import json
import math
import os
import sys
import time
from typing import Any

import jax

from research import files
from research.errors import RunFailed
from research.files import atomic_write
from research.training.tensorboard import EventWriter
from research.training.workdir import unused_path

METRICS_FILE = "metrics.jsonl"
TENSORBOARD = "tensorboard"          # the event files' directory
CONFIG_TABLE = "config"              # the TensorBoard tag of the config's table


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}   # a JSON string: the float


class NonFiniteLossError(RunFailed, FloatingPointError):
  """The training loss became NaN or Inf."""


def encoded(value: Any) -> Any:
  """`value` with each non-finite float (at any depth of dicts, lists and tuples) as its
  NON_FINITE string."""
  if isinstance(value, float) and not math.isfinite(value):
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
  if isinstance(value, dict):
    return {key: encoded(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [encoded(item) for item in value]
  return value


def decoded(value: Any) -> Any:
  """`encoded` undone: each NON_FINITE string (at any depth) as its float."""
  if isinstance(value, str):
    return NON_FINITE.get(value, value)
  if isinstance(value, dict):
    return {key: decoded(item) for key, item in value.items()}
  if isinstance(value, list):
    return [decoded(item) for item in value]
  return value


def dumps(value: Any, indent: int | None = None) -> str:
  """`value` as RFC 8259 JSON, non-finite floats `encoded` (json.dumps would write NaN or
  Infinity, which JSON does not have)."""
  return json.dumps(encoded(value), indent=indent, allow_nan=False)


def loads(text: str | bytes) -> Any:
  """The value of a metrics file's JSON, NON_FINITE strings `decoded` (NaN or Infinity
  tokens, written by an earlier version, read too)."""
  return decoded(json.loads(text))


def write_json(path: str, value: dict) -> None:
  """A metrics file (final_metrics.json) written whole (research/files.py), `dumps`-encoded."""
  files.write_text(path, dumps(value, indent=2) + "\n")


def read_json(path: str) -> dict:
  """A metrics file written by `write_json`, `decoded` (files.read_json's errors)."""
  return decoded(files.read_json(path))


class MetricsWriter:
  """Appends {"step": n, "train/loss": ..., ...} lines; only process 0 writes.

  metrics.jsonl is append-only and reads as one history in step order: a run resumed
  from the checkpoint of step `resume_step` first moves the records after that step
  (written before a crash or kill) to `metrics.after_step_<resume_step>[.n].jsonl`, then
  cuts them off the end of metrics.jsonl, whose earlier bytes stay as they were.
  TensorBoard is told to purge its events after `resume_step` likewise (from step 1 on
  for a run that starts from nothing: an earlier attempt's, which saved no checkpoint).

  `config`, the flattened config ({"train.learning_rate": 0.001, ...}), is recorded in
  TensorBoard as a table `config` (key, JSON value) at the first step this session trains,
  resume_step + 1: purged with the steps after a checkpoint, so that each resume shows its
  own (with the keys a resume may change) and a resume from the same checkpoint replaces it.
  Each record also goes to `wandb_run` (a research.training.wandb_writer.WandbRun) where given.
  """

  def __init__(self, workdir: str, resume_step: int = 0, config: dict | None = None,
               wandb_run=None):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0
    self.history = self._resume(resume_step)
    self.tensorboard = EventWriter(
        os.path.join(workdir, TENSORBOARD),
        purge_step=resume_step + 1) if self.enabled else None
    if self.enabled and config:
      self.tensorboard.table(resume_step + 1, CONFIG_TABLE,
                             [[key, json.dumps(value)] for key, value in config.items()])
    self.wandb_run = wandb_run

  def _resume(self, step: int) -> list[dict]:
    """The records up to `step`; later ones (and a torn last line) move to their own file."""
    if not os.path.exists(self.path):
      return []
    with open(self.path, "rb") as f:
      lines = f.readlines()
    history, offset = [], 0
    for line in lines:
      record = _parse(line)
      if record is None or record["step"] > step:
        break
      history.append(record)
      offset += len(line)
    tail = b"".join(lines)[offset:]
    if tail and self.enabled:
      aside = unused_path(os.path.join(os.path.dirname(self.path), f"metrics.after_step_{step}"),
                          ".jsonl")
      with atomic_write(aside, "wb") as f:
        f.write(tail)
      os.truncate(self.path, offset)
    return history

  def write(self, step: int, metrics: dict) -> None:
    values = {name: float(value) for name, value in metrics.items()}
    record = {"step": step, **values}
    self.history.append(record)
    if not self.enabled:
      return
    with _naming(self.path), open(self.path, "a") as f:
      f.write(dumps(record) + "\n")
    with _naming(self.tensorboard.path):
      self.tensorboard.scalars(step, values)
    if self.wandb_run is not None:
      self.wandb_run.scalars(step, values)

  def close(self) -> None:
    if self.tensorboard is not None:
      self.tensorboard.close()


@contextlib.contextmanager
def _naming(path: str):
  """Re-raises an OSError of the block with `path` as its file name (a full disk, say)."""
  try:
    yield
  except OSError as error:
    raise OSError(error.errno, error.strerror, path) from error


def read_history(workdir: str) -> list[dict]:
  """The complete records of the workdir's metrics.jsonl in order ([] where there is none),
  read without writing: a live run's too, the line it is writing left out."""
  try:
    with open(os.path.join(workdir, METRICS_FILE), "rb") as f:
      lines = f.readlines()
  except FileNotFoundError:
    return []
  return [record for record in map(_parse, lines) if record is not None]


def _parse(line: bytes) -> dict | None:
  """A complete metrics.jsonl record ({"step": int, ...}), or None for a torn
  (half-written) line or anything else."""
  if not line.endswith(b"\n"):
    return None
  try:
    record = loads(line)
  except ValueError:
    return None
  return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


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
