"""Tests marked `gpu` or `tpu` run only where JAX's default backend is that accelerator;
tests marked `slow` are started first. The test files mark their tests (a whole file with
`pytestmark`, a test with a decorator, a case of the long tier with `tiers.long_cases`):

- `slow`: launch.py subprocesses, notebooks, end-to-end runs, and the unit tests whose cases
  took 2 s or more together on 2 quiet cores (`pytest -m "not slow" --durations=0`, at 4a0df7d);
- `aot`: they need the `aot` extra's toolchains (cuDNN's library, the CUDA plugin, libtpu),
  and are skipped where those are missing;
- `long`: the long tier, left out of `python3 project.py test` (CI's 12 minutes on 2 cores)
  and run by `python3 project.py long`: the notebooks in quick mode, compiles of whole presets
  a benchmark also makes (`bench compile_targets`), the multi-process run, the selective
  recurrences' 16 384-step runs, and the cases of exhaustive grids beyond one per family (the
  others stay in the suite).

`python3 project.py quick` leaves out `slow` and `aot`; `python3 project.py test` runs all but
`long`.

Parity tests state the float32 matrix precision they need with the `highest_precision`
fixture (`pytestmark = pytest.mark.usefixtures("highest_precision")`): JAX's default on an
NVIDIA GPU is TF32 (10-bit mantissa in products), which breaks comparisons against
float32 references at tolerances like 1e-5.

On the CPU, tests compile with LLVM's optimisations off (`COMPILE_QUICKLY`, in XLA_FLAGS, which
the launch.py and notebook subprocesses inherit): they compile hundreds of small programs and
run each a few times, so compiling is most of their time, and this takes about a quarter off
it. The programs compute the same values; only how fast their machine code runs changes."""

import importlib.util
import os

import pytest

from research import jax_start  # before JAX: importing research starts it quietly

jax_start.cpu_unless_accelerators()   # the compile-only toolchains, without probing for chips
import jax  # noqa: E402

COMPILE_QUICKLY = "--xla_backend_optimization_level=0"
if jax.config.jax_platforms == "cpu":   # XLA_FLAGS is read when JAX's backends start
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {COMPILE_QUICKLY}".strip()
ACCELERATOR_MARKERS = ("gpu", "tpu")
AOT_MODULES = ("libtpu", "jax_cuda12_plugin", "nvidia.cudnn")   # what the `aot` extra installs


def aot_installed() -> bool:
  try:
    return all(importlib.util.find_spec(name) for name in AOT_MODULES)
  except ModuleNotFoundError:   # a parent package ("nvidia") is missing
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  del config
  if not aot_installed():
    skip = pytest.mark.skip(reason="needs the aot extra's toolchains: python3 project.py test "
                                   "installs them")
    for item in items:
      if "aot" in item.keywords:
        item.add_marker(skip)
  # Slow tests first: the workers then finish together instead of one waiting out the tail.
  items.sort(key=lambda item: "slow" not in item.keywords)
  needing = [item for item in items if any(m in item.keywords for m in ACCELERATOR_MARKERS)]
  if not needing:
    return
  backend = jax.default_backend()
  for item in needing:
    for marker in ACCELERATOR_MARKERS:
      if marker in item.keywords and backend != marker:
        item.add_marker(pytest.mark.skip(reason=f"needs a {marker.upper()} (backend: {backend})"))


@pytest.fixture
def highest_precision():
  """The test runs under `jax.default_matmul_precision("highest")`: full float32 products in
  every matmul / einsum / dot it traces (eager, op by op or under a jit it compiles while the
  test runs: the setting is part of jit's cache key), whatever the backend's default."""
  with jax.default_matmul_precision("highest"):
    yield
