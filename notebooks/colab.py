"""What the notebooks share, beside them rather than in the package: their first cell puts the
checkout and this folder on sys.path and calls `install` (pip, the JAX installed kept, runs/
on Google Drive if asked); the next cells read the mode, experiment and workdir from `setup`
and train with `train` (one run) or `sweep` (a config's points), finished runs read back.
"""

# The standard library alone at module level: install() runs before the package's
# dependencies are installed.
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import tomllib
import types

QUICK_VARIABLE = "NOTEBOOK_QUICK"   # "1": CI's small sizes, a temporary work directory
DRIVE = "/content/drive"            # where Colab mounts Google Drive


def install(root: str, runs_on_drive: bool = False) -> None:
  """`pip install -e root[compare]` (the package's dependencies, and pandas) unless the
  distribution that root's pyproject.toml names is installed already. The installed jax and
  jaxlib are named at their own versions, so pip keeps them (Colab's carry its GPU or TPU
  plugin). pip's editable install adds a `.pth` file, which Python reads only at start-up: a
  running kernel imports the package because the first cell put `root` on `sys.path`. With
  `runs_on_drive`, root/runs is kept on Google Drive (`keep_runs_on_drive`)."""
  name = _distribution(root)
  if _installed_version(name) is None:
    keep = [f"{package}=={version}" for package in ("jax", "jaxlib")
            if (version := _installed_version(package)) is not None]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{root}[compare]", *keep],
                   check=True)     # [compare]: pandas, for research.predict.compare_runs' tables
    importlib.invalidate_caches()     # the dependencies pip just added, in this process
  if runs_on_drive:
    keep_runs_on_drive(root)


def keep_runs_on_drive(root: str) -> None:
  """root/runs as a link to MyDrive/<distribution>/runs on Google Drive, mounted first (on
  Colab only; elsewhere one line says runs/ stays where it is). A run resumes from the last
  checkpoint in its workdir and a sweep skips its finished points, so the notebook run again
  on a new runtime goes on where the last one stopped."""
  runs = os.path.join(root, "runs")
  if not _on_colab():
    print(f"RUNS_ON_DRIVE: Google Drive is mounted on Colab only; the runs stay in {runs}")
    return
  from google.colab import drive
  drive.mount(DRIVE)
  target = os.path.join(DRIVE, "MyDrive", _distribution(root), "runs")
  os.makedirs(target, exist_ok=True)
  if os.path.islink(runs) and os.path.realpath(runs) == os.path.realpath(target):
    return
  if os.path.lexists(runs):
    print(f"RUNS_ON_DRIVE: {runs} exists already and is kept; move it to {target} to keep it "
          "on Drive")
    return
  os.symlink(target, runs)
  print(f"runs/ is {target} on Google Drive")


def setup(root: str, experiment: str, runs: str | None = None,
          ) -> tuple[bool, types.ModuleType, str]:
  """Returns (quick, the config module experiments/<experiment>.py, workdir).

  quick: `NOTEBOOK_QUICK=1` in the environment (CI runs every notebook so). workdir: a new
  temporary directory in quick mode, else root/runs/<runs, default the experiment's name>,
  where finished runs are read back rather than trained again; the kernel then works in
  root, so that a config's relative paths (listops' data.dir "data") mean what they mean to
  `python launch.py` run there, and a sweep launched so is the notebook's sweep. The cell
  after the first:

      QUICK, experiment, workdir = colab.setup(root, "nmt_dates")
      final_metrics = colab.train(experiment.get_config("attention=dot"), workdir)
  """
  quick = os.environ.get(QUICK_VARIABLE, "0") == "1"
  configs = os.path.join(root, "experiments")        # the experiments' config files
  if configs not in sys.path:
    sys.path.insert(0, configs)
  module = importlib.import_module(experiment)
  name = runs or experiment
  if quick:
    return quick, module, tempfile.mkdtemp(prefix=f"{name}_")
  os.chdir(root)
  return quick, module, os.path.join(root, "runs", name)


def train(config, workdir: str) -> dict:
  """The final metrics of `config` trained into workdir: read back from its
  final_metrics.json when the run has finished, else trained (validated first), its progress
  a tqdm bar and every other line of the run (warnings, the W&B run's address) as printed."""
  # Imported here, not at the top: install() runs before the dependencies are installed.
  from research import experiments
  from research.training import train_and_evaluate
  from research.training.workdir import read_json
  done = os.path.join(workdir, "final_metrics.json")
  if os.path.exists(done):
    return read_json(done)         # its non-finite values too
  return train_and_evaluate(config, workdir, experiments.get(config.experiment))


def sweep(config, points: list[dict], workdir: str) -> list[dict]:
  """`run_sweep` (finished points read back; a tqdm bar per point trained): one row per
  point, its overrides and final metrics."""
  from research import experiments
  from research.training import run_sweep
  return run_sweep(config, points, workdir, experiments.get(config.experiment))


def _distribution(root: str) -> str:
  """The distribution's name, from root/pyproject.toml."""
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["name"]


def _installed_version(distribution: str) -> str | None:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return None


def _on_colab() -> bool:
  try:
    return importlib.util.find_spec("google.colab") is not None
  except ModuleNotFoundError:      # no `google` namespace at all
    return False
