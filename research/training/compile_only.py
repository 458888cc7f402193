"""`launch.py --compile_only=TARGET`: an experiment's steps compiled for hardware not here.

Builds the experiment as training would (model, optimizer, the largest batch, the
state replicated and the batch split over the target's devices by the `jit` mesh
strategy), compiles its train and eval steps deviceless for TARGET (`research.aot.targets`),
trains nothing, and writes `compile_report.json` into the workdir:

  target, platform, device_kind, chips          what it was compiled for
  config                                        the experiment's workload, model.dtype, batch
  attention                                     {platform: the implementation each call runs
                                                there}, per call, as traced (so a T4 shows
                                                our Triton kernel where cuDNN cannot run)
  steps.train / steps.eval                      per device: bytes (argument, output, temp,
                                                code, total), chip_memory_bytes, fits,
                                                compile_seconds, kernels (custom calls),
                                                collectives, flops (where XLA counts them)

A step that does not fit the device is refused (`ConfigError`, one line naming what it
needs and what the chip has); the report is written either way, with `fits: false`.
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
from research.training.compile import compile_checked, gib, refusals_as_config_errors
from research.training.experiment import Experiment

REPORT = "compile_report.json"


def target_devices(name: str) -> tuple[targets.Target, tuple]:
  """The target called `name` and its compile-only devices; ConfigError if unknown or its
  toolchain is not installed."""
  try:
    target = targets.get(name)
    return target, targets.devices_of(target)
  except (ValueError, targets.TargetUnavailable) as error:
    raise ConfigError(f"--compile_only: {error}") from None


def compile_only(config, workdir: str, experiment: Experiment, target_name: str) -> dict:
  """Compiles config's train and eval steps for `target_name`; returns the report (also
  written to workdir/compile_report.json)."""
  target, devices = target_devices(target_name)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} is a file, not a directory; give a directory for "
                       f"{REPORT} with --workdir")
  if config.train.batch_size % len(devices):
    raise ConfigError(f"config.train.batch_size={config.train.batch_size} must be divisible by "
                      f"the {len(devices)} devices of {target_name}")
  started = time.perf_counter()
  workload = (experiment.build_shapes or experiment.build)(config)
  strategy = parallel.MeshStrategy(devices, targets.COMPILER_OPTIONS.get(target.platform))
  optimizer = train_step.make_optimizer(config.train)
  schedule = train_step.learning_rate_schedule(config.train)
  init_rng, step_rng = jax.random.split(train_step.root_key(config.seed, target.platform))
  with refusals_as_config_errors():
    shapes = strategy.abstract_state(
        jax.eval_shape(lambda rng: train_step.init_state(workload, optimizer, rng), init_rng))
  train_fn = train_step.make_train_step(workload, optimizer, schedule, step_rng,
                                        strategy.axis_name)
  eval_fn = train_step.make_eval_step(workload, strategy.axis_name)
  memory = targets.memory_bytes(target)
  where = f"{target_name} ({devices[0].device_kind})"
  batches = {"train": next(workload.train_data), "eval": _largest(workload.eval_data)}
  steps, attention = {}, []
  capability = targets.gpu_capability(target)
  gpu = registry.compiling_for_gpu(capability) if capability else contextlib.nullcontext()
  try:
    with gpu, registry.recording_choices() as choices:
      for name, fn, state in (("train", train_fn, shapes), ("eval", eval_fn, shapes.params)):
        compile_step = strategy.compile_step if name == "train" else strategy.compile_eval
        batch = strategy.abstract_batch(batches[name])
        compiled = compile_checked(name, functools.partial(compile_step, fn, state, batch),
                                   limit=memory, where=where, batch_size=config.train.batch_size)
        steps[name] = {**report.analyze(compiled.executable, memory),
                       "compile_seconds": round(compiled.seconds, 3)}
    attention = _per_platform(choices, registry_platform(target.platform))
  except ConfigError as error:
    steps["refused"] = str(error)
    _write(workdir, _report(target_name, target, devices, config, steps, attention, started))
    raise
  result = _report(target_name, target, devices, config, steps, attention, started)
  _write(workdir, result)
  return result


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


def _report(name, target, devices, config, steps, attention, started) -> dict:
  return {"target": name, "platform": target.platform, "device_kind": devices[0].device_kind,
          "chips": len(devices), "experiment": config.experiment,
          "dtype": config.model.get("dtype", "float32"),
          "batch_size": config.train.batch_size, "attention": attention, "steps": steps,
          "seconds": round(time.perf_counter() - started, 3)}


def _write(workdir: str, result: dict) -> None:
  """compile_report.json, whole or not at all; WorkdirError if it cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    files.write_json(os.path.join(workdir, REPORT), result)
  except OSError as error:
    raise WorkdirError(f"workdir {workdir}: cannot write {REPORT} ({error.strerror or error}); "
                       "give a directory you can write to with --workdir") from None


def table(result: dict) -> str:
  """The report as a few lines for the terminal."""
  lines = [f"{result['experiment']} on {result['target']} ({result['chips']} x "
           f"{result['device_kind']}), {result['dtype']}, batch {result['batch_size']}; "
           f"attention: {', '.join(result['attention']) or '-'}"]
  for name, step in result["steps"].items():
    if name == "refused":
      continue
    b = step["bytes"]
    flops = "-" if step["flops"] is None else f"{step['flops']:.3g}"
    lines.append(
        f"  {name:5s} {gib(b['total']):>11s} of {gib(step['chip_memory_bytes'])}  "
        f"{'fits' if step['fits'] else 'DOES NOT FIT'}  compile {step['compile_seconds']:.1f} s  "
        f"flops {flops}  kernels {', '.join(step['kernels']) or '-'}  "
        f"collectives {', '.join(step['collectives']) or '-'}")
  return "\n".join(lines)
