"""What a run records as it trains: metrics.jsonl, TensorBoard events (the `tensorboard`
package's writer, no TensorFlow), an optional Weights & Biases run, the progress (a tqdm bar),
PNG figures (loss curves, attention heatmaps; matplotlib's Agg) and profiler traces."""

import collections
import contextlib
import glob
import gzip
import importlib.util
import io
import json
import math
import os
import socket
import sys
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # noqa: E402
from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: E402
from tensorboard.plugins.text.metadata import create_summary_metadata  # noqa: E402
from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402
from tensorboard.util.tensor_util import make_tensor_proto  # noqa: E402

if importlib.util.find_spec("ipywidgets") is None:   # tqdm.auto would warn, naming its path,
  from tqdm.std import tqdm  # noqa: E402            # then draw this text bar in a notebook
else:
  from tqdm.auto import tqdm  # noqa: E402

from research import files  # noqa: E402
from research.errors import ConfigError, RunFailed  # noqa: E402
from research.files import atomic_write  # noqa: E402
from research.training.experiment import Heatmap  # noqa: E402
from research.training.workdir import (  # noqa: E402
  METRICS_FILE,
  PROFILE,
  TENSORBOARD,
  WANDB,
  dumps,
  parse_record,
  unused_path,
)

CONFIG_TABLE = "config"              # the TensorBoard tag of the config's table


class NonFiniteLossError(RunFailed, FloatingPointError):
  """The training loss became NaN or Inf."""


class EventWriter:
  """Appends scalar summaries to a new event file in `logdir`: the file version first, then
  for a resumed run a START session log at `purge_step` (TensorBoard then drops the events at
  steps >= purge_step an earlier writer left), then one `Summary` per call, flushed before it
  returns. (Not tensorboard's EventFileWriter: it imports TensorFlow wherever installed, and
  writes from a thread, so a full disk would surface a call later.)"""

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


class MetricsWriter:
  """Appends {"step": n, "train/loss": ..., ...} lines; only process 0 writes.

  metrics.jsonl is append-only and reads as one history in step order: a run resumed
  from the checkpoint of step `resume_step` first moves the records after that step
  (written before a crash or kill) to `metrics.after_step_<resume_step>[.n].jsonl`, then
  cuts them off the end of metrics.jsonl, whose earlier bytes stay as they were; a run
  that starts from nothing (resume_step 0) moves every record, a warm start's evaluation at
  step 0 too (an earlier attempt's, which saved no checkpoint). TensorBoard is told to
  purge its events after `resume_step` likewise (every step for a start from nothing).

  `config`, the flattened config ({"train.learning_rate": 0.001, ...}), is recorded in
  TensorBoard as a table `config` (key, JSON value) at the first step this session trains,
  resume_step + 1: purged with the steps after a checkpoint, so that each resume shows its
  own (with the keys a resume may change) and a resume from the same checkpoint replaces it.
  Each record also goes to `wandb_run` (a `WandbRun`) where given.
  """

  def __init__(self, workdir: str, resume_step: int = 0, config: dict | None = None,
               wandb_run=None):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = jax.process_index() == 0
    self.history = self._resume(resume_step)
    self.tensorboard = EventWriter(
        os.path.join(workdir, TENSORBOARD),
        purge_step=resume_step + 1 if resume_step else 0) if self.enabled else None
    if self.enabled and config:
      self.tensorboard.table(resume_step + 1, CONFIG_TABLE,
                             [[key, json.dumps(value)] for key, value in config.items()])
    self.wandb_run = wandb_run

  def _resume(self, step: int) -> list[dict]:
    """The records up to `step` (none for step 0); later ones (and a torn last line) move to
    their own file."""
    if not os.path.exists(self.path):
      return []
    with open(self.path, "rb") as f:
      lines = f.readlines()
    history, offset = [], 0
    for line in lines:
      record = parse_record(line)
      if record is None or record["step"] > step or step == 0:
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


