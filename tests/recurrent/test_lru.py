"""LRU (Orvieto et al. 2023): the PyPI package lru-pytorch as the reference (its LRU runs
the paper's recurrence one step at a time in torch; our parameters are copied into it),
the paper's ring initialisation and γ normalisation checked against their definitions,
and the forms, padding, causality and dtypes checked against each other."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from linear_checks import (
  FORWARD_TOL,
  GRAD_TOL,
  assert_causal,
  assert_padding_is_each_sequence_alone,
  assert_parallel_equals_stepwise,
  assert_steps_equal_sequence,
  key,
  outputs_and_grads,
  randn,
)
from linear_checks import (
  init_layer as init,
)
from linear_checks import (
  run_layer as run,
)
from linear_checks import (
  step_layer as step,
)

from research.recurrent import LRU

LRU_pytorch = pytest.importorskip("LRU_pytorch")
pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, H, N = 2, 6, 3, 4


def make(**kwargs):
  """r_max = 1 (the paper's default): |λ| near 1, γ near 0, gradients must stay finite.
  chunk_size = 4 < T: the parallel form's chunks, the last one padded."""
  module = LRU(state_size=N, r_min=0.5, r_max=1.0, chunk_size=4, **kwargs)
  return module, init(module.clone(mode="parallel"), key(0), jnp.zeros((B, T, H)))


def torch_lru(params) -> torch.nn.Module:
  """lru-pytorch's LRU with our parameters (its D is a full matrix: ours on the diagonal)."""
  t = lambda name: torch.tensor(np.asarray(params[name]))
  module = LRU_pytorch.LRU(H, H, N)
  with torch.no_grad():
    for name in ("nu_log", "theta_log", "gamma_log"):
      getattr(module, name).copy_(t(name))
    module.B.copy_(torch.complex(t("B_re"), t("B_im")))
    module.C.copy_(torch.complex(t("C_re"), t("C_im")))
    module.D.copy_(torch.diag(t("D")))
  return module


def outputs_only(module, variables, x):
  return module.apply(variables, x)[0], jnp.zeros(())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["parallel", "stepwise"])
def test_matches_lru_pytorch_outputs_and_gradients(mode):
  """Both forms against torch's loop: outputs, and the gradients of every parameter (the
  parallel form's chunks, the last one padded: chunk_size 4, T 6)."""
  module, variables = make(mode=mode)
  params = variables["params"]
  x, cotangent = randn(0, B, T, H), randn(1, B, T, H)
  reference = torch_lru(params)
  y_torch = reference(torch.tensor(x))
  torch.sum(y_torch * torch.tensor(cotangent)).backward()
  y, (grads, _) = outputs_and_grads(outputs_only, module, variables, x, cotangent)
  np.testing.assert_allclose(y, y_torch.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
  g, close = grads["params"], lambda a, b: np.testing.assert_allclose(a, b, rtol=GRAD_TOL, atol=GRAD_TOL)
  for name in ("nu_log", "theta_log", "gamma_log"):
    close(g[name], getattr(reference, name).grad.numpy())
  for name in ("B", "C"):   # torch: d/d(re) + i d/d(im) of a real loss
    close(g[name + "_re"], getattr(reference, name).grad.real.numpy())
    close(g[name + "_im"], getattr(reference, name).grad.imag.numpy())
  close(g["D"], np.diag(reference.D.grad.numpy()))
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(grads))


def test_initial_state_matches_lru_pytorch():
  module, variables = make()
  x = randn(2, 1, T, H)
  h0 = randn(3, 1, N) + 1j * randn(4, 1, N)
  y_torch = torch_lru(variables["params"])(torch.tensor(x[0]), state=torch.tensor(h0[0]))
  y, _ = run(module, variables, x, initial_state=h0)
  np.testing.assert_allclose(y[0], y_torch.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)


def test_ring_initialisation_and_gamma_normalisation():
  """|λ|² uniform on [r_min², r_max²], phase uniform on [0, max_phase), γ = √(1 − |λ|²),
  B ~ N(0, 1/(2H)), C ~ N(0, 1/N), as the paper's Section 3 and its Lemma 3.2."""
  r_min, r_max, max_phase, n, h = 0.4, 0.9, math.pi / 4, 4096, 8
  module = LRU(state_size=n, r_min=r_min, r_max=r_max, max_phase=max_phase)
  p = init(module, key(1), jnp.zeros((1, 1, h)))["params"]
  magnitude = np.exp(-np.exp(np.asarray(p["nu_log"], np.float64)))
  phase = np.exp(np.asarray(p["theta_log"], np.float64))
  assert r_min <= magnitude.min() < r_min + 0.01 and r_max - 0.01 < magnitude.max() <= r_max
  # uniform: mean (a + b)/2, standard error √((b − a)²/12 / n) = 0.0023 for |λ|², 0.0035 for θ
  assert abs(np.mean(magnitude**2) - (r_min**2 + r_max**2) / 2) < 0.01
  assert 0.0 <= phase.min() and phase.max() < max_phase
  assert abs(np.mean(phase) - max_phase / 2) < 0.015
  np.testing.assert_allclose(np.exp(p["gamma_log"]), np.sqrt(1 - magnitude**2), rtol=1e-4)
  for name, std in (("B_re", 1 / math.sqrt(2 * h)), ("B_im", 1 / math.sqrt(2 * h)),
                    ("C_re", 1 / math.sqrt(n)), ("C_im", 1 / math.sqrt(n))):
    assert abs(np.std(p[name]) / std - 1) < 0.05, name


