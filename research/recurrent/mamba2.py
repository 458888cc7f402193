"""The Mamba-2 block (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality"; state-spaces/mamba's `mamba2_simple.py`,
`ssd_minimal.py`).

Its decay is one scalar per head and step, so the recurrence is also a masked attention (the
state space duality): `Mamba2` is the block, `ssd_chunked` the paper's chunked algorithm.
"""

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.errors import check_positive
from research.recurrent.selective import SelectiveLayer, causal_conv

Array = jax.Array
F32 = jnp.float32
DT_FLOOR = 1e-4              # dt_init_floor: the smallest initial Δ (before the bias)
A_RANGE = (1.0, 16.0)        # A_init_range: −A uniform in it at initialisation
NORM_EPS = 1e-5              # the gated RMSNorm's ε


class Weights(NamedTuple):
  in_proj: Array       # [F, 2 D_in + 2N + H], dtype
  conv_weight: Array   # [K, D_in + 2N]
  conv_bias: Array     # [D_in + 2N]
  dt_bias: Array       # [H]
  a_log: Array         # [H]
  d: Array             # [H]
  norm_weight: Array   # [D_in]
  out_proj: Array      # [D_in, F], dtype


def segsum(cum: Array) -> Array:
  """cum [..., Q], the cumulative sums of a within a chunk -> [..., Q, Q]: Σ_{j<k≤i} a_k =
  cum_i − cum_j at [i, j] for i ≥ j (0 on the diagonal), −∞ above it."""
  q = cum.shape[-1]
  return jnp.where(jnp.tril(jnp.ones((q, q), bool)), cum[..., :, None] - cum[..., None, :],
                   -jnp.inf)


def _in_chunks(u: Array, size: int) -> Array:
  """[B, T, ...] -> [B, T / size (rounded up), size, ...], zeros after step T."""
  chunks = -(-u.shape[1] // size)
  pad = ((0, 0), (0, chunks * size - u.shape[1])) + ((0, 0),) * (u.ndim - 2)
  return jnp.pad(u, pad).reshape((u.shape[0], chunks, size) + u.shape[2:])


def _then(earlier: tuple[Array, Array], later: tuple[Array, Array]) -> tuple[Array, Array]:
  """Two spans of the recurrence in turn, each (its decay [..., H], what it adds
  [..., H, P, N]): the decays multiply, the earlier addition decays through the later span."""
  return earlier[0] * later[0], later[0][..., None, None] * earlier[1] + later[1]


def ssd_chunked(x: Array, dt: Array, a: Array, b: Array, c: Array, h0: Array,
                chunk: int) -> tuple[Array, Array]:
  """The SSD recurrence h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ, y_t = h_t C_t by the chunked
  algorithm. x [B, T, H, P], dt [B, T, H] (Δ), a [H] (A), b, c [B, T, N], h0 [B, H, P, N]
  -> (y [B, T, H, P], h after step T [B, H, P, N]).

  The state space duality (SSD): with a_t = Δ_t A ≤ 0 one scalar per head and step, the
  recurrence is the masked attention y = (L ∘ C Bᵀ)(Δ x), L[i, j] = exp(Σ_{j<k≤i} a_k). The
  parallel form is the paper's chunked algorithm (its Listing 1) on chunks of Q = chunk
  steps (the last one padded with Δ = 0):

    1. within each chunk, the quadratic form with L of the chunk (`segsum`: differences of
       the chunk's cumulative sums of a, the causal mask −∞ above the diagonal);
    2. each chunk's end state from a zero start, Σ_s exp(Σ_{s<k≤Q} a_k) Δ_s x_s B_sᵀ;
    3. the state entering each chunk, h_c = exp(Σ_{chunk c−1} a) h_{c−1} + e_{c−1}:
       `jax.lax.associative_scan` over the chunks, depth log(T / Q) for accelerators (the
       states it returns are needed in step 4 whatever the scan; on a CPU it ran as fast as
       a sequential scan over the chunks at T = 4096, Q = 64);
    4. each entering state's share of the chunk's outputs, exp(Σ_{k≤i} a_k) h_c C_i.

  Every exponent is a sum of a_k ≤ 0 within one chunk: no exp overflows, whatever the
  length. As a difference of two cumulative sums it carries a float32 rounding of about
  ε·|Σ_chunk a| (ε = 6e-8), as in mamba_ssm's and fla's chunked kernels; `ssd_minimal.py`'s
  exact segsum (each entry summed on its own) is a cumulative sum over [Q, Q] per chunk,
  O(Q³), and took XLA's CPU backend 13 ms of the core's 77 (forward and backward, T = 4096,
  H = 8). Memory O(T·Q).
  """
  batch, steps, heads, size = x.shape
  q = max(1, min(chunk, steps))                                 # T = 0: no chunks
  # Δ x and Δ A as einsums, so that Δ's and A's gradients are contractions (as `_skip`'s)
  v = _in_chunks(jnp.einsum("bthp,bth->bthp", x, dt), q)       # [B, c, Q, H, P]: Δ x
  b, c = _in_chunks(b, q), _in_chunks(c, q)                     # [B, c, Q, N]
  a_dt = _in_chunks(jnp.einsum("bth,h->bth", dt, a), q)          # [B, c, Q, H]: Δ_k A
  cum = jnp.cumsum(jnp.moveaxis(a_dt, 2, 3), -1)                # [B, c, H, Q]: Σ_{k≤i} Δ_k A
  # 1. within each chunk: (L ∘ C Bᵀ) Δx
  scores = jnp.einsum("bcln,bcsn->bcls", c, b)
  y_diag = jnp.einsum("bcls,bchls,bcshp->bclhp", scores, jnp.exp(segsum(cum)), v)
  # 2. each chunk's end state from zero: step s decays through the steps after it
  ends = jnp.einsum("bcsn,bchs,bcshp->bchpn", b, jnp.exp(cum[..., -1:] - cum), v)
  # 3. the state entering each chunk, h0 first; the last is the state after the last chunk
  decays = jnp.exp(cum[..., -1])                                # [B, c, H]
  _, states = lax.associative_scan(
      _then, (jnp.concatenate([jnp.ones((batch, 1, heads)), decays], 1),
              jnp.concatenate([h0[:, None], ends], 1)), axis=1)
  # 4. the entering state's share: it decays through the chunk's steps up to each output
  y_off = jnp.einsum("bcln,bchpn,bchl->bclhp", c, states[:, :-1], jnp.exp(cum))
  y = (y_diag + y_off).reshape(batch, v.shape[1] * q, heads, size)[:, :steps]
  return y, states[:, -1]


def ssd_step(h: Array, x: Array, dt: Array, a: Array, b: Array, c: Array
             ) -> tuple[Array, Array]:
  """One step: h [B, H, P, N], x [B, H, P], dt [B, H], a [H], b, c [B, N] -> (h, y [B, H, P])."""
  h = jnp.exp(dt * a)[..., None, None] * h + jnp.einsum("bh,bhp,bn->bhpn", dt, x, b)
  return h, jnp.einsum("bhpn,bn->bhp", h, c)


def _skip(y: Array, x: Array, d: Array) -> Array:
  """y + D x, y and x [..., H, P], D [H]. As an einsum (as the norm's weight): the gradient
  for D is then a contraction, which XLA's CPU backend runs far faster than the reduction
  that a broadcast product's gradient becomes (the norm's took 3.5 ms of 30 at T = 4096)."""
  return y + jnp.einsum("...hp,h->...hp", x, d)


def _uniform(bound: float) -> nn.initializers.Initializer:
  return lambda key, shape, dtype=F32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _torch_uniform() -> nn.initializers.Initializer:
  """U(±1/√fan_in), fan_in the first axis (torch's Linear and depthwise Conv1d)."""
  return nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0, out_axis=1)


