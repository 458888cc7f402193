"""What every notebook runs right after its own install cell (which must come first, for Colab).

The install cell puts the checkout `root` on `sys.path` and calls `install(root)`; the next
cell reads the notebook's mode, experiment and work directory from `setup`, and trains
with `train` (one run) or `sweep` (a config's points).
"""

# The standard library alone at module level: install() runs before the package's
# dependencies are installed.
import contextlib
import importlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import types

QUICK_VARIABLE = "NOTEBOOK_QUICK"   # "1": CI's small sizes, a temporary work directory


def install(root: str) -> None:
  """`pip install -e root` (with the package's dependencies) unless the distribution that
  root's pyproject.toml names is installed already. The installed jax and jaxlib are
  named at their own versions, so pip keeps them (Colab's carry its GPU or TPU plugin).

  pip's editable install adds a `.pth` file, which Python reads only at start-up: a
  running kernel imports the package because the caller put `root` on `sys.path`."""
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    name = tomllib.load(f)["project"]["name"]
  if _installed_version(name) is not None:
    return
  keep = [f"{package}=={version}" for package in ("jax", "jaxlib")
          if (version := _installed_version(package)) is not None]
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", root, *keep], check=True)
  importlib.invalidate_caches()     # the dependencies pip just added, in this process


def setup(root: str, experiment: str, runs: str | None = None,
          ) -> tuple[bool, types.ModuleType, str]:
  """Returns (quick, the config module experiments/<experiment>.py, workdir).

  quick: `NOTEBOOK_QUICK=1` in the environment (CI runs every notebook so). workdir: a new
  temporary directory in quick mode, else root/runs/<runs, default the experiment's name>,
  where finished runs are read back rather than trained again. The cell after the install
  cell:

      from research import notebook
      QUICK, experiment, workdir = notebook.setup(root, "nmt_dates")
      final_metrics = notebook.train(experiment.get_config("attention=dot"), workdir)
  """
  quick = os.environ.get(QUICK_VARIABLE, "0") == "1"
  configs = os.path.join(root, "experiments")        # the experiments' config files
  if configs not in sys.path:
    sys.path.insert(0, configs)
  module = importlib.import_module(experiment)
  name = runs or experiment
  workdir = (tempfile.mkdtemp(prefix=f"{name}_") if quick
             else os.path.join(root, "runs", name))
  return quick, module, workdir


def train(config, workdir: str) -> dict:
  """The final metrics of `config` trained into workdir: read back from its
  final_metrics.json when the run has finished, else trained (validated first), its
  progress shown as one bar with the ETA (`ProgressBar`)."""
  done = os.path.join(workdir, "final_metrics.json")
  # Imported here, not at the top: install() runs before the dependencies are installed.
  from research import experiments
  from research.training import train_and_evaluate
  from research.training.workdir import read_json
  if os.path.exists(done):
    return read_json(done)         # its non-finite values too
  with contextlib.redirect_stderr(ProgressBar(os.path.basename(workdir))):
    return train_and_evaluate(config, workdir, experiments.get(config.experiment))


def sweep(config, points: list[dict], workdir: str) -> list[dict]:
  """`run_sweep` (finished points read back), its progress shown as one bar per point
  trained: one row per point, its overrides and final metrics."""
  from research import experiments
  from research.training import run_sweep
  with contextlib.redirect_stderr(ProgressBar(os.path.basename(workdir))):
    return run_sweep(config, points, workdir, experiments.get(config.experiment))


class ProgressBar(io.TextIOBase):
  """A stderr for training in a notebook: the loop's progress lines ("step 120/500  loss
  0.42  12.3 steps/s  ETA 0m31s") drawn as one line updated in place,

      nmt_dates  run 1  [########------------]  120/500  loss 0.42  12.3 steps/s  ETA 0m31s

  (a new "run k" when the steps start again: a sweep's next point); every other line
  (resuming, taking over a workdir) is kept out, as the run's metrics.jsonl holds the
  records. In IPython one display is updated; elsewhere a carriage return rewrites it."""

  WIDTH = 20
  PATTERN = re.compile(r"step (\d+)/(\d+)  (.*)")

  def __init__(self, label: str):
    self.label, self.run, self.last_step, self.pending, self.handle = label, 0, None, "", None

  def writable(self) -> bool:
    return True

  def write(self, text: str) -> int:
    self.pending += text
    *lines, self.pending = re.split(r"[\r\n]", self.pending)
    for line in lines:
      match = self.PATTERN.match(line.strip())
      if match:
        self._draw(int(match[1]), int(match[2]), match[3])
    return len(text)

  def _draw(self, step: int, num_steps: int, rest: str) -> None:
    if self.last_step is None or step < self.last_step:
      self.run, self.handle = self.run + 1, None
    self.last_step = step
    done = round(self.WIDTH * step / max(num_steps, 1))
    line = (f"{self.label}  run {self.run}  [{'#' * done}{'-' * (self.WIDTH - done)}]  "
            f"{step}/{num_steps}  {rest}")
    try:
      from IPython import get_ipython
      from IPython.display import display
    except ImportError:
      get_ipython = lambda: None
    if get_ipython() is None:
      print("\r" + line, end="\n" if step >= num_steps else "", file=sys.__stdout__, flush=True)
    elif self.handle is None:
      self.handle = display({"text/plain": line}, raw=True, display_id=True)
    else:
      self.handle.update({"text/plain": line}, raw=True)


def _installed_version(distribution: str) -> str | None:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return None
