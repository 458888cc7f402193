"""`config.train.profile_steps`: a `jax.profiler` trace of chosen training steps.

    python launch.py --workdir W --config.train.profile_steps=10,12

traces steps 10 … 12 into W/profile/plugins/profile/<time>/: `<host>.xplane.pb` (for
TensorBoard's profile plugin or XProf: `tensorboard --logdir W/profile`) and
`perfetto_trace.json.gz` (drop it on https://ui.perfetto.dev). Each step is annotated
("train", step_num) as TensorBoard's step view expects. The steps are compiled before the
loop starts, so a trace holds no compilation; the trace stops after the last step's
results are on the host side of the device, and a resumed run traces the steps of the
range it still runs. `summary` lists the costliest operations of a trace.
"""

import collections
import contextlib
import glob
import gzip
import json
import os

import jax

from research.errors import ConfigError

DIRECTORY = "profile"
ANNOTATION = "train"   # the name of each step's trace annotation


def parse_steps(text: str) -> tuple[int, int] | None:
  """"A,B" -> (A, B), "A" -> (A, A), "" -> None; ValueError for anything else."""
  if text == "":
    return None
  parts = text.split(",") if isinstance(text, str) else []
  if not 1 <= len(parts) <= 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"must be 'FIRST,LAST' or 'STEP' (step numbers, e.g. '10,12'), or '' "
                     f"for no trace; got {text!r}")
  first, last = int(parts[0]), int(parts[-1])
  return first, last


def check(config) -> None:
  """ConfigError unless config.train.profile_steps is '' or 1 <= FIRST <= LAST <= num_steps."""
  text = config.train.profile_steps
  try:
    steps = parse_steps(text)
  except ValueError as error:
    raise ConfigError(f"config.train.profile_steps {error}") from None
  if steps is not None and not 1 <= steps[0] <= steps[1] <= config.train.num_steps:
    raise ConfigError(f"config.train.profile_steps={text!r} must be steps FIRST <= LAST "
                      f"within 1 … config.train.num_steps={config.train.num_steps}")


class Profiler:
  """Starts the trace before the first profiled step, annotates each profiled step, and
  stops it after the last (or when the loop ends early)."""

  def __init__(self, text: str, workdir: str):
    self.steps, self.directory, self.tracing = parse_steps(text), os.path.join(workdir, DIRECTORY), False

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
  return sorted(glob.glob(os.path.join(workdir, DIRECTORY, "plugins", "profile", "*",
                                       "perfetto_trace.json.gz")))


def summary(path: str, top: int = 15) -> dict:
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
