"""launch.py as a user runs it: bad configs, kill -9 / SIGTERM and resume, 8 devices."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import pytest
import tiny

import research.tasks.sequence_tasks as sequence_tasks
from research.training.checkpoints import Checkpoints
from research.training.train_step import init_state, make_optimizer


def _losses(workdir, name="train/loss"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [(r["step"], r[name]) for r in map(json.loads, f) if name in r]


def _start(workdir, **overrides):
  return subprocess.Popen(tiny.launch_command(workdir, **overrides), env=tiny.environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(workdir, step, process, timeout=300):
  """Blocks until metrics.jsonl has a record at `step` or later; the run must still go on."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert process.poll() is None, process.communicate()[1][-2000:]
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")) and any(
        s >= step for s, _ in _losses(workdir)):
      return
    time.sleep(0.02)
  raise TimeoutError(f"no step {step} within {timeout} s")


LONG = {"train.num_steps": 600, "train.checkpoint_every": 100, "train.log_every": 50,
        "train.eval_every": 300}


def test_kill_9_then_rerun_reproduces_the_uninterrupted_losses_bit_for_bit(tmp_path):
  reference = _start(str(tmp_path / "reference"), **LONG)
  victim_dir = str(tmp_path / "killed")
  victim = _start(victim_dir, **LONG)
  _wait_for_step(victim_dir, 250, victim)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  assert _losses(victim_dir)[-1][0] < LONG["train.num_steps"]
  resumed = subprocess.run(tiny.launch_command(victim_dir, **LONG), env=tiny.environment(),
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resuming from the checkpoint at step" in resumed.stderr
  assert reference.wait(timeout=600) == 0
  for name in ("train/loss", "eval/loss", "eval/accuracy"):
    assert _losses(victim_dir, name) == _losses(str(tmp_path / "reference"), name)


def test_sigterm_saves_the_current_step_and_exits_cleanly(tmp_path):
  workdir = str(tmp_path)
  process = _start(workdir, **LONG)
  _wait_for_step(workdir, 120, process)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 0, stderr[-2000:]
  step = int(stderr.split("SIGTERM at step ")[1].split(":")[0])
  assert 120 <= step < LONG["train.num_steps"]
  config = tiny.config(**LONG)
  task = sequence_tasks.build(config)
  like = init_state(task, make_optimizer(config.train), jax.random.key(0))
  restored_step, state, data_state = Checkpoints(os.path.join(workdir, "checkpoints"), 3
                                                 ).restore_latest(like)
  assert restored_step == step == int(state.step) == data_state["step"]


INVALID = {
    "unknown key": (["--config.train.num_step=5"],
                    r"unknown config key config.train.num_step; keys under config.train: "),
    "wrong type": (["--config.train.num_steps=many"],
                   "config.train.num_steps='many' must be of type int"),
    "unknown model": (["--config.model.kind=lstmm"],
                      "config.model.kind='lstmm' is not allowed; choose one of: 'rnn', 'lstm'"),
    "unknown attention": (["--config.model.kind=transformer", "--config.model.attention=flash"],
                          "config.model.attention='flash' is not allowed; choose one of: 'dense'"),
    "heads do not divide": (["--config.model.kind=transformer", "--config.model.num_heads=3"],
                            "config.model.num_heads=3 must divide config.model.hidden_size=16"),
    "batch vs devices": (["--config.train.batch_size=12"],
                         "config.train.batch_size=12 must be divisible by the number of devices (8)"),
    "non-positive size": (["--config.model.hidden_size=0"],
                          "config.model.hidden_size=0 must be a number > 0"),
}


@pytest.fixture(scope="module")
def invalid_runs(tmp_path_factory):
  """Every invalid case at once (they only parse and validate), with compile logging on."""
  env = {**tiny.environment(devices=8), "JAX_LOG_COMPILES": "1"}
  processes = {}
  for name, (flags, _) in INVALID.items():
    workdir = str(tmp_path_factory.mktemp("invalid"))
    processes[name] = subprocess.Popen(tiny.launch_command(workdir) + flags, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return {name: (p.wait(timeout=300), p.communicate()[1]) for name, p in processes.items()}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_config_exits_2_before_compiling(invalid_runs, case):
  status, stderr = invalid_runs[case]
  assert status == 2, stderr[-2000:]
  assert INVALID[case][1] in stderr
  assert "Compiling" not in stderr and "Finished tracing" not in stderr


_TRAIN_BOTH_STRATEGIES = """
import json, sys, tiny
from research.training import train_and_evaluate
for strategy in sys.argv[2:]:
  train_and_evaluate(tiny.config(**{"train.parallelism": strategy, "train.num_steps": 30,
                                    "train.eval_every": 30, "train.checkpoint_every": 30}),
                     f"{sys.argv[1]}/{strategy}")
"""


def test_jit_and_pmap_on_8_devices_match_one_device(tmp_path):
  """Global batch 16 on 8 simulated devices (jit mesh and pmap) against 1 device."""
  runs = {8: ["jit", "pmap"], 1: ["jit"]}
  processes = [subprocess.Popen(
      [sys.executable, "-c", _TRAIN_BOTH_STRATEGIES, str(tmp_path / f"devices{n}"), *strategies],
      env={**tiny.environment(n), "PYTHONPATH": os.path.dirname(tiny.__file__)},
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n, strategies in runs.items()]
  for process in processes:
    assert process.wait(timeout=600) == 0, process.communicate()[1][-2000:]
  reference = _losses(str(tmp_path / "devices1" / "jit"))
  assert len(reference) == 3
  for strategy in ("jit", "pmap"):
    losses = _losses(str(tmp_path / "devices8" / strategy))
    assert [s for s, _ in losses] == [s for s, _ in reference]
    assert [v for _, v in losses] == pytest.approx([v for _, v in reference], rel=1e-4, abs=1e-6)


def test_typo_in_an_override_of_the_default_config_exits_2(tmp_path):
  """No --config: the default experiment's keys are checked before config_flags reads argv."""
  run = subprocess.run([sys.executable, os.path.join(tiny.ROOT, "launch.py"),
                        f"--workdir={tmp_path}", "--config.train.batch_sise=3"],
                       env=tiny.environment(), capture_output=True, text=True, timeout=300)
  assert run.returncode == 2, run.stderr[-2000:]
  assert ("unknown config key config.train.batch_sise; keys under config.train: batch_size"
          in run.stderr)
