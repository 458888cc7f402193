"""Tests marked `gpu` or `tpu` run only where JAX's default backend is that accelerator."""

import pytest

ACCELERATOR_MARKERS = ("gpu", "tpu")


def pytest_collection_modifyitems(config, items):
  del config
  needing = [item for item in items if any(m in item.keywords for m in ACCELERATOR_MARKERS)]
  if not needing:
    return
  import jax  # noqa: PLC0415 - only when an accelerator test was collected

  backend = jax.default_backend()
  for item in needing:
    for marker in ACCELERATOR_MARKERS:
      if marker in item.keywords and backend != marker:
        item.add_marker(pytest.mark.skip(reason=f"needs a {marker.upper()} (backend: {backend})"))