class Progress:
  """The loop's progress: step, loss, steps/s, ETA. Where it can be redrawn in place (a
  terminal, a Jupyter kernel) a tqdm bar, `tqdm.auto`'s: a widget in a notebook with
  ipywidgets, a text line elsewhere; in a log file or a pipe, one line per update. Nothing
  else the run prints goes through it (warnings and notices stay as they are)."""

  def __init__(self, num_steps: int, first_step: int):
    self.num_steps, self.last_step, self.last_time = num_steps, first_step, time.perf_counter()
    self.enabled = jax.process_index() == 0
    self.bar = (tqdm(total=num_steps, initial=first_step, unit="step", file=sys.stderr,
                     dynamic_ncols=True)
                if self.enabled and _redrawn_in_place(sys.stderr) else None)

  def update(self, step: int, loss: float) -> float:
    """Returns steps/s since the previous update."""
    now = time.perf_counter()
    rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
    self.last_step, self.last_time = step, now
    if self.bar is not None:
      self.bar.set_postfix_str(f"loss {loss:.4g}", refresh=False)
      self.bar.update(step - self.bar.n)
    elif self.enabled:
      eta = (self.num_steps - step) / rate if rate > 0 else float("inf")
      print(f"step {step}/{self.num_steps}  loss {loss:.4g}  {rate:.2f} steps/s  "
            f"ETA {_duration(eta)}", file=sys.stderr, flush=True)
    return rate

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _redrawn_in_place(stream) -> bool:
  """A terminal, or a cell of a Jupyter kernel (whose streams are no terminals)."""
  return stream.isatty() or "ipykernel.zmqshell" in sys.modules


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  minutes, seconds = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


MAX_INCHES = 40        # a heatmap's largest side (4000 pixels at 100 dpi)
MAX_LABELS = 100       # tick labels per axis at most


def plot_curves(history: list[dict], path: str, names=("train/loss", "eval/loss")) -> None:
  """Draws each metric in `names` against `step` from metrics.jsonl records."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in names:
    points = [(r["step"], r[name]) for r in history if name in r]
    if points:
      ax.plot(*zip(*points), label=name, marker="." if len(points) < 30 else None)
  ax.set_xlabel("step")
  ax.set_yscale("log" if all(r.get(n, 1) > 0 for r in history for n in names) else "linear")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  _save(fig, path)


def plot_heatmap(heatmap: Heatmap, path: str) -> None:
  """Weights [rows, cols] with token labels; rows are outputs, columns inputs. Large
  matrices are drawn at most MAX_INCHES a side with every k-th label (MAX_LABELS at most)."""
  values = np.asarray(heatmap.values, np.float32)
  rows, cols = values.shape
  fig, ax = plt.subplots(figsize=(min(MAX_INCHES, max(4, 0.3 * cols + 1.5)),
                                  min(MAX_INCHES, max(3, 0.3 * rows + 1))))
  image = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
  for set_ticks, labels in ((ax.set_xticks, heatmap.col_labels),
                            (ax.set_yticks, heatmap.row_labels)):
    every = -(-len(labels) // MAX_LABELS)             # a large matrix: every k-th label
    set_ticks(range(0, len(labels), every), labels[::every], fontsize=8)
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  ax.set_title(heatmap.title, fontsize=9)
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  _save(fig, path)


def _save(fig, path: str) -> None:
  """The figure as a PNG file, written whole (see research/files.py); closes it."""
  try:
    with atomic_write(path, "wb") as f:
      fig.savefig(f, format="png", dpi=100)
  finally:
    plt.close(fig)


def figure_png(fig) -> bytes:
  """The figure as PNG bytes (e.g. for IPython.display.Image); closes it."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=100)
  plt.close(fig)
  return buffer.getvalue()


# ---- Weights & Biases ------------------------------------------------------------------------
WANDB_MODES = ("off", "online", "offline")    # config.wandb.mode
WANDB_RUN_ID = "run_id"        # WORKDIR/wandb/run_id: the W&B run a resume continues
WANDB_STEP = "step"            # the W&B metric every other is drawn against
WANDB_INSTALL = 'pip install -e ".[wandb]"'


def check_wandb_installed(config) -> None:
  """ConfigError where config.wandb.mode asks for W&B and its package is not installed."""
  if config.wandb.mode != "off" and importlib.util.find_spec("wandb") is None:
    raise ConfigError(f"config.wandb.mode={config.wandb.mode!r} needs the wandb package, which "
                      f"is not installed: {WANDB_INSTALL} (or set config.wandb.mode='off')")


