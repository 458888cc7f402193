"""Runs an experiment: python launch.py --config experiments/NAME.py[:ARGS] --workdir DIR
[--config.key=value ...] [--sweep] [--compile_only=TARGET] [--verbose] (no flags: the default
experiment into a new directory under runs/; rerunning a command resumes its workdir),
evaluates a run's checkpoint again: python launch.py --workdir DIR --eval_only [--step N], or
exports it: python launch.py --workdir DIR --export [--step N]. A user error is one line
`error: ...` and status 2 before anything is compiled; docs/running.md has the flags and the
exit statuses, docs/trained_runs.md --eval_only and --export.
"""

import sys

from research import jax_start

VERBOSE_FLAG = "--verbose"

with jax_start.held_back(VERBOSE_FLAG not in sys.argv):   # JAX's plugins log on import
  import contextlib
  import datetime
  import functools
  import importlib.util
  import inspect
  import json
  import logging as python_logging
  import os
  import signal
  import warnings
  from collections.abc import Callable

  import jax
  from absl import app, flags, logging
  from ml_collections import config_flags

  from research import experiments
  from research.aot import targets
  from research.errors import ConfigError, RunFailed, UserError
  from research.training import (
    Stopped,
    compile,
    parallel,
    run_sweep,
    thread_failures,
    train_and_evaluate,
  )
  from research.training.compile_only import REPORT, SUMMARY, compile_sweep, table, target_name
  from research.training.config import check_base_keys, check_key, get, parse_value
  from research.training.export import export_run
  from research.training.loop import Interrupted
  from research.training.run import RestoreWarning, evaluate_checkpoint

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(ROOT, "experiments", "nmt_dates.py")
ORBAX = f"{os.sep}orbax{os.sep}"         # in the path of Orbax's modules
ORBAX_TEMPORARY = ".orbax-checkpoint-tmp"  # in the path of a save Orbax has not finished
TRAINING = {}   # "workdir": where this command trains, once known (what a Ctrl-C reports)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default: runs/NAME-TIME)")
_SWEEP = flags.DEFINE_bool("sweep", False, "run every point of the config's get_sweep()")
COMPILE_ONLY_FLAG, EVAL_ONLY_FLAG, EXPORT_FLAG, STEP_FLAG = (
    "compile_only", "eval_only", "export", "step")
# The flags that act on a run's checkpoint with its own config, and what each does to it.
CHECKPOINT_FLAGS = {EVAL_ONLY_FLAG: "evaluate", EXPORT_FLAG: "export"}
VALUE_FLAGS = {   # launch.py's flags that take a value: the refusal of one given without
    "workdir": "--workdir needs a directory: --workdir=DIR (without the flag: a new one under "
               "runs/)",
    COMPILE_ONLY_FLAG: f"--compile_only needs a target: --compile_only=TARGET, one of: "
                       f"{', '.join(targets.TARGETS)}",
    STEP_FLAG: "--step needs a checkpoint's step: --step=N (without the flag: the latest)"}
_EVAL_ONLY = flags.DEFINE_bool(
    EVAL_ONLY_FLAG, False, "evaluate the checkpoint of the run in --workdir (its own config) "
    "on the validation and test splits into eval_step_N.json there; train nothing")
flags.DEFINE_bool(
    EXPORT_FLAG, False, "export the checkpoint of the run in --workdir into export_step_N "
    "there: params.safetensors, inference.jax_exported (jax.export), metadata.json")
_STEP = flags.DEFINE_integer(STEP_FLAG, None, "with --eval_only or --export: the checkpoint's "
                             "step (default: the latest)", lower_bound=0)
flags.DEFINE_string(
    COMPILE_ONLY_FLAG, None, "compile the train and eval steps for TARGET (no such device "
    f"needed: {', '.join(targets.TARGETS)}), write compile_report.json, train nothing")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", compile.CACHE_DIRECTORY, "where JAX's persistent "
    "compilation cache keeps compiled steps for later runs; '' switches it off")
flags.DEFINE_bool("verbose", False, "show tracebacks and the libraries' INFO logs")


