"""The Mamba block (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective
State Spaces", Figure 3; the reference code's `mamba_simple.py`): a gated, convolved
selective state space model (S6) as a sequence-mixing layer.

`Mamba` gives the block's equations, initialisation (the reference's) and parameters, which
`params_from_mambapy` maps from a PyTorch state dict; the S6 recurrence is `selective_scan`.
"""

import math
from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from research.errors import check_positive
from research.recurrent.selective import SelectiveLayer, causal_conv
from research.recurrent.selective_scan import readout, s6_step, selective_scan

Array = jax.Array
F32 = jnp.float32


class Weights(NamedTuple):
  """One direction's weights: projections in the computation dtype, the rest float32."""
  w_in: Array       # [F, 2D]  (x_in, then z)
  w_conv: Array     # [K, D]
  b_conv: Array     # [D]
  w_x: Array        # [D, R + 2N]  (δ, B, C)
  w_dt: Array       # [R, D]
  b_dt: Array       # [D]
  a: Array          # [D, N], A = −exp(A_log)
  d: Array          # [D]
  w_out: Array      # [D, F]


def _dense(x: Array, w: Array) -> Array:
  """x [..., i] W [i, o] in W's dtype, accumulated in float32."""
  return jnp.einsum("...i,io->...o", x.astype(w.dtype), w, preferred_element_type=F32)


def _project_in(w: Weights, x: Array) -> tuple[Array, Array]:
  """(x_in, z) [..., D] each, float32."""
  x_in, z = jnp.split(_dense(x, w.w_in), 2, axis=-1)
  return x_in, z


def _convolve(w: Weights, window: Array) -> Array:
  """u = SiLU(causal depthwise convolution + b_conv): window [B, K − 1 + T, D] (the carried
  inputs, then T new ones) -> u [B, T, D]."""
  return jax.nn.silu(causal_conv(window, w.w_conv) + w.b_conv)


def _selection(w: Weights, u: Array, rank: int) -> tuple[Array, Array, Array]:
  """Δ [..., D], B [..., N], C [..., N] float32 from u [..., D]."""
  delta, b, c = jnp.split(_dense(u, w.w_x), [rank, rank + w.a.shape[1]], axis=-1)
  return jax.nn.softplus(_dense(delta, w.w_dt) + w.b_dt), b, c


def _output(w: Weights, y: Array, u: Array, z: Array) -> Array:
  """out [..., F] float32 = ((y + D ⊙ u) ⊙ SiLU(z)) W_out, y = h C [..., D]."""
  y = y + jnp.einsum("...d,d->...d", u, w.d)
  return _dense(y * jax.nn.silu(z), w.w_out)


def _last_inputs(window: Array, valid: Array | None, taps: int) -> Array:
  """The K − 1 inputs before each sequence's end, [B, K − 1, D], from the window
  [B, K − 1 + T, D] (valid [B, T]: a prefix of each row)."""
  steps = window.shape[1] - taps + 1
  if valid is None:
    return window[:, steps:]
  lengths = valid.sum(1)
  index = lengths[:, None] + jnp.arange(taps - 1)[None]
  return jnp.take_along_axis(window, index[..., None], axis=1)


def softplus_inverse(x: Array) -> Array:
  """y with softplus(y) = x > 0: x + log(1 − exp(−x)), as the reference code."""
  return x + jnp.log(-jnp.expm1(-x))


def params_from_mambapy(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This layer's parameters (one direction) from the state dict of a mambapy `MambaBlock`
  or of the reference code's `Mamba` (the same names, as NumPy arrays, e.g.
  `{k: v.numpy() for k, v in block.state_dict().items()}`). Linear in each array, so it
  also maps the parameters' gradients."""
  get = lambda name: np.asarray(state[name])
  return {
      "in_proj": get("in_proj.weight").T,
      "conv_kernel": get("conv1d.weight")[:, 0].T,
      "conv_bias": get("conv1d.bias"),
      "x_proj": get("x_proj.weight").T,
      "dt_proj": get("dt_proj.weight").T,
      "dt_bias": get("dt_proj.bias"),
      "A_log": get("A_log"),
      "D": get("D"),
      "out_proj": get("out_proj.weight").T,
  }