class WandbRun:
  """An optional Weights & Biases run beside TensorBoard (config.wandb, the `wandb` extra;
  docs/running.md): process 0 logs the flattened config, every metrics.jsonl record against
  the W&B metric `step`, the plots and the final metrics; a resumed run continues its W&B
  run (WORKDIR/wandb/run_id), and a failing W&B call warns once and never stops the run. A
  context manager: nothing until `start`, nothing at all where
  config.wandb.mode is 'off' or on a process other than 0. Leaving the context finishes the
  W&B run, marked failed (exit code 1) when an exception leaves it."""

  def __init__(self, settings, workdir: str):
    """`settings`: config.wandb (mode, project, entity, name); `workdir`: the run's."""
    self.settings, self.workdir, self.run = settings, workdir, None

  def __enter__(self) -> "WandbRun":
    return self

  def __exit__(self, kind, error, traceback) -> None:
    self._finish(exit_code=0 if kind is None else 1)

  def start(self, hyperparameters: dict, resumed: bool) -> None:
    """Starts (or, `resumed` from a checkpoint, continues) the workdir's W&B run with the
    flattened config as its hyperparameters; prints where it is, in one line."""
    if self.settings.mode == "off" or jax.process_index() != 0:
      return
    with self._guard("to start"):
      import wandb  # noqa: PLC0415   (the optional extra: imported where it is used)

      run_id_path = os.path.join(self.workdir, WANDB, WANDB_RUN_ID)
      previous = _read_text(run_id_path) if resumed else None
      os.makedirs(os.path.dirname(run_id_path), exist_ok=True)
      self.run = wandb.init(
          project=self.settings.project or None, entity=self.settings.entity or None,
          name=self.settings.name or os.path.basename(os.path.abspath(self.workdir)),
          mode=self.settings.mode, dir=self.workdir, id=previous,
          resume="allow" if previous else None,
          settings=wandb.Settings(silent=True, console="off"))
      self.run.config.update(hyperparameters, allow_val_change=True)
      self.run.define_metric(WANDB_STEP)
      self.run.define_metric("*", step_metric=WANDB_STEP)
      files.write_text(run_id_path, self.run.id)
      where = (self.run.url if self.settings.mode == "online" else
               f"{self.run.settings.sync_dir} (upload it with `wandb sync "
               f"{self.run.settings.sync_dir}`)")
      print(f"Weights & Biases: {'continuing' if previous else 'logging to'} run {self.run.id}"
            f" in {where}", file=sys.stderr, flush=True)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """One history row: the values of a metrics.jsonl record at its step."""
    if self.run is not None:
      with self._guard(f"to log step {step}"):
        self.run.log({WANDB_STEP: step, **values})

  def images(self, step: int, paths: dict[str, str]) -> None:
    """The PNG files {name: path} as images `plots/<name>` at `step`."""
    if self.run is not None:
      with self._guard("to log the plots"):
        import wandb  # noqa: PLC0415

        self.run.log({WANDB_STEP: step, **{f"plots/{name}": wandb.Image(path)
                                     for name, path in paths.items()}})

  def summary(self, values: dict) -> None:
    """The run's final metrics as the W&B run's summary."""
    if self.run is not None:
      with self._guard("to write the summary"):
        self.run.summary.update(values)

  def _finish(self, exit_code: int) -> None:
    if self.run is not None:
      run, self.run = self.run, None
      with self._guard("to finish"):
        run.finish(exit_code=exit_code)

  @contextlib.contextmanager
  def _guard(self, what: str):
    """An exception of the block: one warning line, and W&B left for the rest of the run."""
    try:
      yield
    except Exception as error:  # noqa: BLE001   (W&B is never a reason to stop training)
      run, self.run = self.run, None
      print(f"warning: Weights & Biases failed {what} ({type(error).__name__}: {error}); the "
            "run goes on without it (metrics.jsonl and TensorBoard hold every record)",
            file=sys.stderr, flush=True)
      if run is not None:               # stop W&B's own process; the warning above says why
        with contextlib.suppress(Exception):
          run.finish(exit_code=1)


