"""The S5 layer (Smith, Warrington & Linderman 2023, "Simplified State Space Layers for
Sequence Modeling"): one multi-input multi-output state space model, diagonalised.

A continuous-time system with the diagonalised HiPPO-N matrix as its initial state matrix,
discretised by zero-order hold with a learned time step per state, run as a diagonal
complex linear recurrence (`diagonal_ssm.py`); `S5` gives the equations and initialisation.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from research.errors import check_positive
from research.recurrent.diagonal_ssm import DiagonalSSM, System

# The largest dt_max: Λ̄ = exp(Λ Δ) with Re Λ = −½ at initialisation, |Λ̄| = exp(−87) a
# normal float32 number (the smallest is exp(−87.3))
DT_LIMIT = 174.0


def hippo_n(n: int) -> tuple[np.ndarray, np.ndarray]:
  """Λ [n] (ascending Im Λ) and unitary V [n, n] with S = V diag(Λ) V*, S the normal part of
  the n-state HiPPO-LegS matrix (see `S5`)."""
  scale = np.sqrt(2.0 * np.arange(n) + 1.0)
  skew = -0.5 * np.outer(scale, scale) * np.sign(np.subtract.outer(np.arange(n), np.arange(n)))
  omega, v = np.linalg.eigh(-1j * skew)
  return -0.5 + 1j * omega, v


def _lecun(in_axis: int, out_axis: int, batch_axis: tuple[int, ...]):
  return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=in_axis,
                                          out_axis=out_axis, batch_axis=batch_axis)


def _as_pairs(z: jax.Array) -> jax.Array:
  return jnp.stack([z.real, z.imag], axis=-1)


class S5(DiagonalSSM):
  """S5 layer: x [B, T, H] -> y [B, T, H].

  Continuous time, for x [B, T, H] and P complex states:

    h'(t) = Λ h(t) + B̃ x(t),   y(t) = Re(C̃ h(t)) + D ⊙ x(t)
    Λ = Λ_re + i Λ_im [P],  B̃ [P, H] complex,  C̃ [H, P] complex,  D [H]

  discretised by zero-order hold with a learned time step per state, Δ = exp(log_step) [P]:

    Λ̄ = exp(Λ Δ),   B̄ = ((Λ̄ − 1) / Λ) ⊙ B̃          (per state, broadcast over H)
    h_t = Λ̄ ⊙ h_{t−1} + B̄ x_t,   y_t = s · Re(C̃ h_t) + D ⊙ x_t

  HiPPO-N initialisation. HiPPO-LegS, A_nk = −√((2n+1)(2k+1)) (n > k), −(n+1) (n = k), 0
  (n < k), is normal plus low rank: A = S − p pᵀ with p_n = √(n + ½), and its normal part
  S = −½ I + K (K skew-symmetric) is diagonalised as S = V Λ V* (V unitary; Λ = −½ + iω
  with ω the eigenvalues of the Hermitian −iK). Then B̃ = V⁻¹ B and C̃ = C V, with B [N, H]
  and C [H, N] (complex) drawn as LeCun truncated normals of fan-in N. With `blocks` J, the
  N-state matrix is block-diagonal with J copies of the (N/J)-state one. With conjugate
  symmetry (`conj_sym`, the paper's default) the eigenvalues come in conjugate pairs and
  only the half with Im Λ < 0 is kept, P = N/2, and s = 2 makes y real as with all N
  (s = 1, P = N otherwise). log_step ~ U(log dt_min, log dt_max),
  0 < dt_min ≤ dt_max ≤ 174; D ~ N(0, 1).

  Parameters: Lambda_re, Lambda_im, log_step [P]; B [P, H, 2] (B̃'s real and imaginary
  parts); C [H, P, 2] ([2, H, P, 2] when bidirectional: C̃_fwd, C̃_bwd); D [H]. Running over
  sequences (parallel or stepwise, bidirectional, lengths, `step`, dtypes): see
  `DiagonalSSM`.
  """
  state_size: int = 64             # N, the HiPPO-N states (P = N/2 kept with conj_sym)
  blocks: int = 1                  # J, HiPPO-N blocks on the diagonal of the initial Λ
  conj_sym: bool = True            # keep one state of each conjugate pair, s = 2
  dt_min: float = 0.001            # log_step initialised uniform in [log dt_min, log dt_max]
  dt_max: float = 0.1

  @property
  def num_states(self) -> int:
    return self.state_size // 2 if self.conj_sym else self.state_size

  def check_config(self) -> None:
    super().check_config()
    check_positive("state_size", self.state_size)
    step = 2 * self.blocks if self.conj_sym else self.blocks
    if self.state_size % step:
      raise ValueError(f"state_size must be a multiple of {'2 × ' if self.conj_sym else ''}"
                       f"blocks = {step} (conj_sym={self.conj_sym}), got {self.state_size}")

  def check_options(self) -> None:
    super().check_options()
    check_positive("blocks", self.blocks)
    if not 0.0 < self.dt_min <= self.dt_max <= DT_LIMIT:
      raise ValueError(f"need 0 < dt_min <= dt_max <= {DT_LIMIT:g}, got dt_min="
                       f"{self.dt_min!r}, dt_max={self.dt_max!r} (a longer step makes the "
                       "initial |Λ̄| = exp(−Δ/2) underflow float32's normal numbers: every "
                       "state would forget its past at each step)")

  def init_host_bytes(self) -> int:
    """About the host memory (bytes) that the HiPPO-N initialisation takes: NumPy's
    eigendecomposition of one (N/J)-state block (float64 and complex128 matrices and
    LAPACK's workspace: 96 (N/J)², measured 90) and V [N, P] as complex128 and complex64."""
    block = self.state_size // self.blocks
    return 96 * block**2 + 24 * self.state_size * self.num_states + 8 * self.blocks**2

  def eigen_init(self) -> tuple[np.ndarray, np.ndarray]:
    """Λ [P] and V [N, P]: the kept eigenvalues and eigenvectors of the block-diagonal
    HiPPO-N matrix (V's columns orthonormal, so V⁻¹ = V* on them)."""
    lam, v = hippo_n(self.state_size // self.blocks)
    kept = self.num_states // self.blocks
    lam, v = lam[:kept], v[:, :kept]
    return np.tile(lam, self.blocks), np.kron(np.eye(self.blocks), v)

  def _log_step_init(self, key, shape, dtype):
    return jax.random.uniform(key, shape, dtype, np.log(self.dt_min), np.log(self.dt_max))

  @nn.compact
  def system(self, features: int) -> System:
    lam0, v = self.eigen_init()
    n, p = v.shape
    v = jnp.asarray(v, jnp.complex64)
    param = lambda name, init, shape: self.param(name, init, shape, self.param_dtype)
    constant = lambda value: lambda key, shape, dtype: jnp.asarray(value, dtype)

    def b_init(key, shape, dtype):
      b = _lecun(0, 1, ())(key, (n, features), jnp.float32)
      return _as_pairs(v.conj().T @ b).astype(dtype)

    c_batch = (0, 1) if self.bidirectional else (0,)
    c_shape = (2, features, n, 2) if self.bidirectional else (features, n, 2)

    def c_init(key, shape, dtype):
      c = _lecun(-2, -1, c_batch)(key, c_shape, jnp.float32)
      return _as_pairs(jax.lax.complex(c[..., 0], c[..., 1]) @ v).astype(dtype)

    lam_re = param("Lambda_re", constant(lam0.real), (p,))
    lam_im = param("Lambda_im", constant(lam0.imag), (p,))
    log_step = param("log_step", self._log_step_init, (p,))
    b_tilde = param("B", b_init, (p, features, 2))
    c_tilde = param("C", c_init, c_shape[:-2] + (p, 2))
    d = param("D", nn.initializers.normal(1.0), (features,))

    f32 = lambda w: w.astype(jnp.float32)
    complex_of = lambda pairs: jax.lax.complex(f32(pairs[..., 0]), f32(pairs[..., 1]))
    lam = jax.lax.complex(f32(lam_re), f32(lam_im))
    lam_bar = jnp.exp(lam * jnp.exp(f32(log_step)))
    b_bar = ((lam_bar - 1.0) / lam)[:, None] * complex_of(b_tilde)
    c = complex_of(c_tilde).reshape((self.num_directions, features, p))
    return System(lam_bar, b_bar, c, f32(d), 2.0 if self.conj_sym else 1.0)
