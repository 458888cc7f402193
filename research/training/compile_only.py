"""`launch.py --compile_only=TARGET`: an experiment's train and eval steps built as training
builds them and compiled deviceless for hardware not here (`research.aot.targets`), to know
whether a step fits the chip and what it runs there before renting one; it trains nothing,
and writes compile_report.json (for a sweep, one per point and compile_summary.md) only once
every step compiled. docs/accelerators.md, "Compiling for hardware you don't have".
"""

import contextlib
import functools
import os
import time

import jax

from research import files
from research.aot import report, targets
from research.attention import registry
from research.errors import ConfigError, WorkdirError
from research.training import parallel, train_step
from research.training import workdir as workdirs
from research.training.command import target_name
from research.training.compile import compile_checked, compiled_remedies
from research.training.config import check_shared, gib
from research.training.experiment import Experiment
from research.training.loop import state_shapes_and_step, validate_experiment
from research.training.sweep import check_sweep_workdir, point_configs, point_name
from research.training.workdir import check_config

REPORT, SUMMARY = "compile_report.json", "compile_summary.md"


def target_devices(name: str) -> tuple[targets.Target, tuple]:
  """The target called `name` and its compile-only devices; ConfigError if unknown or its
  toolchain is not installed."""
  target = targets.TARGETS[target_name(name)]
  try:
    return target, targets.devices_of(target)
  except targets.TargetUnavailable as error:
    raise ConfigError(f"--compile_only: {error}") from None


def validate(config, experiment: Experiment) -> None:
  """The checks training makes before compiling, less this machine's device count (the
  target's devices count instead: `compile_only`)."""
  check_shared(config)
  validate_experiment(config, experiment)


def compile_only(config, workdir: str, experiment: Experiment, target: str) -> dict:
  """Compiles config's train and eval steps for `target` (a name of research.aot.targets);
  returns the report (`compile_report`), also written to workdir/compile_report.json; what
  is refused: `compile_sweep`."""
  (result,) = compile_sweep(config, None, workdir, experiment, target).values()
  return result


def compile_sweep(config, points: list[dict] | None, workdir: str, experiment: Experiment,
                  target: str) -> dict[str, dict]:
  """Compiles every point of `points` (a config module's get_sweep(); None: config itself)
  for `target`; returns {point name: report} ({"": report} for config itself).

  Writes each report into workdir/<point name>/ (workdir itself for config alone, a point's
  directory named as `--sweep` names it) and, for a sweep, compile_summary.md beside them;
  nothing at all if a point is refused (ConfigError naming it).

  Builds each point as training would (model, optimizer, the largest batch, the state
  replicated and the batch split over the target's devices by the `jit` mesh strategy). A
  user error is refused as training refuses it (one line, ConfigError / WorkdirError), and
  everything is checked before the first compile: the config and every sweep point, the
  target (its name, its toolchain, the batch split over its devices), the workdir (not a file
  or under one, writable, not held by a live run: `research.training.workdir.hold`, whose lock
  the compile holds; not a workdir a training run of this config would refuse:
  `workdir.check_config`, and `sweep.check_sweep_workdir` for a sweep's root). A step that
  does not fit the device, or that an attention implementation cannot do there, is refused in
  one line naming what it needs and what the chip has; nothing is written unless every step
  compiled: the workdir is left as found.
  """
  validate(config, experiment)
  if points is None:
    named = {"": config}
  else:
    configs = point_configs(config, points, experiment, validate=validate)
    named = {point_name(p): c for p, c in zip(points, configs, strict=True)}
  name = target_name(target)
  directories = {point: os.path.join(workdir, point) if point else workdir for point in named}
  with contextlib.ExitStack() as held:     # the locks, held until every file is written
    held.enter_context(workdirs.hold(workdir))
    if points is not None:
      check_sweep_workdir(config, points, workdir)
      workdirs.check_entries(workdir, files=(SUMMARY,), directories=())
    for point, directory in directories.items():
      if directory != workdir:
        held.enter_context(workdirs.hold(directory))
      workdirs.check_entries(directory, files=(REPORT,), directories=())
      with _naming(point, list(named)):
        check_config(named[point], directory)      # a run's refusals (nothing taken over)
    spec, devices = target_devices(name)
    for point, point_config in named.items():
      with _naming(point, list(named)):
        if point_config.train.batch_size % len(devices):
          raise ConfigError(f"config.train.batch_size={point_config.train.batch_size} must be "
                            f"divisible by the {len(devices)} devices of {name}")
    results = {}
    for point, point_config in named.items():
      with _naming(point, list(named)):
        results[point] = compile_report(point_config, experiment, name, spec, devices)
    # Each file is written whole (research.files): one that cannot be written leaves nothing
    # of itself, and its WorkdirError removes the locks and the directories left empty.
    for point, result in results.items():
      _write(os.path.join(directories[point], REPORT), workdir, result)
    if points is not None:
      _write(os.path.join(workdir, SUMMARY), workdir, summary(results))
  return results


@contextlib.contextmanager
def _naming(point: str, points: list[str]):
  """A ConfigError of a sweep point, prefixed with the point (its index and overrides)."""
  try:
    yield
  except ConfigError as error:
    if not point:
      raise
    raise ConfigError(f"sweep point {points.index(point)} ({point}): {error}") from None


