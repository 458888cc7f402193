"""Accelerators to compile for from a machine that has none (deviceless ahead-of-time).

`devices_of(target)` gives a target's compile-only devices (JAX's topologies: libtpu for
TPUs, the CUDA PJRT plugin and a GPU description, `gpu_specs/*.txtpb`, for NVIDIA GPUs).
Shardings over them and `jax.jit(...).lower(...).compile()` compile for real: Mosaic and
Triton kernels, XLA's fusions, the collectives between chips. Nothing runs.
"""

import difflib
import functools
import os
import re
import shutil
from typing import NamedTuple

from jax.experimental import topologies

SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
GIB = 2**30


class Target(NamedTuple):
  platform: str                   # "tpu" or "cuda" (the lowering platform)
  topology: str                   # TPU: "v5e:1x1"; GPU: "1x1xN" (N GPUs on one host)
  bounds: tuple[int, int, int]    # TPU chips per host; GPU: unused
  spec: str                       # GPU: the file in gpu_specs/; TPU: ""
  memory_bytes: int               # per device, see `memory_bytes` (TPU: enforced by XLA)
  description: str


# target      platform  devices  memory per device  what it is
# tpu-v5e-1   tpu       1        16 GiB             Colab's TPU (one v5 lite chip)
# tpu-v5e-8   tpu       8        16 GiB             a v5litepod-8 slice
# tpu-v4-1    tpu       1        16 GiB             one v4 chip (LRA's efficiency benchmark)
# tpu-v4-8    tpu       8        16 GiB             a v4-8 (XLA's compile-only topology "v4:2x2x1")
# tpu-v6e-1   tpu       1        32 GiB             one Trillium chip
# h100        cuda      1        79.1 GiB           H100 80GB SXM (compute capability 9.0)
# h100x8      cuda      8        79.1 GiB           eight of them
# a100        cuda      1        39.4 GiB           A100-SXM4-40GB (Colab's A100; 8.0)
# l4          cuda      1        22.0 GiB           L4 (Colab; 8.9)
# t4          cuda      1        14.7 GiB           T4 (Colab's free GPU; 7.5)
TARGETS = {
    "tpu-v5e-1": Target("tpu", "v5e:1x1", (1, 1, 1), "", 16 * GIB, "Colab's TPU: one v5e chip"),
    "tpu-v5e-8": Target("tpu", "v5e:2x4", (2, 4, 1), "", 16 * GIB, "a v5litepod-8 slice"),
    "tpu-v4-1": Target("tpu", "v4:1x1x1", (1, 1, 1), "", 16 * GIB, "one v4 chip"),
    "tpu-v4-8": Target("tpu", "v4:2x2x1", (2, 2, 1), "", 16 * GIB, "a v4-8 slice"),
    "tpu-v6e-1": Target("tpu", "v6e:1x1", (1, 1, 1), "", 32 * GIB, "one v6e (Trillium) chip"),
    "h100": Target("cuda", "1x1x1", (1, 1, 1), "h100.txtpb", 0, "one H100 80GB"),
    "h100x8": Target("cuda", "1x1x8", (1, 1, 1), "h100.txtpb", 0, "eight H100 80GB on one host"),
    "a100": Target("cuda", "1x1x1", (1, 1, 1), "a100.txtpb", 0, "one A100 40GB (Colab)"),
    "l4": Target("cuda", "1x1x1", (1, 1, 1), "l4.txtpb", 0, "one L4 (Colab)"),
    "t4": Target("cuda", "1x1x1", (1, 1, 1), "t4.txtpb", 0, "one T4 (Colab's free GPU)"),
}


# XLA options of a deviceless compile. GPU: without a device XLA cannot autotune, and its
# own Triton GEMM emitter then failed on a plain f32 dot of nmt_dates' decoder ("Couldn't
# find output tile sizes"); matrix products go to cuBLAS, as autotuning often picks anyway.
COMPILER_OPTIONS = {"cuda": {"xla_gpu_enable_triton_gemm": False}}