def _uniform(bound: float) -> nn.initializers.Initializer:
  def init(key, shape, dtype=F32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


class Mamba(SelectiveLayer):
  """The Mamba block: x [B, T, F] -> (y [B, T, F] in `dtype`, zero past each length; the
  carry (x_in [B, K − 1, D], h [B, D, N])).

  For x [B, T, F], expand E, D = E·F inner channels, N = state_size states per channel, a
  causal depthwise convolution of K = conv_size taps and a rank R = dt_rank for Δ:

    (x_in, z) = x W_in                                   W_in [F, 2D]; x_in, z [B, T, D]
    u_t = SiLU(Σ_k W_conv[k] ⊙ x_in_{t−K+1+k} + b_conv)  W_conv [K, D], b_conv [D]
    (δ_t, B_t, C_t) = u_t W_x                            W_x [D, R + 2N]; δ [R], B_t, C_t [N]
    Δ_t = softplus(δ_t W_dt + b_dt)                      W_dt [R, D], b_dt [D]; Δ_t [D]
    A = −exp(A_log)                                      A_log [D, N]
    h_t = exp(Δ_t ⊗ A) ⊙ h_{t−1} + (Δ_t ⊙ u_t) ⊗ B_t     h [D, N]
    y_t = h_t C_t + D_skip ⊙ u_t                         D_skip [D] (the parameter "D")
    out_t = (y_t ⊙ SiLU(z_t)) W_out                      W_out [D, F]

  (zero-order hold on A, Euler on B, as the reference code; x_in before t = 0 is the carried
  convolution state, zeros to start). The recurrence and y_t = h_t C_t are `selective_scan`
  (fused; parallel: chunks of `chunk_size` steps side by side joined by `associative_scan`;
  stepwise: one step at a time, with `s6_step`, which is also `step`'s).

  Initialisation as the reference block (`mamba_simple.py`, and mambapy's `MambaBlock`,
  which follows it): W_in, W_x, W_out as torch's nn.Linear default U(±1/√fan_in), W_conv and
  b_conv as torch's Conv1d default U(±1/√K); W_dt ~ U(±dt_scale/√R); b_dt = softplus⁻¹(dt),
  dt = max(exp(U(log dt_min, log dt_max)), dt_init_floor); A_log[d, n] = log(n + 1)
  (S4D-real); D_skip = 1. No biases on the projections, a bias on the convolution (the
  reference's bias=False, conv_bias=True).

  Parameters (each with a leading 2 when bidirectional, the reverse direction's second):
  in_proj W_in, conv_kernel W_conv, conv_bias b_conv, x_proj W_x, dt_proj W_dt, dt_bias
  b_dt, A_log, D (D_skip), out_proj W_out; `params_from_mambapy` maps a PyTorch state dict
  to them.

  The carry is (the last K − 1 inputs of the convolution, x_in [B, K − 1, D]; the state
  h [B, D, N]), float32. A padded step (seq_lengths) has u = 0 and Δ = 0: the state stays as
  it was (whatever x holds there, inf included), and the convolution's carry holds each
  sequence's last K − 1 valid inputs (padding comes after the valid steps, as the frame's
  masks). The projections run in `dtype` with float32 accumulation; the convolution, Δ, the
  recurrence and the readout in float32. Its speed on a CPU, parallel against stepwise:
  docs/recurrent.md.
  """
  state_size: int = 16            # N, states per inner channel
  chunk_size: int = 128           # parallel form: steps per chunk (the fastest measured on a
                                  # CPU from T = 1024 to 16 384; see docs/recurrent.md)
  expand: int = 2                 # E: D = E·F inner channels
  conv_size: int = 4              # K, taps of the causal depthwise convolution (d_conv)
  dt_rank: int | str = "auto"     # R, rank of Δ's projection; "auto": ⌈F / 16⌉
  dt_min: float = 0.001           # initial Δ log-uniform in [dt_min, dt_max] …
  dt_max: float = 0.1
  dt_init_floor: float = 1e-4     # … and at least this
  dt_scale: float = 1.0           # W_dt ~ U(±dt_scale / √R)

  def check_options(self) -> None:
    super().check_options()
    for name in ("expand", "conv_size"):
      check_positive(name, getattr(self, name))
    rank = self.dt_rank
    if rank != "auto" and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
      raise ValueError(f"dt_rank must be 'auto' or a positive int, got {rank!r}")
    if not 0.0 < self.dt_min <= self.dt_max:
      raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min!r}, "
                       f"dt_max={self.dt_max!r}")
    if not self.dt_init_floor >= 0.0:
      raise ValueError(f"dt_init_floor must be >= 0, got {self.dt_init_floor!r}")
    if not self.dt_scale >= 0.0:
      raise ValueError(f"dt_scale must be >= 0, got {self.dt_scale!r}")

  def rank(self, features: int) -> int:
    """R: dt_rank, or ⌈F / 16⌉ for "auto"."""
    return math.ceil(features / 16) if self.dt_rank == "auto" else self.dt_rank

  def direction_parameters(self, features: int) -> int:
    inner, rank, n, k = self.expand * features, self.rank(features), self.state_size, self.conv_size
    return inner * (2 * features + k + 1 + rank + 2 * n + rank + 1 + n + 1 + features)

  @nn.nowrap
  def zero_state(self, batch: int, features: int) -> tuple[Array, Array]:
    inner = self.expand * features
    return (jnp.zeros((batch, self.conv_size - 1, inner), F32),
            jnp.zeros((batch, inner, self.state_size), F32))

  def _dt_bias_init(self, key, shape, dtype=F32):
    low, high = math.log(self.dt_min), math.log(self.dt_max)
    dt = jnp.exp(jax.random.uniform(key, shape, F32, low, high))
    return softplus_inverse(jnp.maximum(dt, self.dt_init_floor)).astype(dtype)

  def _a_log_init(self, key, shape, dtype=F32):
    del key
    return jnp.broadcast_to(jnp.log(jnp.arange(1, shape[-1] + 1, dtype=dtype)), shape)

  @nn.compact
  def weights(self, features: int) -> Weights:
    inner, rank, n, k = self.expand * features, self.rank(features), self.state_size, self.conv_size
    linear = lambda fan_in: _uniform(1.0 / math.sqrt(fan_in))     # torch's nn.Linear default
    param = self.direction_param
    dtype = self.dtype or F32
    f32 = lambda v: v.astype(F32)
    cast = lambda v: v.astype(dtype)
    return Weights(
        w_in=cast(param("in_proj", linear(features), (features, 2 * inner))),
        w_conv=f32(param("conv_kernel", linear(k), (k, inner))),
        b_conv=f32(param("conv_bias", linear(k), (inner,))),
        w_x=cast(param("x_proj", linear(inner), (inner, rank + 2 * n))),
        w_dt=cast(param("dt_proj", _uniform(self.dt_scale / math.sqrt(rank)), (rank, inner))),
        b_dt=f32(param("dt_bias", self._dt_bias_init, (inner,))),
        a=-jnp.exp(f32(param("A_log", self._a_log_init, (inner, n)))),
        d=f32(param("D", nn.initializers.ones, (inner,))),
        w_out=cast(param("out_proj", linear(inner), (inner, features))))

  def run(self, w: Weights, x: Array, valid: Array | None, state: tuple[Array, Array],
          parallel: bool) -> tuple[Array, tuple[Array, Array]]:
    conv_state, h0 = state
    x_in, z = _project_in(w, x)                                   # [B, T, D] each
    window = jnp.concatenate([conv_state.astype(F32), x_in], axis=1)
    u = _convolve(w, window)
    if valid is not None:     # padding: u = 0 (whatever x holds there), and below Δ = 0
      u = jnp.where(valid[..., None], u, 0.0)
    delta, b, c = _selection(w, u, w.w_dt.shape[0])
    if valid is not None:                                         # a = 1, nothing added
      delta = jnp.where(valid[..., None], delta, 0.0)
    y, h_last = selective_scan(delta, u, b, c, w.a, h0.astype(F32), parallel=parallel,
                               chunk=self.chunk_size)
    return _output(w, y, u, z), (_last_inputs(window, valid, self.conv_size), h_last)

  def advance(self, w: Weights, state: tuple[Array, Array],
              x_t: Array) -> tuple[tuple[Array, Array], Array]:
    conv_state, h = state
    x_in, z = _project_in(w, x_t)                                 # [B, D] each
    window = jnp.concatenate([conv_state.astype(F32), x_in[:, None]], axis=1)   # [B, K, D]
    u = _convolve(w, window)[:, 0]
    delta, b, c = _selection(w, u, w.w_dt.shape[0])
    h = s6_step(h.astype(F32), w.a, delta, u, b)
    return (window[:, 1:], h), _output(w, readout(h, c), u, z)