def test_parallel_equals_stepwise_with_lengths_and_initial_state():
  module, variables = make()
  h0 = randn(5, B, N) + 1j * randn(6, B, N)
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, H),
                                  seq_lengths=jnp.array([T, 3]), initial_state=h0)


def test_step_by_step_equals_the_sequence():
  module, variables = make()
  h0 = randn(5, B, N) + 1j * randn(6, B, N)
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, H), h0)


def test_padding_equals_each_sequence_alone_in_both_directions():
  """Bidirectional: the forward state freezes past the length, the reverse one starts at the
  last valid step."""
  module, variables = make(bidirectional=True)
  assert_padding_is_each_sequence_alone(run, module, variables, randn(0, B, T, H), [T, 2],
                                        state_batch_axis=1)


def test_causal():
  module, variables = make()
  assert_causal(run, module, variables, randn(0, B, T, H), t0=3)


def test_bfloat16_computation():
  module, variables = make()
  x = randn(0, B, T, H)
  y, state = run(module.clone(dtype=jnp.bfloat16), variables, x)
  y32, state32 = run(module, variables, x)
  assert y.dtype == jnp.bfloat16 and state.dtype == jnp.complex64
  np.testing.assert_allclose(y.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="sequential"), r"mode must be one of \('parallel', 'stepwise'\)"),
    (dict(r_min=0.9, r_max=0.5), "need 0 <= r_min < r_max <= 1"),
    (dict(state_size=0), "state_size must be a positive int"),
    (dict(max_phase=0.0), r"max_phase must be in \(0, 2π\]"),
    (dict(max_phase=7.0), r"max_phase must be in \(0, 2π\]"),
    (dict(max_phase=math.inf), "max_phase must be a finite number, got inf"),
    (dict(max_phase=math.nan), "max_phase must be a finite number, got nan"),
    (dict(r_max=math.inf), "r_max must be a finite number, got inf"),
    (dict(r_min=math.nan), "r_min must be a finite number, got nan"),
])
def test_bad_config_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: LRU(**kwargs).init(jax.random.key(0), jnp.zeros((B, T, H))))


@pytest.mark.parametrize("kwargs", [dict(r_min=0.0, r_max=1e-30), dict(r_min=1 - 1e-12),
                                    dict(max_phase=1e-300)])
def test_every_ring_and_phase_allowed_initialises_finite_parameters(kwargs):
  """A ring whose |λ|² is 0 or 1 in float32, or phases that are 0 there, would make ν_log,
  θ_log or γ_log infinite (and AdamW's weight decay turns an infinite parameter into NaN):
  they stay finite, γ = √(1 − |λ|²) computed in float64 from ν_log, and |λ| within the
  ring as far as float32 holds it (|λ|² from its smallest normal number to 1 − 2⁻²⁴)."""
  r_min, r_max = kwargs.get("r_min", 0.0), kwargs.get("r_max", 1.0)
  module = LRU(state_size=256, **kwargs)
  p = init(module, key(1), jnp.zeros((1, 1, H)))["params"]
  for name, value in p.items():
    assert np.all(np.isfinite(value)), name
  magnitude = np.exp(-np.exp(np.asarray(p["nu_log"], np.float64)))
  tiny, below_one = np.finfo(np.float32).tiny, 1 - 2.0**-24
  assert np.all(magnitude <= max(r_max, math.sqrt(tiny)) * (1 + 1e-6))
  assert np.all(magnitude >= min(r_min, math.sqrt(below_one)) * (1 - 1e-6))
  np.testing.assert_allclose(np.exp(2 * np.asarray(p["gamma_log"], np.float64)),
                             -np.expm1(-2 * np.exp(np.asarray(p["nu_log"], np.float64))),
                             rtol=1e-5)


def test_bad_inputs_are_refused():
  module, variables = make()
  with pytest.raises(ValueError, match=r"x must be \[batch, time, features\]"):
    jax.eval_shape(lambda: run(module, variables, jnp.zeros((T, H))))
  with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 4\)"):
    jax.eval_shape(lambda: run(module, variables, jnp.zeros((B, T, H)),
                               initial_state=jnp.zeros((B, N + 1), jnp.complex64)))
  with pytest.raises(ValueError, match="step needs a unidirectional layer"):
    bidirectional, v = make(bidirectional=True)
    jax.eval_shape(lambda: step(bidirectional, v, jnp.zeros((2, B, N), jnp.complex64),
                                jnp.zeros((B, H))))
