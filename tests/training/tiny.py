"""A tiny sequence_tasks config shared by the runtime tests: seconds per run on 2 cores."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "sequence_tasks.py") + ":task=adding,model=lstm"
OVERRIDES = {"data.length": 12, "data.eval_examples": 64, "model.hidden_size": 16,
             "train.batch_size": 16, "train.num_steps": 60, "train.learning_rate": 0.01,
             "train.log_every": 10, "train.eval_every": 30, "train.checkpoint_every": 20}


def config(**overrides):
  """The tiny config as an ml_collections.ConfigDict (for in-process runs)."""
  return _loaded(CONFIG, {**OVERRIDES, **overrides})


def _loaded(spec: str, overrides: dict):
  """launch.py's config `spec` (FILE:VARIANTS) with `overrides` applied."""
  from research.training.config import apply_overrides, load_config  # noqa: PLC0415

  loaded, _ = load_config(spec)
  return apply_overrides(loaded, overrides)


# A tiny mqar (length 16, width 32, 2 blocks) with a selective recurrence in attention's place:
# kind: its state size and options at width 32
SELECTIVE = {"mamba": (8, {}), "mamba2": (16, {"head_dim": 16}), "gla": (16, {}),
             "deltanet": (16, {"use_gate": True})}


def selective_config(kind: str, **overrides):
  """The tiny mqar config with `kind` (SELECTIVE), its parallel form in chunks of 4 steps."""
  state_size, options = SELECTIVE[kind]
  recurrence = {f"model.recurrence.{kind}.{key}": value
                for key, value in {"chunk_size": 4, **options}.items()}
  return _loaded(os.path.join(ROOT, "experiments", "mqar.py") + ":preset=cpu", {
      "data.length": 16, "data.num_pairs": 4, "data.vocab_size": 32,
      "data.train_examples": 64, "data.eval_examples": 16, "train.batch_size": 16,
      "model.kind": kind, "model.hidden_size": 32, "model.state_size": state_size,
      "model.mlp_size": 0, **recurrence, **overrides})


def task():
  """The tiny config's task, as launch.py resolves it."""
  from research import experiments  # noqa: PLC0415

  return experiments.get("sequence_tasks")


def launch_command(workdir: str, flags: tuple[str, ...] = (), **overrides) -> list[str]:
  """launch.py on the tiny config with `overrides`; `flags`: launch.py's other flags."""
  overriding = [f"--config.{k}={v}" for k, v in {**OVERRIDES, **overrides}.items()]
  return [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={CONFIG}",
          f"--workdir={workdir}", *flags, *overriding]


COMPILATION_CACHE = os.path.join(tempfile.gettempdir(), f"research-tests-xla-cache-{os.getuid()}")


def environment(devices: int = 1) -> dict:
  """A launch.py subprocess's environment: `devices` CPU devices, and JAX's persistent
  compilation cache, so the many runs of the tiny config compile its steps once; the test
  session's other XLA flags (tests/conftest.py) stay."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  return {**os.environ, "XLA_FLAGS": flags.strip(),
          "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": COMPILATION_CACHE,
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def run(workdir: str, devices: int = 1, flags: tuple[str, ...] = (),
        **overrides) -> subprocess.CompletedProcess:
  return subprocess.run(launch_command(workdir, flags, **overrides), env=environment(devices),
                        capture_output=True, text=True, timeout=600)


def start(workdir: str, devices: int = 1, flags: tuple[str, ...] = (),
          **overrides) -> subprocess.Popen:
  """launch.py on the tiny config in the background, its output captured."""
  return subprocess.Popen(launch_command(workdir, flags, **overrides), env=environment(devices),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def write_json(path: str, content) -> None:
  """A workdir's JSON file (config.json, sweep.json) as a run would leave it, its directory
  made."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(content, f)


def files_under(directory) -> dict | None:
  """{relative path: content} of every file under directory, None where there is none: equal
  before and after a command that left it as it found it (created nothing, changed nothing)."""
  if not os.path.exists(directory):
    return None
  tree = {}
  for parent, _, names in os.walk(directory):
    for name in names:
      with open(os.path.join(parent, name), "rb") as f:
        tree[os.path.relpath(os.path.join(parent, name), directory)] = f.read()
  return tree


def records(workdir: str, name: str | None = None) -> list:
  """metrics.jsonl's records, or the (step, value) pairs of metric `name`."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.endswith("\n")]
  return rows if name is None else [(r["step"], r[name]) for r in rows if name in r]


def _wait(done, what: str, process: subprocess.Popen, timeout: float):
  """Blocks until done() is true; the run must still be going on."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert process.poll() is None, process.communicate()[1][-2000:]
    if done():
      return
    time.sleep(0.01)
  raise TimeoutError(f"no {what} within {timeout} s")


def wait_for_step(workdir: str, step: int, process: subprocess.Popen, timeout: float = 300):
  """Blocks until metrics.jsonl has a train/loss record at `step` or later."""
  _wait(lambda: any(s >= step for s, _ in records(workdir, "train/loss")), f"step {step}",
        process, timeout)


def wait_for_checkpoint(workdir: str, step: int, process: subprocess.Popen, timeout: float = 300):
  """Blocks until the checkpoint of `step` is complete (Orbax renamed its directory)."""
  _wait(lambda: os.path.isdir(os.path.join(workdir, "checkpoints", str(step))),
        f"complete checkpoint of step {step}", process, timeout)


@contextlib.contextmanager
def unwritable(path: str):
  """`path` (a directory or a file) made unwritable for this process while the block runs,
  as a user makes it: immutable (`chattr +i`) for root, whom permissions do not stop, else
  read-only. Checked for real first (the test is skipped where it cannot be done)."""
  if os.geteuid() == 0:
    made = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
    undo = ["chattr", "-i", path]
    if made.returncode != 0:
      pytest.skip(f"chattr +i is refused here: {made.stderr.strip()}")
  else:
    mode = os.stat(path).st_mode
    os.chmod(path, mode & ~0o222)
    undo = None
  try:
    if _writable(path):
      pytest.skip(f"{path} stays writable for this process")
    yield path
  finally:
    if undo is not None:
      subprocess.run(undo, check=True)
    else:
      os.chmod(path, mode)


def _writable(path: str) -> bool:
  """Whether a file can be made in the directory `path`, or the file `path` opened to append."""
  try:
    if os.path.isdir(path):
      probe = os.path.join(path, ".tiny-probe")
      os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
      os.remove(probe)
    else:
      os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
  except OSError:
    return False
  return True


class PoisonedStream:
  """Wraps a stream so that the batches of steps >= first_bad hold NaN inputs."""

  def __init__(self, stream, first_bad):
    self.stream, self.first_bad, self.batch_size = stream, first_bad, stream.batch_size

  def __next__(self):
    batch = next(self.stream)
    if self.stream.get_state()["step"] >= self.first_bad:
      batch = {**batch, "inputs": np.full_like(batch["inputs"], np.nan)}
    return batch

  def get_state(self):
    return self.stream.get_state()

  def set_state(self, state):
    self.stream.set_state(state)


def capturing(experiment, captured: list):
  """The experiment whose workloads hand the parameters the loop ends with (those its report
  gets) to `captured`, then report as the experiment does."""
  from research.training.experiment import Report  # noqa: PLC0415

  def build(config):
    workload = experiment.build(config)

    def report(params):
      captured.append(params)
      return workload.report(params) if workload.report is not None else Report({})

    return workload._replace(report=report)

  return experiment._replace(build=build)
