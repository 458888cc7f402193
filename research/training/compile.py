"""Compiling the steps from shapes alone, refusing what cannot run before the first step: an
attention the registry refuses, a step that does not fit one device (with what each remedy
would need, compiled), and JAX's persistent compilation cache the runs share."""

import contextlib
import os
import re
import time
from collections.abc import Callable

import jax

from research.aot import report
from research.attention.registry import ImplementationError
from research.errors import ConfigError
from research.files import write_probe
from research.training.config import apply_overrides, available_ram, gib


def memory_bytes(device) -> int | None:
  """The memory one step may use on `device` (None when nothing tells)."""
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - compile-only and some CPU devices have none
    pass
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  if device.platform == "cpu":
    available = available_ram()
    return None if available is None else available // max(1, jax.local_device_count("cpu"))
  return None


@contextlib.contextmanager
def refusals_as_config_errors():
  """An attention implementation's refusal, met while tracing, as config.model's error."""
  try:
    yield
  except ImplementationError as error:
    raise ConfigError(f"config.model.{error}") from None


class CompiledStep:
  """One step compiled for one batch shape, with what it needs per device."""

  def __init__(self, executable, seconds: float, memory: dict[str, int]):
    self.executable, self.seconds, self.memory = executable, seconds, memory

  def __call__(self, *args):
    return self.executable(*args)


def compile_checked(what: str, compile_step: Callable[[], object], *, limit: int | None,
                    where: str, batch_size: int,
                    remedies: Callable[[], list] | None = None) -> CompiledStep:
  """compile_step() -> XLA executable, its refusals as one-line ConfigErrors.

  what: "train" or "eval"; limit: bytes one device has (None: not checked); where: the
  device, in words, for the message; batch_size: config.train.batch_size, for the hint;
  remedies: () -> groups of (flag, compile thunk) (`remedies`), each
  compiled when the step does not fit, the message naming the memory each would need.
  """
  start = time.perf_counter()
  try:
    with refusals_as_config_errors():
      executable = compile_step()
  except ConfigError:
    raise
  except Exception as error:  # noqa: BLE001 - XLA's over-memory refusal (TPU) is a RuntimeError
    needed = re.search(r"(RESOURCE_EXHAUSTED|exceeds available|Out of memory)[^\n]*", str(error))
    if needed is None:
      raise
    raise ConfigError(f"the {what} step does not fit {where}: XLA says {needed.group(0)[:300]}; "
                      f"reduce config.train.batch_size (now {batch_size}), the model or the "
                      "sequence length, or use more devices") from None
  memory = report.memory(executable)
  if limit is not None and memory["total"] > limit:
    tried = [] if remedies is None else remedy_memory(remedies(), limit)
    raise ConfigError(
        f"the {what} step needs {gib(memory['total'])} per device (arguments "
        f"{gib(memory['argument'])}, temporaries {gib(memory['temp'])}) but {where} has "
        f"{gib(limit)}; " + (f"compiled with each remedy: {', '.join(tried)}; or " if tried
                             else "") +
        f"reduce config.train.batch_size (now {batch_size}), the model or the sequence "
        "length, or use more devices")
  return CompiledStep(executable, time.perf_counter() - start, memory)


def remedy_memory(groups: list, limit: int) -> list[str]:
  """'FLAG: 9.12 GiB (fits)' for each remedy compiled: each group's alternatives in turn
  until one fits; one that cannot be compiled says why, in a few words."""
  tried = []
  for group in groups:
    for flag, compile_variant in group:
      try:
        with refusals_as_config_errors():
          total = report.memory(compile_variant())["total"]
      except Exception as error:  # noqa: BLE001 - a remedy's own refusal is only reported
        tried.append(f"{flag}: not compiled ({str(error).splitlines()[0][:120]})")
        continue
      tried.append(f"{flag}: {gib(total)} ({'fits' if total <= limit else 'too much'})")
      if total <= limit:
        break
  return tried


def shapes_key(batch) -> tuple:
  """The (shape, dtype) of each of batch's arrays: a step is compiled once per key (one per
  length bucket, say)."""
  return tuple((x.shape, x.dtype) for x in jax.tree.leaves(batch))


class CompiledPerShape:
  """A step compiled once per distinct batch shape (`shapes_key`)."""

  def __init__(self, compile_for: Callable[[object], CompiledStep]):
    self.compile_for, self.compiled = compile_for, {}

  def compile(self, batch) -> CompiledStep:
    """The executable for batch's shapes, compiling it on first sight."""
    key = shapes_key(batch)
    if key not in self.compiled:
      self.compiled[key] = self.compile_for(batch)
    return self.compiled[key]


