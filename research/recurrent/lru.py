"""The Linear Recurrent Unit (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks
for Long Sequences").

A diagonal complex linear recurrence (`diagonal_ssm.py`) whose eigenvalues are
parametrised exponentially, so that |λ| < 1 for any parameters, initialised on a ring, and
whose input is normalised so that the state's variance is 1 at initialisation (`LRU`).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_positive
from research.recurrent.diagonal_ssm import DiagonalSSM, System

_FLOAT32 = jnp.finfo(jnp.float32)


def _normal(stddev: float) -> nn.initializers.Initializer:
  return nn.initializers.normal(stddev)


class LRU(DiagonalSSM):
  """Linear Recurrent Unit: x [B, T, H] -> y [B, T, H].

  For x [B, T, H] and N complex states:

    λ = exp(−exp(ν_log) + i exp(θ_log))                  [N], |λ| = exp(−exp(ν_log)) < 1
    γ = exp(γ_log)                                       [N], initialised to √(1 − |λ|²)
    h_t = λ ⊙ h_{t−1} + γ ⊙ (B x_t)                      B = B_re + i B_im  [N, H]
    y_t = Re(C h_t) + D ⊙ x_t                            C = C_re + i C_im  [H, N], D [H]

  The exponential parametrisation keeps |λ| < 1 for any ν_log; γ normalises the state's
  variance at initialisation. Ring initialisation: |λ| uniform on the ring
  [r_min, r_max] in area, ν_log = log(−½ log(u₁ (r_max² − r_min²) + r_min²)), and phase
  θ = max_phase · u₂ (u₁, u₂ ~ U(0, 1)), 0 < max_phase ≤ 2π; B_re, B_im ~ N(0, 1/(2H)),
  C_re, C_im ~ N(0, 1/N), D ~ N(0, 1). In float32, |λ|² is kept inside (0, 1) and θ above
  0, so that ν_log, θ_log and γ_log are finite for every ring and phase allowed.

  Parameters: nu_log, theta_log, gamma_log [N]; B_re, B_im [N, H]; C_re, C_im [H, N]
  ([2, H, N] when bidirectional: C_fwd, C_bwd); D [H]. Running over sequences (parallel or
  stepwise, lengths, `step`, dtypes): see `DiagonalSSM`.
  """
  state_size: int = 64             # N, complex states
  r_min: float = 0.0               # smallest |λ| at initialisation
  r_max: float = 1.0               # largest |λ| at initialisation
  max_phase: float = 2 * math.pi   # phases of λ drawn from [0, max_phase)

  @property
  def num_states(self) -> int:
    return self.state_size

  def check_config(self) -> None:
    super().check_config()
    check_positive("state_size", self.state_size)

  def check_options(self) -> None:
    super().check_options()
    if not 0.0 <= self.r_min < self.r_max <= 1.0:
      raise ValueError(f"need 0 <= r_min < r_max <= 1, got r_min={self.r_min!r}, "
                       f"r_max={self.r_max!r}")
    if not 0.0 < self.max_phase <= 2 * math.pi:
      raise ValueError(f"max_phase must be in (0, 2π] (λ's phase is an angle: 2π draws every "
                       f"one), got {self.max_phase!r}")

  def _nu_log_init(self, key, shape, dtype):
    u = jax.random.uniform(key, shape, jnp.float32)
    squared = u * (self.r_max**2 - self.r_min**2) + self.r_min**2
    # |λ|² within (0, 1) in float32, so that ν_log is finite for any ring in [0, 1]
    squared = jnp.clip(squared, _FLOAT32.tiny, 1.0 - _FLOAT32.epsneg)
    return jnp.log(-0.5 * jnp.log(squared)).astype(dtype)

  def _theta_log_init(self, key, shape, dtype):
    phase = self.max_phase * jax.random.uniform(key, shape, jnp.float32)
    return jnp.log(jnp.maximum(phase, _FLOAT32.tiny)).astype(dtype)   # θ = 0 as a finite log

  @nn.compact
  def system(self, features: int) -> System:
    n, param = self.state_size, lambda name, init, shape: self.param(name, init, shape, self.param_dtype)
    nu_log = param("nu_log", self._nu_log_init, (n,))
    theta_log = param("theta_log", self._theta_log_init, (n,))
    # γ = √(1 − |λ|²) = √(−expm1(−2 exp(ν_log))): finite for |λ| within float32's 1 too
    gamma_log = self.param("gamma_log", lambda _: (0.5 * jnp.log(-jnp.expm1(
        -2.0 * jnp.exp(nu_log.astype(jnp.float32))))).astype(self.param_dtype))
    b_re = param("B_re", _normal(1.0 / math.sqrt(2 * features)), (n, features))
    b_im = param("B_im", _normal(1.0 / math.sqrt(2 * features)), (n, features))
    c_shape = (2, features, n) if self.bidirectional else (features, n)
    c_re = param("C_re", _normal(1.0 / math.sqrt(n)), c_shape)
    c_im = param("C_im", _normal(1.0 / math.sqrt(n)), c_shape)
    d = param("D", _normal(1.0), (features,))
    f32 = lambda w: w.astype(jnp.float32)
    lam = jnp.exp(jax.lax.complex(-jnp.exp(f32(nu_log)), jnp.exp(f32(theta_log))))
    b = jnp.exp(f32(gamma_log))[:, None] * jax.lax.complex(f32(b_re), f32(b_im))
    c = jax.lax.complex(f32(c_re), f32(c_im)).reshape((self.num_directions, features, n))
    return System(lam, b, c, f32(d), 1.0)
