"""linear_scan's hand-written backward against JAX's autodiff of the plain recurrence.

The reference is h_t = a ⊙ h_{t−1} + b_t written as a `lax.scan` over time in complex64 (or
float32), each sequence stopped at its length; JAX differentiates it. Both forms of ours
(parallel: chunks of 3 over T = 7, the last chunk padded; stepwise), forward and reverse,
with lengths and an initial state, a complex a [N] and a real a broadcast over a state
[heads, k, v] as the retention decay is.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.recurrent import linear_scan

BATCH, STEPS = 3, 7
LENGTHS = np.array([7, 0, 5])


def reference(a, b, h0, reverse):
  """The recurrence as a plain scan per sequence: h [B, T, ...] (zero past each length)
  and the state after each sequence's last step."""
  valid = np.arange(STEPS)[None] < LENGTHS[:, None]

  def one(b_seq, h, valid_seq):
    def step(h, inputs):
      b_t, valid_t = inputs
      h = jnp.where(valid_t, a * h + b_t, h)
      return h, jnp.where(valid_t, h, 0.0)
    return jax.lax.scan(step, h, (b_seq, valid_seq), reverse=reverse)

  last, h = jax.vmap(one)(b, h0, jnp.asarray(valid))
  return h, last


def draws(complex_state: bool):
  rng = np.random.default_rng(0)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  if complex_state:   # a [N] complex, |a| < 1
    state, a = (4,), 0.6 * (normal(4) + 1j * normal(4)) / np.sqrt(2)
    b, h0 = normal(BATCH, STEPS, 4) + 1j * normal(BATCH, STEPS, 4), normal(BATCH, 4) + 1j * normal(BATCH, 4)
  else:               # a [heads, 1, 1] real, broadcast over [heads, k, v]
    state, a = (2, 3, 4), rng.uniform(0.5, 0.99, (2, 1, 1)).astype(np.float32)
    b, h0 = normal(BATCH, STEPS, *state), normal(BATCH, *state)
  cotangent = normal(BATCH, STEPS, *state) * (np.arange(STEPS)[None] < LENGTHS[:, None]).reshape(
      (BATCH, STEPS) + (1,) * len(state))
  return a, b, h0, cotangent


@pytest.mark.slow
@pytest.mark.parametrize("complex_state", [True, False], ids=["complex", "real_broadcast"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "stepwise"])
def test_gradients_match_autodiff_of_the_recurrence(complex_state, reverse, parallel):
  a, b, h0, cotangent = draws(complex_state)
  as_ours = (lambda z: (jnp.real(z), jnp.imag(z))) if complex_state else (lambda z: z)
  as_complex = (lambda v: jax.lax.complex(*v)) if complex_state else (lambda v: v)

  def loss(fn):   # <Re h, cotangent> + <Im h, cotangent / 2> + Σ Re(last state)
    def value(a, b, h0):
      h, last = fn(a, b, h0)
      return (jnp.sum(jnp.real(h) * cotangent) + jnp.sum(jnp.imag(h) * cotangent) / 2
              + jnp.sum(jnp.real(last)))
    return value

  def ours(a, b, h0):
    h, last = linear_scan(as_ours(a), as_ours(b), as_ours(h0), lengths=jnp.asarray(LENGTHS),
                          reverse=reverse, parallel=parallel, chunk=3)
    return as_complex(h), as_complex(last)

  # complex inputs: JAX's gradient of a real loss is ∂L/∂re − i ∂L/∂im, ours (re, im) pairs
  grads_ours = jax.jit(jax.grad(lambda *v: loss(ours)(*map(as_complex, v)), argnums=(0, 1, 2)))(
      *map(as_ours, (a, b, h0)))
  grads_ref = jax.jit(jax.grad(loss(lambda a, b, h0: reference(a, b, h0, reverse)),
                               argnums=(0, 1, 2)))(*map(jnp.asarray, (a, b, h0)))
  for name, got, want in zip(("a", "b", "h0"), grads_ours, grads_ref):
    want = (np.real(want), -np.imag(want)) if complex_state else (want,)
    got = got if complex_state else (got,)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
