"""Compiling the train and eval steps from shapes alone, refusing what cannot run.

Every step the loop runs, and every step `--compile_only` reports, is compiled here from
ShapeDtypeStructs of the state and the batch (nothing is initialised or transferred
first), so that before the first step:

  an implementation that cannot do the request   the attention registry's refusal, raised
      (named kernel, head dim, …)                 when the step is traced or lowered for
                                                  the device's platform → ConfigError
  a step that does not fit one device            XLA's per-device bytes against the
                                                  device's memory → ConfigError naming both
                                                  and what each remedy would need
                                                  (remedies.py: compiled, not guessed)

`memory_bytes(device)` is the device's own limit (GPU / TPU: the allocator's bytes_limit)
or, on a CPU, the memory the machine has available, shared by its CPU devices.
"""

import contextlib
import os
import re
import time
from collections.abc import Callable

import jax

from research.aot import report
from research.attention.registry import ImplementationError
from research.errors import ConfigError

GIB = 2**30


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


def available_ram() -> int | None:
  """The memory this machine has available (Linux's MemAvailable), None when unknown."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      found = re.search(r"MemAvailable:\s+(\d+) kB", f.read())
    if found:
      return int(found.group(1)) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def host_memory_refusal(needed: int, sizes: str, what: str) -> str | None:
  """'`sizes` would need … of host memory for `what`, but this machine has … available; …'
  when `needed` bytes exceed the memory available here; None when they fit (or nothing
  tells)."""
  available = available_ram()
  if available is None or needed <= available:
    return None
  return (f"{sizes} would need {gib(needed)} of host memory for {what}, but this machine "
          f"has {gib(available)} available; make them smaller")


def gib(n: int) -> str:
  """Bytes in words: GiB, MiB below one GiB, KiB below one MiB."""
  if n >= GIB:
    return f"{n / GIB:.2f} GiB"
  return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


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
  remedies: () -> groups of (flag, compile thunk) (`research/training/remedies.py`), each
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


class CompiledPerShape:
  """A step compiled once per distinct batch shape (one per length bucket, say)."""

  def __init__(self, compile_for: Callable[[object], CompiledStep]):
    self.compile_for, self.compiled = compile_for, {}

  def compile(self, batch) -> CompiledStep:
    """The executable for batch's shapes, compiling it on first sight."""
    key = tuple((x.shape, x.dtype) for x in jax.tree.leaves(batch))
    if key not in self.compiled:
      self.compiled[key] = self.compile_for(batch)
    return self.compiled[key]

  @property
  def seconds(self) -> list[float]:
    return [step.seconds for step in self.compiled.values()]

  def memory_mib(self) -> float:
    """XLA's estimate of the largest compiled step's memory on one device: arguments,
    outputs, temporaries and code, less the donated buffers the outputs reuse."""
    return max(step.memory["total"] for step in self.compiled.values()) / 2**20