def compile_report(config, experiment: Experiment, name: str, target: targets.Target,
                   devices: tuple) -> dict:
  """The report of config's train and eval steps compiled for `target` (called `name`) on
  its compile-only `devices`; ConfigError if a step does not fit or cannot be compiled
  there. Writes nothing. Its keys:

    target, platform, device_kind, chips   what it was compiled for
    experiment, dtype, batch_size          the experiment's workload, model.dtype, batch
    attention                              the implementations the attention calls run on the
                                           target's platform, as traced, in call order without
                                           repeats (`auto` gives a T4, where neither cuDNN nor
                                           Triton can run, a portable strategy)
    steps.train / steps.eval               per device (research.aot.report.analyze): bytes
                                           (argument, output, temp, code, total),
                                           chip_memory_bytes, fits, kernels (custom calls),
                                           collectives, flops (where XLA counts them); and
                                           compile_seconds
    seconds                                the whole report's time, building included
  """
  started = time.perf_counter()
  workload = (experiment.build_shapes or experiment.build)(config)
  strategy = parallel.MeshStrategy(devices, targets.COMPILER_OPTIONS.get(target.platform))
  optimizer = train_step.make_optimizer(config.train, config.model.get("dtype", "float32"))
  schedule = train_step.learning_rate_schedule(config.train)
  init_rng, step_rng = jax.random.split(train_step.root_key(config.seed, target.platform))
  where = f"{name} ({devices[0].device_kind})"
  platform = registry_platform(target.platform)
  with registry.compiling_for(platform, targets.gpu_capability(target), where), \
       registry.recording_choices() as choices:
    def train_step_of(variant, workload):
      """(the state's shapes, the train step) of config `variant` for `workload`."""
      return state_shapes_and_step(workload, optimizer, schedule, strategy, init_rng, step_rng,
                                   variant.train.grad_accum_steps)

    shapes, train_fn = train_step_of(config, workload)
    eval_fn = train_step.make_eval_step(workload, strategy.axis_name)
    memory = targets.memory_bytes(target)
    batches = {"train": next(workload.train_data), "eval": _largest(workload.eval_data)}

    def compile_variant(variant, variant_workload):
      variant_shapes, variant_fn = train_step_of(variant, variant_workload)
      return strategy.compile_step(variant_fn, variant_shapes,
                                   strategy.abstract_batch(batches["train"]))

    steps = {}
    for step, fn, state in (("train", train_fn, shapes), ("eval", eval_fn, shapes.params)):
      compile_step = strategy.compile_step if step == "train" else strategy.compile_eval
      batch = strategy.abstract_batch(batches[step])
      fixes = None if step == "eval" else lambda: compiled_remedies(
          config, len(devices), workload, experiment.build_shapes or experiment.build,
          compile_variant)
      compiled = compile_checked(step, functools.partial(compile_step, fn, state, batch),
                                 limit=memory, where=where, batch_size=config.train.batch_size,
                                 remedies=fixes)
      steps[step] = {**report.analyze(compiled.executable, memory),
                     "compile_seconds": round(compiled.seconds, 3)}
  return {"target": name, "platform": target.platform, "device_kind": devices[0].device_kind,
          "chips": len(devices), "experiment": config.experiment,
          "dtype": config.model.get("dtype", "float32"), "batch_size": config.train.batch_size,
          "attention": _per_platform(choices, platform), "steps": steps,
          "seconds": round(time.perf_counter() - started, 3)}


def registry_platform(lowering: str) -> str:
  """The registry's name ("gpu") for a lowering platform ("cuda")."""
  return {"cuda": "gpu"}.get(lowering, lowering)


def _per_platform(choices: list[dict], platform: str) -> list[str]:
  """What each traced attention call runs on `platform`, in call order, without repeats."""
  seen = []
  for choice in choices:
    name = choice[platform] or "refused"
    if name not in seen:
      seen.append(name)
  return seen


def _largest(batches: list[dict]) -> dict:
  return max(batches, key=lambda b: sum(x.size for x in jax.tree.leaves(b)))


def _write(path: str, workdir: str, content: dict | str) -> None:
  """A report (JSON) or the summary (text), whole or not at all; WorkdirError if it cannot
  be written."""
  try:
    if isinstance(content, dict):
      files.write_json(path, content)
    else:
      files.write_text(path, content)
  except OSError as error:
    raise WorkdirError(f"workdir {workdir}: cannot write {path} ({error.strerror or error}); "
                       "give a directory you can write to with --workdir") from None


def summary(results: dict[str, dict]) -> str:
  """compile_summary.md: one row per sweep point (every one fits: a step that does not is
  refused)."""
  lines = ["| point | train step per device | eval step per device | chip memory | attention "
           "| compile s |", "|---|---|---|---|---|---|"]
  for point, result in results.items():
    train, evaluation = result["steps"]["train"], result["steps"]["eval"]
    lines.append(f"| {point} | {gib(train['bytes']['total'])} | "
                 f"{gib(evaluation['bytes']['total'])} | {gib(train['chip_memory_bytes'])} | "
                 f"{', '.join(result['attention']) or '-'} | {result['seconds']:.1f} |")
  return "\n".join(lines) + "\n"


def table(result: dict) -> str:
  """The report as a few lines for the terminal."""
  lines = [f"{result['experiment']} on {result['target']} ({result['chips']} x "
           f"{result['device_kind']}), {result['dtype']}, batch {result['batch_size']}; "
           f"attention: {', '.join(result['attention']) or '-'}"]
  for name, step in result["steps"].items():
    b = step["bytes"]
    flops = "-" if step["flops"] is None else f"{step['flops']:.3g}"
    lines.append(
        f"  {name:5s} {gib(b['total']):>11s} of {gib(step['chip_memory_bytes'])}  "
        f"{'fits' if step['fits'] else 'DOES NOT FIT'}  compile {step['compile_seconds']:.1f} s  "
        f"flops {flops}  kernels {', '.join(step['kernels']) or '-'}  "
        f"collectives {', '.join(step['collectives']) or '-'}")
  return "\n".join(lines)