def load_config(spec: str):
  """experiments/NAME.py[:ARGS] -> (get_config(ARGS), the config module).

  Raises ConfigError for a missing file, one that does not parse or lacks get_config.
  """
  path, _, args = spec.partition(":")
  if not os.path.isfile(path) or not path.endswith(".py"):
    what = "not a Python file (.py)" if os.path.isfile(path) else "no config file"
    raise ConfigError(f"--config: {what} {path!r}; give experiments/NAME.py[:ARGS]")
  module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as error:
    raise ConfigError(f"--config: {path} does not parse: {error.msg} at line {error.lineno}"
                      ) from error
  except Exception as error:  # noqa: BLE001 - any failure of the file is the config's
    raise ConfigError(f"--config: {path} fails to load: {type(error).__name__}: {error}"
                      ) from error
  if not hasattr(module, "get_config"):
    raise ConfigError(f"--config: {path} defines no get_config()")
  try:
    config = module.get_config(args) if args else module.get_config()
  except ConfigError:
    raise
  except Exception as error:  # noqa: BLE001
    raise ConfigError(f"--config: {path}: get_config({args or ''}) failed: "
                      f"{type(error).__name__}: {error}") from error
  check_base_keys(config, f"--config: {path}: get_config()")
  return config, module


def sweep_points(module, config) -> list:
  """The config module's get_sweep(), or get_sweep(config) where it takes one (a grid read
  from the config, overrides included); ConfigError if it has none or it fails."""
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"--sweep: {module.__file__} defines no get_sweep(); --sweep needs one")
  try:
    if inspect.signature(module.get_sweep).parameters:
      return module.get_sweep(config)
    return module.get_sweep()
  except Exception as error:  # noqa: BLE001 - any failure of the file is the config's
    raise ConfigError(f"--sweep: {module.__file__}: get_sweep() failed: "
                      f"{type(error).__name__}: {error}") from error


def flags_of(argv: list[str]):
  """(index, name, value or None) of each flag in argv as absl reads it: `-NAME` or
  `--NAME`, with `=VALUE` or without; up to `--`, past which nothing is a flag."""
  for i, arg in enumerate(argv):
    if arg == "--":
      return
    if arg.startswith("-"):
      name, eq, value = arg[2 if arg.startswith("--") else 1:].partition("=")
      if name:
        yield i, name, value if eq else None


def split_config_flag(argv: list[str]) -> tuple[str, list[str]]:
  """(the --config value or the default, argv without it); --config.key=value stays."""
  spec, dropped = DEFAULT_CONFIG, set()
  for i, name, value in flags_of(argv):
    if name == "config" and i not in dropped:
      spec = value if value is not None else (argv[i + 1] if i + 1 < len(argv) else "")
      dropped |= {i} if value is not None else {i, i + 1}
  return spec, [arg for i, arg in enumerate(argv) if i not in dropped]


def separate_value(argv: list[str], i: int) -> str | None:
  """The argument after argv[i]: what absl takes for the value of a flag written `--NAME
  VALUE`; None if there is none, or if it is another flag (a number is a value)."""
  value = argv[i + 1] if i + 1 < len(argv) else None
  if value is not None and value.startswith("-"):
    try:
      float(value)
    except ValueError:
      return None
  return value


def check_overrides(config, argv: list[str]) -> None:
  """Our checks of every override, in each spelling config_flags applies (`-config.KEY`
  or `--config.KEY`, `=VALUE` or the next argument, `--noconfig.KEY` for a bool's False),
  before config_flags applies them: ConfigError naming the key and what is allowed (an
  unknown key, a wrong type, no value)."""
  for i, name, value in flags_of(argv):
    negated = name.startswith("noconfig.")
    if not (negated or name.startswith("config.")):
      continue
    key = name.partition(".")[2]
    check_key(config, key)
    is_bool = isinstance(get(config, key), bool)
    if negated:
      if not is_bool or value is not None:
        raise ConfigError(f"--{name} sets a bool key to False and takes no value; "
                          f"config.{key} is {get(config, key)!r}: write --config.{key}=VALUE")
      continue
    if value is None:
      value = "true" if is_bool else separate_value(argv, i)   # absl: a bool flag alone
    if value is None:
      raise ConfigError(f"--{name} needs a value: --{name}=VALUE")
    parse_value(config, key, value)


