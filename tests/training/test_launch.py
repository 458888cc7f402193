"""launch.py as a user runs it: bad configs, files and workdirs, and 8 devices."""

import os
import re
import subprocess
import sys

import forked_launch
import pytest
import tiny

from research import experiments

pytestmark = pytest.mark.slow

NMT_DATES = os.path.join(tiny.ROOT, "experiments", "nmt_dates.py")
# name: (config ("tiny", or a file of the case's directory), {file: bytes}, flags, message);
# "{dir}" stands for the case's own directory. One case per kind of user error (the checks
# themselves are tested in process: tests/experiments, tests/data, test_workdir, test_config_file).
INVALID = {
    "unknown key": ("tiny", {}, ["--config.train.num_step=5"],
                    r"unknown config key config.train.num_step; keys under config.train: "),
    "wrong type": ("tiny", {}, ["--config.train.num_steps=many"],
                   "config.train.num_steps='many' must be of type int"),
    "heads do not divide": ("tiny", {}, ["--config.model.kind=transformer",
                                         "--config.model.num_heads=3"],
                            "config.model.num_heads=3 must divide config.model.hidden_size=16"),
    "batch vs devices": ("tiny", {}, ["--config.train.batch_size=12"],
                         "config.train.batch_size=12 must be divisible by the number of devices (8)"),
    "config does not parse": ("bad.py", {"bad.py": b"def get_config(:\n"}, [],
                              "--config: {dir}/bad.py does not parse: "),
    "unknown experiment": ("experiment.py", {"experiment.py": b"from research.training import base_config\n"
                                            b"def get_config():\n  c = base_config()\n"
                                            b"  c.experiment = 'nope'\n  return c\n"}, [],
                     "config.experiment='nope' is not allowed; choose one of: " +
                     ", ".join(f"'{name}'" for name in experiments.names())),
    "workdir is a file": ("tiny", {"file": b"x"}, ["--workdir={dir}/file"],
                          "workdir {dir}/file is a file, not a directory"),
    "corpus line without a tab": (NMT_DATES, {"c.tsv": b"a\tb\r\nno tab\n"},
                                  ["--config.data.corpus={dir}/c.tsv"],
                                  "{dir}/c.tsv:2: no tab between source and target"),
}


def _command(case: str, directory: str) -> list[str]:
  config, files, flags, _ = INVALID[case]
  for name, content in files.items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(content)
  flags = [flag.format(dir=directory) for flag in flags]
  if config == "tiny":
    return tiny.launch_command(os.path.join(directory, "run")) + flags
  config = config if os.path.isabs(config) else os.path.join(directory, config)
  return [sys.executable, os.path.join(tiny.ROOT, "launch.py"), f"--config={config}",
          f"--workdir={os.path.join(directory, 'run')}", *flags]


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def invalid_runs(tmp_path_factory):
  """Every invalid case (they only parse and validate) on 8 devices, each in a child forked
  from one start-up (forked_launch.py), with JAX's compile log on: {case: (its directory,
  exit status, stderr)}."""
  directories = {case: str(tmp_path_factory.mktemp("invalid")) for case in INVALID}
  results = forked_launch.run_all(
      {case: _command(case, directory)[2:] for case, directory in directories.items()},
      str(tmp_path_factory.mktemp("invalid_output")), devices=8)
  return {case: (directories[case], status, stderr)
          for case, (status, _, stderr) in results.items()}


@pytest.mark.xdist_group("invalid_runs")          # on one worker: the fixture runs once
@pytest.mark.parametrize("case", INVALID)
def test_user_error_is_one_line_and_exits_2_before_compiling(invalid_runs, case):
  directory, status, stderr = invalid_runs[case]
  assert status == 2, stderr[-2000:]
  (line,) = stderr.strip().splitlines()          # no traceback, no compile log
  assert line.startswith("error: ") and INVALID[case][3].format(dir=directory) in line


_TRAIN_BOTH_STRATEGIES = """
import json, sys, tiny
from research.training import train_and_evaluate
for strategy in sys.argv[2:]:
  train_and_evaluate(tiny.config(**{"train.parallelism": strategy, "train.num_steps": 30,
                                    "train.eval_every": 30, "train.checkpoint_every": 30}),
                     f"{sys.argv[1]}/{strategy}", tiny.task())
"""


@pytest.mark.long
def test_jit_and_pmap_on_8_devices_match_one_device(tmp_path):
  """Global batch 16 on 8 simulated devices (jit mesh and pmap) against 1 device."""
  runs = {8: ["jit", "pmap"], 1: ["jit"]}
  processes = [subprocess.Popen(
      [sys.executable, "-c", _TRAIN_BOTH_STRATEGIES, str(tmp_path / f"devices{n}"), *strategies],
      env={**tiny.environment(n), "PYTHONPATH": os.path.dirname(tiny.__file__)},
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n, strategies in runs.items()]
  for process in processes:
    assert process.wait(timeout=600) == 0, process.communicate()[1][-2000:]
  reference = tiny.records(str(tmp_path / "devices1" / "jit"), "train/loss")
  assert len(reference) == 3
  for strategy in ("jit", "pmap"):
    losses = tiny.records(str(tmp_path / "devices8" / strategy), "train/loss")
    assert [s for s, _ in losses] == [s for s, _ in reference]
    assert [v for _, v in losses] == pytest.approx([v for _, v in reference], rel=1e-4, abs=1e-6)


def test_typo_in_an_override_of_the_default_config_exits_2(tmp_path):
  """No --config: the default experiment's keys are checked before config_flags reads argv."""
  run = subprocess.run([sys.executable, os.path.join(tiny.ROOT, "launch.py"),
                        f"--workdir={tmp_path}", "--config.train.batch_sise=3"],
                       env=tiny.environment(), capture_output=True, text=True, timeout=300)
  assert run.returncode == 2, run.stderr[-2000:]
  assert re.search(r"unknown config key config.train.batch_sise; keys under config.train: "
                   r"[\w, ]*\bbatch_size\b", run.stderr)


COUNTING_CONFIG = """
import importlib.util, os
from research import experiments
from research.experiments import sequence_tasks


def _log(event):
  with open(os.environ["EVENTS"], "a") as f:
    f.write(event + "\\n")


def _validate(config):
  _log("validate")
  sequence_tasks.validate(config)


_log("load")
experiments.register("counted", validate=_validate, build=sequence_tasks.build)
_spec = importlib.util.spec_from_file_location("base", {base!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config(arg=None):
  _log("get_config")
  config = _base.get_config(arg)
  config.experiment = "counted"
  return config
"""


@pytest.mark.long
def test_one_config_load_and_one_validation_per_launch(tmp_path):
  """A config file registering its own task, counting how often launch.py uses it."""
  config = tmp_path / "counting.py"
  config.write_text(COUNTING_CONFIG.format(base=tiny.CONFIG.split(":")[0]))
  command = tiny.launch_command(str(tmp_path / "run"), **{"train.num_steps": 20})
  command[2] = f"--config={config}:task=adding,model=lstm"
  events = tmp_path / "events"
  run = subprocess.run(command, env={**tiny.environment(), "EVENTS": str(events)},
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert events.read_text().split() == ["load", "get_config", "validate"]
  assert tiny.records(str(tmp_path / "run"), "train/loss")[-1][0] == 20
