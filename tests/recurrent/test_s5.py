"""S5 (Smith et al. 2023): the PyPI package s5-pytorch as the reference (its S5 with our
parameters copied in: zero-order hold, associative scan in torch, bidirectional), HiPPO-N
against the HiPPO-LegS matrix built here from its definition and against s5-pytorch's
eigendecomposition, and the two forms and the single steps against each other. Padding
against each sequence alone, causality and dtypes run through the body S5 shares with LRU
(`DiagonalSSM`) and are tested in test_lru.py."""

import math
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from linear_checks import (
  FORWARD_TOL,
  GRAD_TOL,
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

from research.recurrent import S5
from research.recurrent.s5 import hippo_n

s5_pytorch = pytest.importorskip("s5")
pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, H, N = 2, 6, 3, 8


def make(**kwargs):
  module = S5(state_size=N, chunk_size=4, **kwargs)
  return module, init(module.clone(mode="parallel"), key(0), jnp.zeros((B, T, H)))


def outputs_only(module, variables, x):
  return module.apply(variables, x)[0], jnp.zeros(())


def hippo_legs(n: int) -> np.ndarray:
  """HiPPO-LegS, written from its definition (Gu et al. 2020): A_nk = −√(2n+1)√(2k+1) for
  n > k, −(n + 1) for n = k, 0 above the diagonal."""
  a = np.zeros((n, n))
  for row in range(n):
    for col in range(row + 1):
      a[row, col] = -(row + 1) if row == col else -np.sqrt((2 * row + 1) * (2 * col + 1))
  return a


def test_hippo_n_diagonalises_the_normal_part_of_hippo_legs():
  n = 8
  p = np.sqrt(np.arange(n) + 0.5)
  normal_part = hippo_legs(n) + np.outer(p, p)     # A = S − p pᵀ
  lam, v = hippo_n(n)
  np.testing.assert_allclose(v.conj().T @ v, np.eye(n), atol=1e-12)
  np.testing.assert_allclose(v @ np.diag(lam) @ v.conj().T, normal_part, atol=1e-12)
  reference = s5_pytorch.init.make_DPLR_HiPPO(n)[0]
  np.testing.assert_allclose(np.sort_complex(lam), np.sort_complex(reference), atol=1e-12)


def test_initialisation_blocks_conjugate_half_and_time_steps():
  module = S5(state_size=8, blocks=2, dt_min=0.01, dt_max=0.05)
  p = init(module, key(1), jnp.zeros((1, 1, H)))["params"]
  block = hippo_n(4)[0]
  kept = block[block.imag < 0]                      # one of each conjugate pair
  np.testing.assert_allclose(p["Lambda_re"] + 1j * p["Lambda_im"], np.tile(kept, 2), atol=1e-6)
  assert module.num_states == 4 and p["B"].shape == (4, H, 2) and p["C"].shape == (H, 4, 2)
  steps = np.exp(p["log_step"])
  assert (0.01 <= steps).all() and (steps <= 0.05).all()


def torch_s5(params, conj_sym: bool, bidirectional: bool) -> torch.nn.Module:
  """s5-pytorch's S5 with our parameters. It keeps every state (no conjugate symmetry) and
  outputs Re(C̃ h): with conj_sym, our P states are completed by their conjugates, which
  gives the same real output as our 2 Re(C̃ h)."""
  t = lambda a: torch.tensor(np.asarray(a))
  lam = t(params["Lambda_re"]) + 1j * t(params["Lambda_im"])
  b, log_step = t(params["B"]), t(params["log_step"])
  c = t(params["C"])
  c = c[..., 0] + 1j * c[..., 1]                    # [dirs?, H, P]
  if conj_sym:
    lam, log_step = torch.cat([lam, lam.conj()]), torch.cat([log_step, log_step])
    b = torch.cat([b, b * torch.tensor([1.0, -1.0])])
    c = torch.cat([c, c.conj()], dim=-1)
  if bidirectional:
    c = torch.cat([c[0], c[1]], dim=-1)               # [H, 2 N]: forward states, then reverse
  module = s5_pytorch.S5(H, lam.shape[0], bidir=bidirectional, bcInit="dense")
  with torch.no_grad():
    for name, value in (("Lambda", lam), ("B", b), ("C", c), ("D", t(params["D"])),
                        ("log_step", log_step)):
      getattr(module.seq, name).copy_(value)
  return module


def test_matches_s5_pytorch_outputs_and_gradients():
  """Bidirectional, without conjugate symmetry (the same parameters on both sides): outputs
  and every gradient. The parallel form runs chunks of 4 steps, the last one padded."""
  module, variables = make(conj_sym=False, bidirectional=True)
  x, cotangent = randn(0, B, T, H), randn(1, B, T, H)
  reference = torch_s5(variables["params"], conj_sym=False, bidirectional=True)
  y_torch = reference(torch.tensor(x))
  torch.sum(y_torch * torch.tensor(cotangent)).backward()
  y, (grads, _) = outputs_and_grads(outputs_only, module, variables, x, cotangent)
  np.testing.assert_allclose(y, y_torch.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
  g, seq = grads["params"], reference.seq
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=GRAD_TOL, atol=GRAD_TOL)
  close(g["Lambda_re"], seq.Lambda.grad.real.numpy())   # torch: d/d(re) + i d/d(im)
  close(g["Lambda_im"], seq.Lambda.grad.imag.numpy())
  c_grad = torch.stack([seq.C.grad.real, seq.C.grad.imag], -1).numpy()   # [H, 2N, 2]
  close(g["C"], np.moveaxis(c_grad.reshape(H, 2, N, 2), 1, 0))
  for name in ("B", "D", "log_step"):
    close(g[name], getattr(seq, name).grad.numpy())
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(grads))