class Mamba2(SelectiveLayer):
  """The Mamba-2 block: x [B, T, F] -> y [B, T, F].

  For x [B, T, F], D_in = expand·F channels in H = D_in / P heads of P = head_dim channels,
  N = state_size, one group (G = 1) of B and C shared by the heads, K = conv_size:

    (z, x_in, B, C, δ) = x W_in             W_in [F, 2 D_in + 2N + H], no bias
    (x, B, C)_t = SiLU(Σ_k w_k ⊙ u_{t−K+1+k} + b_conv)
                                            u = (x_in, B, C) [D_in + 2N], w [K, D_in + 2N]
                                            (causal depthwise convolution)
    Δ_t = softplus(δ_t + b_dt)              [H]
    A = −exp(A_log)                         [H]
    h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ  per head: h [P, N], x_t [P], B_t [N]
    y_t = h_t C_t + D x_t                   [P] per head, D [H]
    o_t = RMSNorm(y_t ⊙ SiLU(z_t)) W_out     gated RMSNorm over D_in (weight, ε = 1e-5);
                                            W_out [D_in, F], no bias

  The parallel form is `ssd_chunked`; the stepwise form runs the recurrence with
  `jax.lax.scan`, the same step as `advance`.

  The carry: (the convolution's last K − 1 inputs u [B, K − 1, D_in + 2N], h [B, H, P, N]),
  float32. A padded step (valid False; padding follows each sequence's valid steps, as
  `valid_mask` makes it) has Δ = 0 (a decay of 1 and nothing added) in the parallel form and
  leaves the carry as it was in the stepwise one; the convolution's carry is the last K − 1
  inputs of the valid steps.

  Initialisation (`mamba2_simple.py`): W_in, W_out, w and b_conv uniform in ±1/√fan_in
  (torch's Linear and Conv1d; fan_in F, D_in, K); b_dt = softplus⁻¹(dt),
  dt = exp(U[log dt_min, log dt_max]) clamped ≥ 1e-4; A_log = log U[1, 16]; D and the norm's
  weight ones. Parameters (per direction): in_proj, conv_weight, conv_bias, dt_bias, A_log,
  D, norm_weight, out_proj. The projections run in `dtype` (None: float32) with float32
  accumulation; the convolution, the recurrence, the norm and the carry run in float32.
  """
  state_size: int = 64       # N (mamba2_simple's d_state, the paper's N = 64)
  chunk_size: int = 32       # Q, parallel form (mamba_ssm's GPU kernels take 256): on a CPU
                             # as fast as 64 or faster at every shape measured, T = 1K to 16K
  expand: int = 2            # E: D_in = E·F
  head_dim: int = 64         # P: channels per head (mamba2.py's headdim); must divide D_in
  conv_size: int = 4         # K (d_conv): the causal depthwise convolution's width
  dt_min: float = 0.001      # initial Δ = exp(U[log dt_min, log dt_max]) (≥ 1e-4)
  dt_max: float = 0.1

  def check_options(self) -> None:
    super().check_options()
    for name in ("expand", "head_dim", "conv_size"):
      check_positive(name, getattr(self, name))
    if not 0.0 < self.dt_min <= self.dt_max:
      raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min!r}, "
                       f"dt_max={self.dt_max!r}")

  def check_width(self, features: int) -> None:
    inner = self.expand * features
    if inner % self.head_dim:
      allowed = tuple(p for p in range(1, inner + 1) if inner % p == 0)
      raise ValueError(f"head_dim must divide expand × features = {inner}: one of {allowed}, "
                       f"got {self.head_dim}")

  @nn.nowrap
  def sizes(self, features: int) -> tuple[int, int, int]:
    """(D_in, H, the convolution's channels D_in + 2N)."""
    inner = self.expand * features
    return inner, inner // self.head_dim, inner + 2 * self.state_size

  @nn.nowrap
  def direction_parameters(self, features: int) -> int:
    inner, heads, conv = self.sizes(features)
    return (features * (inner + conv + heads) + (self.conv_size + 1) * conv + 3 * heads
            + inner + inner * features)

  @nn.nowrap
  def zero_state(self, batch: int, features: int) -> tuple[Array, Array]:
    inner, heads, conv = self.sizes(features)
    return (jnp.zeros((batch, self.conv_size - 1, conv), F32),
            jnp.zeros((batch, heads, self.head_dim, self.state_size), F32))

  def _dt_bias_init(self, key, shape, dtype=F32):
    log_dt = jax.random.uniform(key, shape, F32, math.log(self.dt_min), math.log(self.dt_max))
    dt = jnp.maximum(jnp.exp(log_dt), DT_FLOOR)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)      # softplus⁻¹(dt)

  @nn.compact
  def weights(self, features: int) -> Weights:
    inner, heads, conv = self.sizes(features)
    ones = nn.initializers.ones
    a_log_init = lambda key, shape, dtype=F32: jnp.log(
        jax.random.uniform(key, shape, F32, *A_RANGE)).astype(dtype)
    p = self.direction_param
    w = Weights(
        in_proj=p("in_proj", _torch_uniform(), (features, inner + conv + heads)),
        conv_weight=p("conv_weight", _torch_uniform(), (self.conv_size, conv)),
        conv_bias=p("conv_bias", _uniform(1 / math.sqrt(self.conv_size)), (conv,)),
        dt_bias=p("dt_bias", self._dt_bias_init, (heads,)),
        a_log=p("A_log", a_log_init, (heads,)),
        d=p("D", ones, (heads,)),
        norm_weight=p("norm_weight", ones, (inner,)),
        out_proj=p("out_proj", _torch_uniform(), (inner, features)))
    dtype = self.dtype or F32
    return w._replace(**{name: getattr(w, name).astype(dtype if name.endswith("proj") else F32)
                         for name in w._fields})

  @nn.nowrap
  def _inputs(self, w: Weights, x: Array) -> tuple[Array, Array, Array]:
    """x [..., F] -> z [..., D_in], u = (x_in, B, C) [..., D_in + 2N], Δ [..., H]; float32."""
    inner, heads, conv = self.sizes(x.shape[-1])
    projected = jnp.einsum("...f,fo->...o", x.astype(w.in_proj.dtype), w.in_proj,
                           preferred_element_type=F32)
    z, u, delta = jnp.split(projected, [inner, inner + conv], -1)
    return z, u, jax.nn.softplus(delta + w.dt_bias)

  @nn.nowrap
  def _ssm_inputs(self, w: Weights, conv_out: Array) -> tuple[Array, Array, Array]:
    """SiLU of the convolution's output [..., D_in + 2N] -> x [..., H, P], B, C [..., N]."""
    inner = w.norm_weight.shape[-1]
    x, b, c = jnp.split(jax.nn.silu(conv_out + w.conv_bias),
                        [inner, inner + self.state_size], -1)
    return x.reshape(x.shape[:-1] + (inner // self.head_dim, self.head_dim)), b, c

  @nn.nowrap
  def _output(self, w: Weights, y: Array, z: Array) -> Array:
    """y [..., H, P] (with D x), z [..., D_in] -> RMSNorm(y ⊙ SiLU(z)) W_out [..., F] float32."""
    gated = y.reshape(z.shape) * jax.nn.silu(z)
    normed = gated * lax.rsqrt(jnp.mean(gated**2, -1, keepdims=True) + NORM_EPS)
    # the norm's weight applied to W_out's rows: (n ⊙ g) W = n (diag(g) W), and g's gradient a
    # product of [D_in, F] matrices instead of a reduction over every step
    out = (w.norm_weight[:, None] * w.out_proj).astype(w.out_proj.dtype)
    return jnp.einsum("...d,df->...f", normed.astype(out.dtype), out, preferred_element_type=F32)

  @nn.nowrap
  def _recur(self, w: Weights, state: tuple[Array, Array], u: Array, delta: Array
             ) -> tuple[tuple[Array, Array], Array]:
    """One step from the projected inputs u [B, D_in + 2N], Δ [B, H] -> (carry, y [B, H, P])."""
    last_inputs, h = state
    window = jnp.concatenate([last_inputs, u[:, None]], 1)              # [B, K, D_in + 2N]
    x, b, c = self._ssm_inputs(w, causal_conv(window, w.conv_weight)[:, 0])
    h, y = ssd_step(h, x, delta, -jnp.exp(w.a_log), b, c)
    return (window[:, 1:], h), _skip(y, x, w.d)

  @nn.nowrap
  def advance(self, w: Weights, state: tuple[Array, Array], x_t: Array
              ) -> tuple[tuple[Array, Array], Array]:
    z, u, delta = self._inputs(w, x_t)
    state, y = self._recur(w, state, u, delta)
    return state, self._output(w, y, z)

  @nn.nowrap
  def run(self, w: Weights, x: Array, valid: Array | None, state: tuple[Array, Array],
          parallel: bool) -> tuple[Array, tuple[Array, Array]]:
    z, u, delta = self._inputs(w, x)
    if parallel:
      y, state = self._parallel(w, u, delta, valid, state)
    else:
      y, state = self._stepwise(w, u, delta, valid, state)
    return self._output(w, y, z), state

  @nn.nowrap
  def _parallel(self, w: Weights, u: Array, delta: Array, valid: Array | None,
                state: tuple[Array, Array]) -> tuple[Array, tuple[Array, Array]]:
    """The convolution over [carry; u], then `ssd_chunked`."""
    last_inputs, h = state
    steps, width = u.shape[1], self.conv_size
    inputs = jnp.concatenate([last_inputs, u], 1)                        # [B, K − 1 + T, ...]
    x, b, c = self._ssm_inputs(w, causal_conv(inputs, w.conv_weight))
    if valid is not None:
      delta = jnp.where(valid[..., None], delta, 0.0)
    y, h = ssd_chunked(x, delta, -jnp.exp(w.a_log), b, c, h, self.chunk_size)
    if valid is None:
      last_inputs = inputs[:, steps:]
    else:   # the last K − 1 inputs of the valid steps: [carry; u] from index (valid steps) on
      index = jnp.sum(valid, 1)[:, None] + jnp.arange(width - 1)
      last_inputs = jnp.take_along_axis(inputs, index[..., None], axis=1)
    return _skip(y, x, w.d), (last_inputs, h)

  @nn.nowrap
  def _stepwise(self, w: Weights, u: Array, delta: Array, valid: Array | None,
                state: tuple[Array, Array]) -> tuple[Array, tuple[Array, Array]]:
    """`_recur` at each step (`jax.lax.scan`); a padded step keeps the carry."""
    def body(carry, inputs):
      u_t, delta_t, valid_t = inputs
      new, y_t = self._recur(w, carry, u_t, delta_t)
      if valid_t is not None:
        keep = lambda n, o: jnp.where(valid_t.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
        new = jax.tree.map(keep, new, carry)
      return new, y_t
    time_major = lambda a: None if a is None else jnp.moveaxis(a, 1, 0)
    state, y = lax.scan(body, state, (time_major(u), time_major(delta), time_major(valid)))
    return jnp.moveaxis(y, 0, 1), state