def _read_text(path: str) -> str | None:
  """The run id stored at `path`, None where there is none."""
  try:
    with open(path) as f:
      return f.read().strip() or None
  except FileNotFoundError:
    return None


# ---- Profiler traces (config.train.profile_steps) ---------------------------------------------
ANNOTATION = "train"   # the name of each step's trace annotation


def parse_profile_steps(text: str) -> tuple[int, int] | None:
  """"A,B" -> (A, B), "A" -> (A, A), "" -> None; ValueError for anything else."""
  if text == "":
    return None
  parts = text.split(",") if isinstance(text, str) else []
  if not 1 <= len(parts) <= 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"must be 'FIRST,LAST' or 'STEP' (step numbers, e.g. '10,12'), or '' "
                     f"for no trace; got {text!r}")
  first, last = int(parts[0]), int(parts[-1])
  return first, last


def check_profile_steps(config) -> None:
  """ConfigError unless config.train.profile_steps is '' or 1 <= FIRST <= LAST <= num_steps."""
  text = config.train.profile_steps
  try:
    steps = parse_profile_steps(text)
  except ValueError as error:
    raise ConfigError(f"config.train.profile_steps {error}") from None
  if steps is not None and not 1 <= steps[0] <= steps[1] <= config.train.num_steps:
    raise ConfigError(f"config.train.profile_steps={text!r} must be steps FIRST <= LAST "
                      f"within 1 … config.train.num_steps={config.train.num_steps}")


class Profiler:
  """config.train.profile_steps ("FIRST,LAST"): a jax.profiler trace of those steps into
  WORKDIR/profile (TensorBoard's profile plugin, XProf, Perfetto; docs/running.md). Starts the
  trace before the first profiled step, annotates each ("train", step_num), and stops it once
  the last one's state is computed (or when the loop ends early)."""

  def __init__(self, text: str, workdir: str):
    self.steps, self.directory, self.tracing = parse_profile_steps(text), os.path.join(workdir, PROFILE), False

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    if self.tracing:
      self.tracing = False
      jax.profiler.stop_trace()

  def step(self, step: int):
    """The context of one training step: traced and annotated within the range."""
    if self.steps is None or not self.steps[0] <= step <= self.steps[1]:
      return contextlib.nullcontext()
    if not self.tracing:
      self.tracing = True
      jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
    return jax.profiler.StepTraceAnnotation(ANNOTATION, step_num=step)

  def after(self, step: int, state) -> None:
    """Ends the trace once the last profiled step's `state` is computed."""
    if self.tracing and step >= self.steps[1]:
      jax.block_until_ready(state)
      self.__exit__()


def trace_files(workdir: str) -> list[str]:
  """The Perfetto traces `Profiler` wrote into `workdir`, oldest first."""
  return sorted(glob.glob(os.path.join(workdir, PROFILE, "plugins", "profile", "*",
                                       "perfetto_trace.json.gz")))


def profile_summary(path: str, top: int = 15) -> dict:
  """{"steps": [(step, ms)], "operations": [(name, total ms, count)]} of a Perfetto trace:
  each annotated step's wall time, and the `top` operations of the devices' threads by
  total time (the device's processes are those whose name holds "GPU" or "TPU"; on a
  CPU every thread but the annotations and the Python tracer's "$file:line" events)."""
  with gzip.open(path, "rt", encoding="utf-8") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, name in names.items() if "GPU" in name or "TPU" in name}
  steps = [(int(e["args"]["step_num"]), e["dur"] / 1e3) for e in events
           if e.get("ph") == "X" and e.get("name") == ANNOTATION]
  totals, counts = collections.Counter(), collections.Counter()
  for e in events:
    if (e.get("ph") == "X" and e.get("name") != ANNOTATION and not e["name"].startswith("$")
        and (not devices or e["pid"] in devices)):
      totals[e["name"]] += e["dur"] / 1e3
      counts[e["name"]] += 1
  return {"steps": sorted(steps),
          "operations": [(name, ms, counts[name]) for name, ms in totals.most_common(top)]}
