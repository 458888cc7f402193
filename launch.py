"""Runs an experiment: python launch.py --config experiments/NAME.py[:ARGS] --workdir DIR
[--config.key=value ...] [--sweep].

With no flags it runs the default experiment into a new directory under runs/. Bad
configuration values exit with status 2 and a message naming the key and the allowed
values, before anything is compiled. Rerunning a command resumes its workdir.
"""

import datetime
import importlib.util
import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(ROOT, "experiments", "nmt_dates.py")

def load_config_module(spec: str):
  """experiments/NAME.py[:ARGS] -> (module, ARGS or None)."""
  path, _, args = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  if module_spec is None or not os.path.isfile(path):
    raise FileNotFoundError(f"--config: no config file {path!r}")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module, args or None


def _flag_values(argv: list[str], prefix: str) -> list[tuple[str, str]]:
  """(name, value) of every --prefix... flag, in --a=b or --a b form."""
  found = []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{prefix}"):
      name, eq, value = arg[2:].partition("=")
      found.append((name, value if eq else (argv[i + 1] if i + 1 < len(argv) else "")))
  return found


def check_config_flags(argv: list[str]) -> None:
  """Our checks of --config and every --config.key=value, before config_flags sees them
  (it reads sys.argv as soon as the flag is defined): exit 2 with the key and what is
  allowed."""
  from research.training.validation import ConfigError, parse_value

  try:
    spec = dict(_flag_values(argv, "config")).get("config", DEFAULT_CONFIG)
    module, args = load_config_module(spec)
    config = module.get_config(args) if args else module.get_config()
    for name, value in _flag_values(argv, "config."):
      parse_value(config, name.removeprefix("config."), value)
  except (ConfigError, FileNotFoundError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  check_config_flags(sys.argv)
_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "experiment config file[:args]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default: runs/NAME-TIME)")
_SWEEP = flags.DEFINE_bool("sweep", False, "run every point of the config's get_sweep()")


def parse_flags(argv: list[str]):
  """absl's parsing; a flag it rejects exits with status 2 like a bad config value."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)     # Orbax logs every save at INFO
  config = _CONFIG.value
  if config.distributed:
    import jax
    jax.distributed.initialize()
  from research.training.loop import Preempted, train_and_evaluate, validate
  from research.training.metrics import NonFiniteLossError
  from research.training.sweep import run_sweep
  from research.training.validation import ConfigError

  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  name = os.path.basename(config_file)[:-3]
  workdir = _WORKDIR.value or os.path.join(
      ROOT, "runs", f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
  try:
    if _SWEEP.value:
      module, _ = load_config_module(config_file)
      if not hasattr(module, "get_sweep"):
        raise ConfigError(f"{config_file} defines no get_sweep(); --sweep needs one")
      run_sweep(config, module.get_sweep(), workdir)
      print(f"sweep summary: {os.path.join(workdir, 'summary.md')}")
    else:
      validate(config)
      final = train_and_evaluate(config, workdir)
      print(json.dumps({k: round(v, 6) for k, v in final.items()}, indent=2))
      print(f"workdir: {workdir}")
  except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  except NonFiniteLossError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  except Preempted as error:
    print(str(error), file=sys.stderr)
    sys.exit(0)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
