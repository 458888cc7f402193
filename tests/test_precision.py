"""The `highest_precision` fixture (conftest.py) takes effect: inside it, the matmul precision
JAX reads is "highest" and what a test traces (eagerly, op by op, under a jit compiled in the
test, in every hypothesis example) asks XLA for HIGHEST; outside it, the process default
stays, and the fixture restores it when its test ends.

The checks read the StableHLO that JAX emits rather than numbers: on the CPU every precision
gives full float32 products, so only the requested precision can show that the pin works."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# What the process runs with when no test pins anything (None: the backend's default, TF32
# on an NVIDIA GPU); JAX reads JAX_DEFAULT_MATMUL_PRECISION at start-up.
PROCESS_DEFAULT = os.environ.get("JAX_DEFAULT_MATMUL_PRECISION")

X = np.arange(12, dtype=np.float32).reshape(3, 4)
Y = np.arange(8, dtype=np.float32).reshape(4, 2)
PRESET_AT_IMPORT = jax.config.jax_default_matmul_precision

# Compiled and run once at import, at the process default: a test that pins the precision
# must not be handed this cached program.
PRE_JITTED = jax.jit(lambda x, y: x @ y)
PRE_JITTED(X, Y)
COMPILED_AT_IMPORT = PRE_JITTED._cache_size()


def dot_precisions(fn, *args) -> set[str]:
  """The precisions of every dot_general in `fn`'s StableHLO, e.g. {"HIGHEST"}."""
  text = jax.jit(fn).lower(*args).as_text()
  found = re.findall(r"dot_general .*precision = \[(\w+), (\w+)\]", text)
  assert found, f"no dot_general with a precision in:\n{text}"
  return {p for pair in found for p in pair}


def matmul_and_einsum(x, y):
  return x @ y, jnp.einsum("ij,jk->ik", x, y), jnp.dot(x, y)


@pytest.mark.usefixtures("highest_precision")
def test_inside_the_fixture_the_precision_is_highest():
  assert jax.config.jax_default_matmul_precision == "highest"
  assert dot_precisions(matmul_and_einsum, X, Y) == {"HIGHEST"}
  # a function compiled before the test at the default: called again, it compiles anew
  np.testing.assert_array_equal(PRE_JITTED(X, Y), X @ Y)
  if PROCESS_DEFAULT != "highest":
    assert PRE_JITTED._cache_size() == COMPILED_AT_IMPORT + 1
  with jax.disable_jit():  # op by op, as the recurrent tests run
    assert jax.config.jax_default_matmul_precision == "highest"


def test_outside_the_fixture_the_process_default_stays():
  assert jax.config.jax_default_matmul_precision == PRESET_AT_IMPORT == PROCESS_DEFAULT
  if PROCESS_DEFAULT is None:
    assert dot_precisions(matmul_and_einsum, X, Y) == {"DEFAULT"}


def test_the_fixture_restores_the_default_when_its_test_ends(request):
  """This finalizer is registered before the fixture is set up, so it runs after the
  fixture's teardown (finalizers run last in, first out)."""
  after = []

  def check_after_teardown():
    after.append(jax.config.jax_default_matmul_precision)
    assert after == [PROCESS_DEFAULT], "highest_precision leaked past its test"

  request.addfinalizer(check_after_teardown)
  assert jax.config.jax_default_matmul_precision == PROCESS_DEFAULT
  request.getfixturevalue("highest_precision")
  assert jax.config.jax_default_matmul_precision == "highest"


@pytest.mark.usefixtures("highest_precision")
@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 4), inner=st.integers(1, 4))
def test_every_hypothesis_example_runs_under_the_fixture(rows, inner):
  assert jax.config.jax_default_matmul_precision == "highest"
  x, y = jnp.ones((rows, inner)), jnp.ones((inner, 2))
  assert dot_precisions(matmul_and_einsum, x, y) == {"HIGHEST"}
