"""Checks shared by the linear recurrences' tests (LRU, S5, LinearAttentionCell).

Each takes `run(module, variables, x, **kwargs) -> (y, state)`, the module's whole-sequence
call (compiled, module static: see `compiled`), so the same check covers layers
(`module.apply(variables, x)`) and the cell (`method="sequence"`). Every expectation is the module's other form or the module on other
inputs (no stored numbers): parallel against stepwise, a padded batch against each sequence
run alone, outputs before a change against outputs after it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

FORWARD_TOL = 2e-5
GRAD_TOL = 1e-4


# XLA's cheapest optimisation level: these tiny programs are compiled far more often than
# they run, and what they compute does not depend on it.
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def compiled(fn):
  """fn(module, ...) under `jax.jit` with the module static: one compilation per module and
  shape (op by op, every small operation of a scan would be compiled on its own)."""
  return jax.jit(fn, static_argnums=0, compiler_options=QUICK_COMPILE)


@compiled
def run_layer(module, variables, x, **kwargs):
  """An LRU / S5 layer over a whole sequence: (y, final state)."""
  return module.apply(variables, x, **kwargs)


@compiled
def step_layer(module, variables, state, x_t):
  """One step of an LRU / S5 layer: (state, y_t)."""
  return module.apply(variables, state, x_t, method="step")


@compiled
def init_layer(module, rng, x):
  return module.init(rng, x)


def key(seed: int) -> jax.Array:
  """A PRNG key whose random bits are one XLA op (threefry's many would each be compiled
  into every initialisation)."""
  return jax.random.key(seed, impl="unsafe_rbg")


def randn(seed: int, *shape: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=QUICK_COMPILE)
def outputs_and_grads(run, module, variables, x, cotangent, **kwargs):
  """y and the gradients of <y, cotangent> + Σ Re(final state) with respect to (variables, x)."""
  run = getattr(run, "__wrapped__", run)   # inside this compilation, not a nested one
  def loss(variables, x):
    y, state = run(module, variables, x, **kwargs)
    return jnp.vdot(y, cotangent) + jnp.sum(jnp.real(state)), y
  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(variables, x)
  return y, grads


def assert_parallel_equals_stepwise(run, module, variables, x, **kwargs):
  """Outputs and final state of the two forms agree: the parallel form with
  module.chunk_size (chunks of a few steps, the last one padded: T = 6, chunk_size = 4) and
  with chunk_size = 1 (associative_scan over every step)."""
  parallel, stepwise = module.clone(mode="parallel"), module.clone(mode="stepwise")
  y_s, h_s = run(stepwise, variables, x, **kwargs)
  for chunked in (parallel, parallel.clone(chunk_size=1)):
    y_p, h_p = run(chunked, variables, x, **kwargs)
    np.testing.assert_allclose(y_p, y_s, rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_allclose(h_p, h_s, rtol=FORWARD_TOL, atol=FORWARD_TOL)


def assert_gradients_agree(run, module, variables, x):
  """Every gradient of the two forms agrees, and is finite."""
  cotangent = randn(7, *x.shape[:2], run(module, variables, x)[0].shape[-1])
  (_, g_p), (_, g_s) = (outputs_and_grads(run, module.clone(mode=mode), variables, x, cotangent)
                        for mode in ("parallel", "stepwise"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=GRAD_TOL, atol=GRAD_TOL), g_p, g_s)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(g_p))


def assert_padding_is_each_sequence_alone(run, module, variables, x, lengths, state_batch_axis=0):
  """With seq_lengths, each row equals that sequence run alone (no padding) on its valid
  steps, its padded outputs are exactly zero and its final state is its own."""
  y, state = run(module, variables, x, seq_lengths=jnp.asarray(lengths))
  for b, length in enumerate(lengths):
    y_alone, state_alone = run(module, variables, x[b:b + 1, :length])
    np.testing.assert_allclose(y[b:b + 1, :length], y_alone, rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_array_equal(y[b, length:], 0.0)
    np.testing.assert_allclose(jnp.take(state, jnp.array([b]), axis=state_batch_axis), state_alone,
                               rtol=FORWARD_TOL, atol=FORWARD_TOL)


def assert_causal(run, module, variables, x, t0):
  """Changing the inputs from step t0 on leaves every output before t0 unchanged, and
  changes the output at t0."""
  y, _ = run(module, variables, x)
  changed = x.copy()
  changed[:, t0:] += 1.0
  y_changed, _ = run(module, variables, changed)
  np.testing.assert_array_equal(y[:, :t0], y_changed[:, :t0])
  assert np.abs(y[:, t0] - y_changed[:, t0]).min() > 0.0


def assert_steps_equal_sequence(run, step, module, variables, x, state):
  """Stepping one time step at a time from `state` gives the sequence's outputs and state."""
  y, final = run(module, variables, x, initial_state=state)
  for t in range(x.shape[1]):
    state, y_t = step(module, variables, state, x[:, t])
    np.testing.assert_allclose(y_t, y[:, t], rtol=FORWARD_TOL, atol=FORWARD_TOL)
  np.testing.assert_allclose(state, final, rtol=FORWARD_TOL, atol=FORWARD_TOL)
