"""flash-linear-attention's naive PyTorch recurrences (fla-core, MIT), the references of the
GLA, DeltaNet and Mamba-2 (SSD) tests. `fla/__init__.py` imports Triton, which a CPU machine
lacks, so each `naive.py` (torch and einops only) is loaded from its file alone; where fla-core
(a test extra) is not installed, the test that asks for one is skipped, naming it."""

import functools
import importlib.util
import os

import pytest


@functools.cache
def naive(op: str):
  """The module fla/ops/{op}/naive.py ("gla", "delta_rule", "simple_gla", ...)."""
  spec = importlib.util.find_spec("fla")
  if spec is None:
    pytest.skip("fla-core (the package 'fla', a test extra: pip install -e '.[test]') is not "
                "installed: its naive recurrences are this test's reference")
  (package,) = spec.submodule_search_locations
  path = os.path.join(package, "ops", op, "naive.py")
  spec = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
