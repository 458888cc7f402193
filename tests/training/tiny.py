"""A tiny sequence_tasks config shared by the runtime tests: seconds per run on 2 cores."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "sequence_tasks.py") + ":task=adding,model=lstm"
OVERRIDES = {"data.length": 12, "data.eval_examples": 64, "model.hidden_size": 16,
             "train.batch_size": 16, "train.num_steps": 60, "train.learning_rate": 0.01,
             "train.log_every": 10, "train.eval_every": 30, "train.checkpoint_every": 20}


def config(**overrides):
  """The tiny config as an ml_collections.ConfigDict (for in-process runs)."""
  sys.path.insert(0, ROOT)
  import launch  # noqa: PLC0415
  from research.training.validation import apply_overrides  # noqa: PLC0415

  module, args = launch.load_config_module(CONFIG)
  return apply_overrides(module.get_config(args), {**OVERRIDES, **overrides})


def launch_command(workdir: str, **overrides) -> list[str]:
  flags = [f"--config.{k}={v}" for k, v in {**OVERRIDES, **overrides}.items()]
  return [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={CONFIG}",
          f"--workdir={workdir}", *flags]


def environment(devices: int = 1) -> dict:
  return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
          "JAX_PLATFORMS": "cpu"}


def run(workdir: str, devices: int = 1, **overrides) -> subprocess.CompletedProcess:
  return subprocess.run(launch_command(workdir, **overrides), env=environment(devices),
                        capture_output=True, text=True, timeout=600)