# ---- Remedies: what would make a train step fit, each compiled -----------------------------
ACCUMULATION_FACTORS = (2, 4, 8, 16)
TRAIN_KEYS = ("train.",)          # overrides that leave the model (and its workload) as it is

Remedy = tuple[str, Callable[[], object]]     # (the flag, compile() -> XLA executable)


def candidates(config, devices: int) -> list[list[tuple[str, dict]]]:
  """The remedies `config` admits on `devices` devices, as groups of (flag, overrides), in
  the order tried (a group's alternatives in turn until one fits): train.grad_accum_steps
  × 2, 4, 8, 16 while it divides each device's rows (the same update from microbatches);
  model.remat=block where nothing is recomputed; model.dtype=bfloat16 from float32."""
  rows, steps = config.train.batch_size // devices, config.train.grad_accum_steps
  accumulation = [(f"--config.train.grad_accum_steps={steps * factor}",
                   {"train.grad_accum_steps": steps * factor})
                  for factor in ACCUMULATION_FACTORS if rows % (steps * factor) == 0]
  groups = [accumulation] if accumulation else []
  if config.model.get("remat") == "none":
    groups.append([("--config.model.remat=block", {"model.remat": "block"})])
  if config.model.get("dtype") == "float32":
    groups.append([("--config.model.dtype=bfloat16", {"model.dtype": "bfloat16"})])
  return groups


def compiled_remedies(config, devices: int, workload, build_workload: Callable,
             compile_train: Callable) -> list[list[Remedy]]:
  """The candidates as compile thunks: compile_train(config, workload) compiles the train
  step of a config variant; a variant that changes the model gets its own workload,
  build_workload(variant) (its shapes, or its data where the experiment has no shapes)."""

  def thunk(overrides: dict) -> Callable[[], object]:
    def compile_variant():
      variant = apply_overrides(config, overrides)
      same_model = all(key.startswith(TRAIN_KEYS) for key in overrides)
      return compile_train(variant, workload if same_model else build_workload(variant))
    return compile_variant

  return [[(flag, thunk(overrides)) for flag, overrides in group]
          for group in candidates(config, devices)]


# ---- JAX's persistent compilation cache (launch.py's --compilation_cache) -------------------
# ~/.cache/research/jax (or under $XDG_CACHE_HOME) by default; JAX_COMPILATION_CACHE_DIR, when
# set, is kept unless the flag is given.
CACHE_DIRECTORY = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                               os.path.join(os.path.expanduser("~"), ".cache"), "research", "jax")
HIT_EVENT = "/jax/compilation_cache/cache_hits"   # what jax.monitoring records per hit
_hits = [0]


def _count_cache_hit(event: str, **kwargs) -> None:
  del kwargs
  if event == HIT_EVENT:
    _hits[0] += 1


jax.monitoring.register_event_listener(_count_cache_hit)


def enable_cache(directory: str, given: bool = True) -> None:
  """Keeps compiled programs in `directory` for later runs (a resume, a sweep's next point
  load their steps instead of compiling; "" switches the cache off; JAX's thresholds apply).
  A `directory` that was not `given` (launch.py's default) leaves JAX_COMPILATION_CACHE_DIR
  in charge where that is set. ConfigError for a directory given (the flag, the variable) that is not
  one or cannot be written; the default in that case switches the cache off."""
  variable = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if not given and variable:
    check_cache_directory(variable, "JAX_COMPILATION_CACHE_DIR")
    return
  if directory and not given and unusable_cache(directory):
    directory = ""
  elif directory:
    check_cache_directory(directory, "--compilation_cache")
  jax.config.update("jax_compilation_cache_dir", directory or None)
  jax.config.update("jax_enable_compilation_cache", bool(directory))


def check_cache_directory(directory: str, name: str) -> None:
  """ConfigError naming `name` and the path unless `directory` is (or can be made) a
  directory this process can write into."""
  reason = unusable_cache(directory)
  if reason:
    raise ConfigError(f"{name}={directory}: {reason}; give a directory you can write to, or "
                      "--compilation_cache= to run without the cache")


def unusable_cache(directory: str) -> str | None:
  """Why `directory` cannot hold the cache (not a directory, cannot be made or written),
  None where it can: it is made if missing, and a probe file created and removed in it."""
  if os.path.exists(directory) and not os.path.isdir(directory):
    return "not a directory"
  try:
    os.makedirs(directory, exist_ok=True)
    write_probe(directory)
  except OSError as error:
    return f"cannot be written ({error.strerror or error})"
  return None


def cache_hits() -> int:
  """How many compiled programs this process has loaded from the cache so far."""
  return _hits[0]
