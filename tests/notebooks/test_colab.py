"""notebooks/colab.py, what the notebooks' cells call: runs read back, every line of a run
shown, and runs/ kept on Google Drive when the first cell's checkbox asks for it."""

import importlib.machinery
import os
import sys
import tempfile
import types

import pytest

from research.training import workdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "notebooks"))
import colab  # noqa: E402

DISTRIBUTION = "jax-attention-recurrence"       # pyproject.toml's [project] name


def test_a_finished_runs_non_finite_final_metrics_are_read_back(tmp_path):
  workdir.write_json(str(tmp_path / "final_metrics.json"), {"train/grad_norm": float("inf")})
  assert colab.train(None, str(tmp_path)) == {"train/grad_norm": float("inf")}


def test_full_mode_works_in_the_root_so_a_launched_sweep_is_the_notebooks(tmp_path,
                                                                          monkeypatch):
  """A config's relative data.dir ("data") then names root/data, as for `python launch.py`
  run in the root: a sweep launched there resumes in the notebook (its record's config
  equal); the quick mode leaves the working directory as it was."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv(colab.QUICK_VARIABLE, "1")
  quick, _, workdir_ = colab.setup(ROOT, "listops")
  assert quick and os.getcwd() == str(tmp_path) and workdir_.startswith(tempfile.gettempdir())
  monkeypatch.setenv(colab.QUICK_VARIABLE, "0")
  quick, experiment, workdir_ = colab.setup(ROOT, "listops", runs="listops_cpu")
  assert not quick and os.getcwd() == ROOT
  assert workdir_ == os.path.join(ROOT, "runs", "listops_cpu")
  assert os.path.abspath(experiment.get_config("preset=cpu").data.dir) == os.path.join(ROOT,
                                                                                      "data")


def test_training_shows_every_line_the_run_prints(tmp_path, monkeypatch, capsys):
  """The W&B run's address, warnings, a workdir taken over: nothing is filtered out."""
  lines = ["wandb: 🚀 View run at https://wandb.ai/me/project/runs/abc",
           "warning: Weights & Biases failed to log (OSError: disk full); the run goes on",
           "taking over the workdir: its last holder (pid 12) is gone"]

  def train_and_evaluate(config, directory, experiment):
    for line in lines:
      print(line, file=sys.stderr)
    return {"eval/loss": 1.0}

  monkeypatch.setattr("research.training.train_and_evaluate", train_and_evaluate)
  config = types.SimpleNamespace(experiment="nmt_dates")
  assert colab.train(config, str(tmp_path / "run")) == {"eval/loss": 1.0}
  assert capsys.readouterr().err.splitlines() == lines


@pytest.fixture
def colab_with_drive(tmp_path, monkeypatch):
  """A stand-in for google.colab whose drive.mount makes the mount point; the mounts."""
  mounts = []

  def mount(path):
    mounts.append(path)
    os.makedirs(os.path.join(path, "MyDrive"), exist_ok=True)

  module = types.ModuleType("google.colab")
  module.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)
  module.drive = types.SimpleNamespace(mount=mount)
  monkeypatch.setitem(sys.modules, "google.colab", module)
  monkeypatch.setattr(colab, "DRIVE", str(tmp_path / "drive"))
  return mounts


def checkout(tmp_path) -> str:
  root = tmp_path / "research-repo"
  root.mkdir()
  (root / "pyproject.toml").write_text(f'[project]\nname = "{DISTRIBUTION}"\n')
  return str(root)


def test_runs_on_drive_link_runs_to_the_mounted_drive(tmp_path, colab_with_drive, capsys):
  root = checkout(tmp_path)
  colab.keep_runs_on_drive(root)
  target = tmp_path / "drive" / "MyDrive" / DISTRIBUTION / "runs"
  assert colab_with_drive == [str(tmp_path / "drive")]
  assert os.path.islink(os.path.join(root, "runs")) and target.is_dir()
  assert os.path.realpath(os.path.join(root, "runs")) == os.path.realpath(target)
  # A run written through the link lands on Drive; the cell run again keeps the link.
  os.makedirs(os.path.join(root, "runs", "nmt_dates"))
  colab.keep_runs_on_drive(root)
  assert (target / "nmt_dates").is_dir()
  assert capsys.readouterr().out.splitlines() == [f"runs/ is {target} on Google Drive"]


def test_runs_on_drive_keeps_a_runs_folder_there_already(tmp_path, colab_with_drive, capsys):
  root = checkout(tmp_path)
  os.makedirs(os.path.join(root, "runs", "finished"))
  colab.keep_runs_on_drive(root)
  assert not os.path.islink(os.path.join(root, "runs"))
  assert os.path.isdir(os.path.join(root, "runs", "finished"))
  (line,) = capsys.readouterr().out.splitlines()
  assert line.startswith(f"RUNS_ON_DRIVE: {root}/runs exists already and is kept")


def test_runs_on_drive_elsewhere_than_colab_says_so_and_mounts_nothing(tmp_path, monkeypatch,
                                                                       capsys):
  monkeypatch.delitem(sys.modules, "google.colab", raising=False)
  monkeypatch.setattr(colab, "DRIVE", str(tmp_path / "drive"))
  root = checkout(tmp_path)
  colab.keep_runs_on_drive(root)
  assert not os.path.lexists(os.path.join(root, "runs")) and not os.path.exists(colab.DRIVE)
  assert capsys.readouterr().out.splitlines() == [
      f"RUNS_ON_DRIVE: Google Drive is mounted on Colab only; the runs stay in {root}/runs"]