def value_flags(argv: list[str]) -> dict[str, str]:
  """{name: value} of launch.py's flags that take one (--workdir, --compile_only), as absl
  reads them (`--NAME=VALUE` or `--NAME VALUE`, the last occurrence). ConfigError for one
  without a value: empty or blank, last, or followed by another flag (which absl would take
  for the value: `--workdir --sweep` trained into a directory named --sweep)."""
  values = {}
  for i, name, value in flags_of(argv):
    if name in VALUE_FLAGS:
      values[name] = value if value is not None else separate_value(argv, i)
  for name, value in values.items():
    if value is None or not value.strip():
      raise ConfigError(VALUE_FLAGS[name])
  return values


def compile_target(values: dict[str, str]) -> str | None:
  """The target --compile_only names (`value_flags`), as research.aot.targets names it
  (case and surrounding spaces aside); None without the flag; ConfigError listing the
  targets for an unknown name."""
  return target_name(values[COMPILE_ONLY_FLAG]) if COMPILE_ONLY_FLAG in values else None


def check_no_arguments(arguments: list[str]) -> None:
  """ConfigError for an argument that is not a flag (absl leaves them to the program; a
  config file given without --config trained the default experiment)."""
  if arguments:
    hint = (f"; for a config file write --config={arguments[0]}"
            if arguments[0].partition(":")[0].endswith(".py") else "")
    raise ConfigError(f"unexpected argument {arguments[0]!r}: launch.py takes flags only "
                      f"(--config FILE[:ARGS], --config.KEY=VALUE, --workdir DIR, --sweep, "
                      f"--compile_only=TARGET, --eval_only, --export, --step N, "
                      f"--verbose){hint}")


def bool_flag(argv: list[str], name: str) -> bool:
  """Whether argv sets the bool flag `name` as absl reads it (`--NAME`, `--NAME=true|t|1`,
  `--noNAME`; the last occurrence counts)."""
  value = False
  for _, flag, text in flags_of(argv):
    if flag in (name, f"no{name}"):
      value = flag == name and (text is None or text.lower() in ("true", "t", "1"))
  return value


def checkpoint_flag(argv: list[str], values: dict[str, str]) -> str | None:
  """The flag of CHECKPOINT_FLAGS that argv asks for (--eval_only, --export), None for
  neither; ConfigError for both, for what does not go with one (--sweep, --compile_only,
  --config and overrides: it reads the run's own config; no --workdir), and for --step
  without one."""
  given = [name for name in CHECKPOINT_FLAGS if bool_flag(argv, name)]
  if not given:
    if STEP_FLAG in values:
      raise ConfigError("--step goes with --eval_only or --export: --workdir DIR --eval_only "
                        "--step=N evaluates the checkpoint of step N, --export --step=N "
                        "exports it")
    return None
  flag, verb = given[0], CHECKPOINT_FLAGS[given[0]]
  configs = [f"--{name}" for _, name, _ in flags_of(argv)
             if name == "config" or name.startswith(("config.", "noconfig."))]
  for given_too, refusal in (
      (len(given) > 1, f"--{given[-1]}: {verb} and {CHECKPOINT_FLAGS[given[-1]]} in two commands"),
      (bool_flag(argv, "sweep"), f"--sweep: {verb} each point's workdir"),
      (COMPILE_ONLY_FLAG in values, "--compile_only"),
      (configs, f"{configs[0] if configs else ''}: it takes the run's own config (its "
                "config.json)")):
    if given_too:
      raise ConfigError(f"--{flag} does not go with {refusal}")
  if "workdir" not in values:
    raise ConfigError(f"--{flag} needs --workdir=DIR, the workdir of the run to {verb}")
  return flag


def fail(status: int, message: str, verbose: bool):
  """Ends the program with `message` on stderr; with --verbose, the traceback first."""
  thread_failures.ending(status)
  if verbose and sys.exc_info()[0] is not None:
    raise   # noqa: PLE0704 - re-raises the exception being handled, with its traceback
  print(message, file=sys.stderr, flush=True)
  sys.exit(status)


