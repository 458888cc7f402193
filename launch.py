"""Trains an experiment (or its sweep), compiles it for a chip it needs not have, or evaluates
or exports a run: docs/running.md. No flags: the default experiment, into runs/NAME-TIME."""

import sys

from research import jax_start

with jax_start.held_back("--verbose" not in sys.argv):   # JAX's plugins log on import
  import datetime
  import functools
  import json
  import os

  import jax
  from absl import app, flags

  from research import experiments
  from research.aot import targets
  from research.training import command, compile, parallel, run_sweep, train, validate
  from research.training.compile_only import REPORT, SUMMARY, compile_sweep, table
  from research.training.config import sweep_points
  from research.training.export import export_run
  from research.training.run import RestoreWarning, evaluate_checkpoint
  from research.training.sweep import parse_shard
  from research.training.sweep_workers import keep_on_the_cpu

ROOT = os.path.dirname(os.path.abspath(__file__))
_CONFIG = flags.DEFINE_string("config", os.path.join(ROOT, "experiments", "nmt_dates.py"),
                              "the experiment: FILE[:ARGS]; --config.KEY=VALUE sets a key")
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default: runs/NAME-TIME)")
_SWEEP = flags.DEFINE_bool("sweep", False, "train every point of the config's get_sweep()")
_WORKERS = flags.DEFINE_integer("workers", 1, "with --sweep: worker processes training points "
                                "side by side, each on its share of the cores or one GPU")
_SHARD = flags.DEFINE_string("shard", "0/1", "with --sweep: I/N, this machine's share of the "
                             "points (index % N == I) of a sweep N machines split")
_COMPILE_ONLY = flags.DEFINE_string(
    "compile_only", None, "compile the train and eval steps for TARGET (no such device "
    f"needed: {', '.join(targets.TARGETS)}) into compile_report.json; train nothing")
_EVAL_ONLY = flags.DEFINE_bool("eval_only", False, "evaluate --workdir's checkpoint; no training")
_EXPORT = flags.DEFINE_bool("export", False, "export --workdir's checkpoint into export_step_N")
_STEP = flags.DEFINE_integer("step", None, "with --eval_only or --export: the checkpoint's "
                             "step (default: the latest)", lower_bound=0)
_COMPILATION_CACHE = flags.DEFINE_string("compilation_cache", compile.CACHE_DIRECTORY,
                                         "JAX's persistent compilation cache; '' for none")
_VERBOSE = flags.DEFINE_bool("verbose", False, "show tracebacks and the libraries' INFO logs")


def train_or_compile(parsed: command.Command) -> None:
  """Trains the experiment (each point of its sweep with --sweep), or compiles it for a target."""
  config, module, target = parsed.config, parsed.module, parsed.target
  name = os.path.basename(_CONFIG.value.partition(":")[0])[:-3]
  workdir = _WORKDIR.value or os.path.join(ROOT, "runs", "-".join(
      (name, *([target] if target else []), f"{datetime.datetime.now():%Y%m%d-%H%M%S}")))
  experiment = experiments.get(config.experiment)
  if target is None:
    command.TRAINING["workdir"] = workdir
    parallel.initialize(config)
    if _SWEEP.value and _WORKERS.value > 1:
      keep_on_the_cpu(_WORKERS.value)      # the GPUs are the workers'
  start_backends()
  points = sweep_points(module, config) if _SWEEP.value else None
  if target is not None:
    with jax_start.held_back(not _VERBOSE.value):   # libtpu's and XLA's logs
      results = compile_sweep(config, points, workdir, experiment, target)
    for point, result in results.items():
      print(f"{point}:\n{table(result)}" if point else table(result))
    print(f"compile summary: {os.path.join(workdir, SUMMARY)}" if points is not None else
          f"report: {os.path.join(workdir, REPORT)}")
  elif points is not None:
    run_sweep(config, points, workdir, experiment, workers=_WORKERS.value,
              shard=parse_shard(_SHARD.value))
    print(f"sweep summary: {os.path.join(workdir, 'summary.md')}")
  else:
    validate(config, experiment)          # train_and_evaluate's two steps: a frame less
    final = train(config, workdir, experiment)
    print(json.dumps({k: round(v, 6) for k, v in final.items()}, indent=2), f"workdir: {workdir}",
          sep="\n")


def evaluate() -> None:
  """--eval_only: --workdir's checkpoint of --step (default: the latest that reads)."""
  start_backends()
  with command.warnings_as_lines(RestoreWarning):
    path, metrics = evaluate_checkpoint(_WORKDIR.value, _STEP.value)
  print(json.dumps({k: round(v, 6) for k, v in metrics.items()}, indent=2), f"eval metrics: {path}",
        sep="\n")


def export() -> None:
  """--export: --workdir's checkpoint of --step (default: the latest that reads)."""
  start_backends()
  with command.warnings_as_lines(RestoreWarning), jax_start.held_back(not _VERBOSE.value):
    directory, metadata = export_run(_WORKDIR.value, _STEP.value)  # (the lowerings' logs)
  for platform, reason in metadata["not_exported"].items():
    print(f"warning: no {platform} program in {directory}: {reason}", file=sys.stderr)
  print(f"exported step {metadata['step']} for {', '.join(metadata['platforms'])}: {directory}")


def start_backends() -> None:
  """JAX's backends (the CPU alone without accelerators), quiet, with the compilation cache."""
  compile.enable_cache(_COMPILATION_CACHE.value, _COMPILATION_CACHE.present)
  jax_start.cpu_unless_accelerators()
  with jax_start.held_back(not _VERBOSE.value):
    jax.devices()


def run(argv: list[str]) -> None:
  """Reads argv (every refusal before anything compiles), then runs the work under absl."""
  verbose = "--verbose" in argv
  app.define_help_flags()
  with command.ended(verbose):
    parsed = command.parse(argv)
  work = {"eval_only": evaluate, "export": export}.get(
      parsed.mode, functools.partial(train_or_compile, parsed))
  app.run(functools.partial(command.run, work, verbose), argv=argv[:1], flags_parser=lambda x: x)


if __name__ == "__main__":
  run(sys.argv)