class TargetUnavailable(RuntimeError):
  """The toolchain a target needs is not installed here (the `aot` extra)."""


def name_of(text: str) -> str:
  """The target `text` names, case and surrounding spaces aside ("T4 " -> "t4"); ValueError
  listing the targets (and the nearest name, where one is close) otherwise."""
  name = text.strip().lower()
  if name in TARGETS:
    return name
  if not name:
    raise ValueError(f"no target given; choose one of: {', '.join(TARGETS)}")
  near = difflib.get_close_matches(name, TARGETS, n=1, cutoff=0.75)
  hint = f" (did you mean {near[0]!r}?)" if near else ""
  raise ValueError(f"unknown target {text!r}{hint}; choose one of: {', '.join(TARGETS)}")


def get(name: str) -> Target:
  """The target `name` names (see `name_of`); ValueError listing the targets otherwise."""
  return TARGETS[name_of(name)]


def spec_text(target: Target) -> str:
  with open(os.path.join(SPECS, target.spec), encoding="utf-8") as f:
    return f.read()


def memory_bytes(target: Target) -> int:
  """Memory of one device of `target`. TPU: what XLA's compile-only TPU client enforces
  ("exceeds available HBM (15.75G)" on v5e and v4, 31.75G on v6e: the chip's HBM less XLA's
  reserve). GPU: the description's `device_memory_size` (the driver's usable bytes), which
  XLA does not enforce deviceless: `report.fits` compares it with the compiled program."""
  if target.platform == "tpu":
    return target.memory_bytes
  return int(re.search(r"device_memory_size:\s*(\d+)", spec_text(target)).group(1))


def gpu_capability(target: Target) -> tuple[int, int] | None:
  """(major, minor) compute capability of a GPU target; None for a TPU."""
  if target.platform != "cuda":
    return None
  block = re.search(r"cuda_compute_capability\s*{([^}]*)}", spec_text(target)).group(1)
  numbers = dict(re.findall(r"(major|minor):\s*(\d+)", block))
  return int(numbers.get("major", 0)), int(numbers.get("minor", 0))


@functools.cache
def _topology_devices(target: Target) -> tuple:
  if target.platform == "tpu":
    # Compiling only, several processes (test workers, a sweep) may load libtpu at once;
    # it otherwise takes a lock meant for processes sharing real chips.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(target.topology, platform="tpu",
                                            chips_per_host_bounds=list(target.bounds))
  else:
    _put_ptxas_on_path()
    topology = topologies.get_topology_desc(platform="cuda", topology=target.topology,
                                            target_config=spec_text(target))
  return tuple(topology.devices)


def devices_of(target: Target) -> tuple:
  """The compile-only devices of `target` (TargetUnavailable when its toolchain is missing).

  What the targets need installs with the `aot` extra (`python3 project.py test` installs
  it; `pip install -e ".[aot]"` with the pins `project.py` prints): libtpu, the CUDA plugin,
  ptxas (Triton kernels) and cuDNN (cuDNN attention). JAX loads the plugins when it starts:
  on a machine without the accelerators they log to stderr, which `launch.py` keeps quiet.
  """
  try:
    return _topology_devices(target)
  except Exception as error:  # noqa: BLE001 - a missing plugin shows as several error types
    raise TargetUnavailable(
        f"cannot compile for {target.description} here: {type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}; install the toolchain with "
        "`python3 project.py test` (its .venv has it) or pip install -e '.[aot]'") from error


def _put_ptxas_on_path() -> None:
  """Triton compiles through ptxas; the nvidia-cuda-nvcc wheel ships one outside PATH."""
  if shutil.which("ptxas"):
    return
  try:
    import nvidia.cuda_nvcc  # noqa: PLC0415 - only GPU targets need it
  except ImportError:
    return
  for root in nvidia.cuda_nvcc.__path__:
    binary = os.path.join(root, "bin")
    if os.path.exists(os.path.join(binary, "ptxas")):
      os.environ["PATH"] = f"{binary}{os.pathsep}{os.environ.get('PATH', '')}"
      return