def test_conjugate_symmetry_matches_s5_pytorch_with_the_conjugate_states():
  """Our P = N/2 states and 2 Re(C̃ h) against s5-pytorch running all N states (ours and
  their conjugates) with Re(C̃ h); stepwise here, the parallel form above."""
  module, variables = make(mode="stepwise")
  x = randn(0, B, T, H)
  y_torch = torch_s5(variables["params"], conj_sym=True, bidirectional=False)(torch.tensor(x))
  y, _ = run(module, variables, x)
  np.testing.assert_allclose(y, y_torch.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)


def test_parallel_equals_stepwise_bidirectional_with_lengths_and_initial_state():
  module, variables = make(bidirectional=True)
  h0 = randn(5, 2, B, N // 2) + 1j * randn(6, 2, B, N // 2)
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, H),
                                  seq_lengths=jnp.array([T, 3]), initial_state=h0)


def test_step_by_step_equals_the_sequence():
  module, variables = make()
  h0 = randn(5, B, N // 2) + 1j * randn(6, B, N // 2)
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, H), h0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(state_size=6, blocks=2), r"state_size must be a multiple of 2 × blocks = 4"),
    (dict(state_size=7, conj_sym=False, blocks=2), r"multiple of blocks = 2 \(conj_sym=False\)"),
    (dict(dt_min=0.1, dt_max=0.01), "need 0 < dt_min <= dt_max"),
    (dict(dt_max=175.0), r"need 0 < dt_min <= dt_max <= 174, got dt_min=0\.001, dt_max=175\.0 "
                         r"\(a longer step makes the initial \|Λ̄\| = exp\(−Δ/2\) underflow"),
    (dict(dt_max=math.inf), "dt_max must be a finite number, got inf"),
    (dict(dt_min=math.nan), "dt_min must be a finite number, got nan"),
    (dict(mode="scan"), "mode must be one of"),
])
def test_bad_config_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: S5(**kwargs).init(jax.random.key(0), jnp.zeros((B, T, H))))


def test_the_largest_time_step_allowed_keeps_outputs_and_gradients_finite():
  """Δ = 174 at initialisation: |Λ̄| = exp(−87) is still a normal float32 number."""
  module = S5(state_size=16, dt_min=174.0, dt_max=174.0, bidirectional=True)
  x = randn(0, B, T, H)
  variables = init(module, key(1), x)
  y, grads = outputs_and_grads(run, module, variables, x, randn(1, B, T, H))
  for leaf in jax.tree.leaves((variables, y, grads)):
    assert np.all(np.isfinite(leaf))


@pytest.mark.parametrize("kwargs", [dict(state_size=256, conj_sym=False),
                                    dict(state_size=256, blocks=4)])
def test_init_host_bytes_covers_what_the_initialisation_allocates(kwargs):
  """The host memory S5 reports for its HiPPO-N initialisation (what the experiments
  check before building) is at least what NumPy allocates for it (tracemalloc's peak)."""
  module = S5(**kwargs)
  tracemalloc.start()
  try:
    module.eigen_init()
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak <= module.init_host_bytes() <= 4 * peak