def quiet_libraries() -> None:
  """Without --verbose: no INFO logs, and not Orbax's ERROR logs, which tell what failed
  inside a save (its threads, its metadata) while the save's exception reaches the loop,
  reported once (CheckpointSaveError) or, restoring, a checkpoint set aside (a warning);
  nor asyncio's "exception was never retrieved" for the tasks and futures of a failed save
  (Orbax's coroutines, its temporary paths; logged when they are collected, after the loop
  has reported the save's error)."""
  logging.set_verbosity(logging.WARNING)                  # Orbax logs every save at INFO
  logging.get_absl_handler().addFilter(
      lambda record: record.levelno < python_logging.ERROR or not (
          ORBAX in record.pathname or (record.name == "asyncio" and any(
              mark in record.getMessage() for mark in (ORBAX, ORBAX_TEMPORARY)))))


def start_backends(verbose: bool) -> None:
  """Starts JAX's backends (the CPU alone where no accelerator is visible), their plugins'
  logs held back unless --verbose."""
  jax_start.cpu_unless_accelerators()
  with jax_start.held_back(not verbose):
    jax.devices()


def parse_flags(argv: list[str]):
  """absl's parsing; a flag it rejects exits with status 2 like a bad config value."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def compile_for(target: str, config, module, workdir: str, experiment, verbose: bool) -> None:
  """--compile_only: config's steps (with --sweep, every point's) compiled for `target`."""
  start_backends(verbose)
  points = sweep_points(module, config) if _SWEEP.value else None
  with jax_start.held_back(not verbose):   # libtpu's and XLA's logs
    results = compile_sweep(config, points, workdir, experiment, target)
  for point, result in results.items():
    print(f"{point}:\n{table(result)}" if point else table(result))
  print(f"compile summary: {os.path.join(workdir, SUMMARY)}" if points is not None else
        f"report: {os.path.join(workdir, REPORT)}")


def train_or_compile(config, module, name: str, verbose: bool, target: str | None) -> None:
  """Trains config's experiment (or every point of the module's sweep) into --workdir, or
  compiles it for `target` (--compile_only)."""
  suffix = f"-{target}" if target else ""
  workdir = _WORKDIR.value or os.path.join(
      ROOT, "runs", f"{name}{suffix}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
  experiment = experiments.get(config.experiment)
  if target is not None:
    compile_for(target, config, module, workdir, experiment, verbose)
    return
  TRAINING["workdir"] = workdir
  parallel.initialize(config)
  start_backends(verbose)
  if _SWEEP.value:
    run_sweep(config, sweep_points(module, config), workdir, experiment)
    print(f"sweep summary: {os.path.join(workdir, 'summary.md')}")
  else:
    final = train_and_evaluate(config, workdir, experiment)
    print(json.dumps({k: round(v, 6) for k, v in final.items()}, indent=2))
    print(f"workdir: {workdir}")


@contextlib.contextmanager
def restore_warnings_as_lines():
  """Restoring's warnings (research.training.run.RestoreWarning: an unreadable checkpoint
  passed over, other versions than the run's) as one line `warning: ...` each, as they come,
  on stderr as it is when the block starts (a `jax_start.held_back` inside it holds back the
  libraries' logs, not these); other warnings as Python shows them."""
  shown = warnings.showwarning
  sys.stderr.flush()
  stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", encoding="utf-8")

  def show(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, RestoreWarning):
      print(f"warning: {message}", file=stream, flush=True)
    else:
      shown(message, category, filename, lineno, file, line)

  warnings.showwarning = show
  try:
    yield
  finally:
    warnings.showwarning = shown
    stream.close()


def evaluate(verbose: bool) -> None:
  """--eval_only: the checkpoint of --step (default: the latest that reads) of the run in
  --workdir."""
  start_backends(verbose)
  with restore_warnings_as_lines():
    path, metrics = evaluate_checkpoint(_WORKDIR.value, _STEP.value)
  print(json.dumps({k: round(v, 6) for k, v in metrics.items()}, indent=2))
  print(f"eval metrics: {path}")


def export(verbose: bool) -> None:
  """--export: the checkpoint of --step (default: the latest that reads) of the run in
  --workdir."""
  start_backends(verbose)
  with restore_warnings_as_lines(), jax_start.held_back(not verbose):   # (the CUDA and TPU
    directory, metadata = export_run(_WORKDIR.value, _STEP.value)       # lowerings' logs)
  for platform, reason in metadata["not_exported"].items():
    print(f"warning: no {platform} program in {directory}: {reason}", file=sys.stderr)
  print(f"exported step {metadata['step']} for {', '.join(metadata['platforms'])}: {directory}")


def main(work: Callable[[], None], verbose: bool, arguments: list[str]) -> None:
  """Does the command's `work` (train_or_compile, evaluate or export), every error as one
  line with its exit status; `arguments`: what absl left that is no flag."""
  thread_failures.watch(verbose)
  if not verbose:
    quiet_libraries()
  try:
    check_no_arguments(arguments)
    compile.enable_cache(_COMPILATION_CACHE.value, flags.FLAGS["compilation_cache"].present)
    work()
    thread_failures.join_other_threads()
    thread_failures.raise_if_failed("after the command's work was done (what it wrote is "
                                    "complete)")
  except UserError as error:
    fail(2, f"error: {error}", verbose)
  except RunFailed as error:
    fail(1, f"error: {error}", verbose)
  except Interrupted as error:   # a second Ctrl-C, or one outside the loop: at once
    ignore_interrupts()
    end_at_once(130, str(error))
  except Stopped as error:
    ignore_interrupts()
    thread_failures.ending(130 if error.signum == signal.SIGINT else 0)
    print(str(error), file=sys.stderr)
    sys.exit(130 if error.signum == signal.SIGINT else 0)
  except KeyboardInterrupt:
    ignore_interrupts()
    fail(130, interrupted(), verbose)
  thread_failures.ending(0)


def end_at_once(status: int, message: str) -> None:
  """Prints `message` and ends the process without waiting for the libraries' threads (a
  checkpoint write a second Ctrl-C cut short: what it wrote is under a temporary name, never
  read as a checkpoint), as the user asked by pressing Ctrl-C again."""
  thread_failures.ending(status)
  print(message, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)


def ignore_interrupts() -> None:
  """Ctrl-C from now on changes nothing: the command is reporting how it ended (main
  thread only, where handlers are set)."""
  with contextlib.suppress(ValueError):
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted() -> str:
  """The line of a Ctrl-C that ended the command outside the train loop's stop: for a
  training command, the latest checkpoint saved under its workdir as it is now
  (loop.Interrupted), whenever the Ctrl-C came."""
  if "workdir" in TRAINING:
    return str(Interrupted(TRAINING["workdir"]))
  return "interrupted (Ctrl-C): nothing to save"


def run(argv: list[str]) -> None:
  """Loads the config once, checks the overrides and --compile_only's target (or what goes
  with --eval_only or --export, which load no config), then hands over to absl and main."""
  verbose = VERBOSE_FLAG in argv
  try:
    values = value_flags(argv)
    on_checkpoint = checkpoint_flag(argv, values)
    if on_checkpoint is None:
      spec, argv = split_config_flag(argv)
      target = compile_target(values)
      config, module = load_config(spec)
      check_overrides(config, argv)
  except UserError as error:
    fail(2, f"error: {error}", verbose)
  except KeyboardInterrupt:
    ignore_interrupts()
    fail(130, interrupted(), verbose)
  if on_checkpoint is not None:
    work = functools.partial({EVAL_ONLY_FLAG: evaluate, EXPORT_FLAG: export}[on_checkpoint],
                             verbose)
  else:
    config_flag = config_flags.DEFINE_config_dict(
        "config", config, "the experiment config: --config FILE[:ARGS] --config.key=value ...",
        lock_config=True, sys_argv=argv)
    name = os.path.basename(spec.partition(":")[0])[:-3]
    work = lambda: train_or_compile(config_flag.value, module, name, verbose, target)
  app.run(lambda left: main(work, verbose, left[1:]), argv=argv, flags_parser=parse_flags)


if __name__ == "__main__":
  run(sys.argv)
