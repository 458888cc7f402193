"""The Weights & Biases writer, offline (no network), its files read back with W&B's own reader
(`wandb leet inspect`, the command that prints a run's transaction log)."""

import glob
import json
import os
import subprocess
import sys

import pytest
import tiny

from research.errors import ConfigError
from research.training.config import apply_overrides, base_config, check_shared
from research.training.loop import train_and_evaluate
from research.training.metrics import MetricsWriter, WandbRun


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
  """W&B without a network, its caches under tmp_path."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def _inspect(run_directory: str, *flags: str) -> str:
  return subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", *flags,
                         run_directory], capture_output=True, text=True, check=True).stdout


def _runs(workdir) -> list[str]:
  """The offline W&B runs' directories under WORKDIR/wandb."""
  return glob.glob(os.path.join(workdir, "wandb", "offline-run-*"))


def _history(run_directory: str) -> list[dict]:
  """The run's history rows, W&B's own keys (_step, _runtime, ...) left out."""
  records = [json.loads(line) for line in _inspect(run_directory).splitlines()]
  return [{k: v for k, v in r["history"]["item"].items() if not k.startswith("_")}
          for r in records if r["type"] == "history"]


def _flat(tree: dict, prefix: str = "") -> dict:
  return {k: v for key, value in tree.items() for k, v in
          (_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
           else {f"{prefix}{key}": value}).items()}


def _offline_settings(**changes):
  """config.wandb with mode 'offline' and `changes` (name="x": config.wandb.name)."""
  changes = {f"wandb.{key}": value for key, value in changes.items()}
  return apply_overrides(base_config(), {"wandb.mode": "offline", **changes}).wandb


@pytest.mark.slow
@pytest.mark.long
def test_an_offline_run_holds_every_record_the_config_and_the_plots(tmp_path):
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(tiny.config(**{"wandb.mode": "offline"}), workdir, tiny.task())
  (run,) = _runs(workdir)
  history = _history(run)
  assert history[:-1] == tiny.records(workdir)     # each metrics.jsonl record, at its step
  *_, plots = history
  assert plots["step"] == 60 and plots["plots/loss._type"] == "image-file"
  with open(os.path.join(run, "files", plots["plots/loss.path"]), "rb") as logged, \
       open(os.path.join(workdir, "loss.png"), "rb") as drawn:
    assert logged.read() == drawn.read()
  summary = json.loads(_inspect(run, "--summary"))
  with open(os.path.join(workdir, "config.json")) as f:
    assert summary["config"] == _flat(json.load(f))
  assert summary["config"]["model.hidden_size"] == 16 and summary["name"] == "run"
  assert {k: summary["summary"][k] for k in final} == final
  assert (summary["state"], summary["exit_code"]) == ("finished", 0)
  with open(os.path.join(workdir, "wandb", "run_id")) as f:
    assert summary["run_id"] == f.read() == run.rsplit("-", 1)[1]


def test_a_resumed_run_continues_its_wandb_run_and_a_new_start_begins_another(tmp_path):
  ids = []
  for resumed in (False, True, False):
    with WandbRun(_offline_settings(name="mine"), str(tmp_path)) as wandb_run:
      wandb_run.start({"train.num_steps": 10 * (len(ids) + 1)}, resumed=resumed)
      ids.append(wandb_run.run.id)
  assert ids[1] == ids[0] != ids[2]
  runs = sorted((json.loads(_inspect(run, "--summary")) for run in _runs(tmp_path)),
                key=lambda run: run["start_time"])
  assert [(r["run_id"], r["name"], r["config"]) for r in runs] == [
      (ids[0], "mine", {"train.num_steps": 10}), (ids[1], "mine", {"train.num_steps": 20}),
      (ids[2], "mine", {"train.num_steps": 30})]


def test_a_failing_wandb_call_warns_once_and_the_metrics_go_on(tmp_path, capsys):
  with WandbRun(_offline_settings(), str(tmp_path)) as wandb_run:
    wandb_run.start({}, resumed=False)

    def fail(values):
      raise OSError(28, "No space left on device")

    wandb_run.run.log = fail
    writer = MetricsWriter(str(tmp_path), wandb_run=wandb_run)
    for step in (10, 20):
      writer.write(step, {"train/loss": 1 / step})
    wandb_run.images(20, {"loss": str(tmp_path / "loss.png")})
    writer.close()
  warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
  assert warnings == ["warning: Weights & Biases failed to log step 10 (OSError: [Errno 28] No "
                      "space left on device); the run goes on without it (metrics.jsonl and "
                      "TensorBoard hold every record)"]
  assert tiny.records(str(tmp_path)) == [{"step": 10, "train/loss": 0.1},
                                         {"step": 20, "train/loss": 0.05}]


def test_mode_and_package_are_checked_before_anything_compiles(monkeypatch):
  with pytest.raises(ConfigError, match=r"config\.wandb\.mode='on' is not allowed; choose one "
                                        r"of: 'off', 'online', 'offline'"):
    check_shared(apply_overrides(base_config(), {"wandb.mode": "on"}))
  monkeypatch.setitem(sys.modules, "wandb", None)          # as if it were not installed
  check_shared(base_config())                               # 'off' needs no package
  with pytest.raises(ConfigError, match=r"config\.wandb\.mode='online' needs the wandb package, "
                                        r"which is not installed: pip install -e \"\.\[wandb\]\""):
    check_shared(apply_overrides(base_config(), {"wandb.mode": "online"}))
