"""Tests marked `gpu` or `tpu` run only where JAX's default backend is that accelerator;
tests marked `slow` are started first.

Parity tests state the float32 matrix precision they need with the `highest_precision`
fixture (`pytestmark = pytest.mark.usefixtures("highest_precision")`): JAX's default on an
NVIDIA GPU is TF32 (10-bit mantissa in products), which breaks comparisons against
float32 references at tolerances like 1e-5."""

import pytest

from research import jax_start

jax_start.cpu_unless_accelerators()   # the compile-only toolchains, without probing for chips
ACCELERATOR_MARKERS = ("gpu", "tpu")


def pytest_collection_modifyitems(config, items):
  del config
  # Slow tests first: the workers then finish together instead of one waiting out the tail.
  items.sort(key=lambda item: "slow" not in item.keywords)
  needing = [item for item in items if any(m in item.keywords for m in ACCELERATOR_MARKERS)]
  if not needing:
    return
  import jax  # noqa: PLC0415 - only when an accelerator test was collected

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
  import jax  # noqa: PLC0415 - only tests that use it pay for the import

  with jax.default_matmul_precision("highest"):
    yield
