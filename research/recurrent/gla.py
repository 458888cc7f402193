"""Gated linear attention (Yang, Wang, Shen, Panda & Kim 2024, "Gated Linear Attention
Transformers with Hardware-Efficient Training", §4), its layer with flash-linear-attention's
choices (fla/layers/gla.py) where the paper leaves one open.

Linear attention whose state decays by a data-dependent gate per key channel; its parallel
form is the paper's chunkwise one, computed in log space so that no exponential overflows.
"""

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_positive
from research.recurrent.selective import SelectiveLayer

Array = jax.Array
F32 = jnp.float32


class Weights(NamedTuple):
  """One direction's parameters (each [directions, ...] as `weights` returns them)."""
  w_q: Array          # [F, M, d_k]
  w_k: Array          # [F, M, d_k]
  w_v: Array          # [F, M, d_v]
  w_r: Array          # [F, M, d_v], the output gate
  w_gate_down: Array  # [F, r], W_α1
  w_gate_up: Array    # [r, M, d_k], W_α2
  b_gate: Array       # [M, d_k], b_α
  norm_scale: Array   # [d_v], γ
  w_o: Array          # [M, d_v, F]


def xavier(in_axis, out_axis) -> nn.initializers.Initializer:
  """Xavier-uniform with gain 2^{−2.5}: U(±2^{−2.5} √(6 / (fan_in + fan_out)))."""
  return nn.initializers.variance_scaling(2.0**-5, "fan_avg", "uniform", in_axis=in_axis,
                                          out_axis=out_axis)


def _dot(x: Array, w: Array, dtype, axes: int = 1) -> Array:
  """x [..., *w.shape[:axes]] contracted with w over those axes -> [..., *w.shape[axes:]], in
  `dtype` with float32 accumulation, as one [·, K] × [K, ·] matrix product (as an einsum with
  w [F, M, d_k], the parallel layer's forward + backward took 8% longer on a CPU, at x
  [1, 4 096, 32] and [8, 512, 32])."""
  lead, size = x.shape[:x.ndim - axes], math.prod(w.shape[:axes])
  rows, cols = x.reshape(-1, size), w.reshape(size, -1)
  flat = jnp.dot(rows.astype(dtype), cols.astype(dtype), preferred_element_type=F32)
  return flat.reshape(lead + w.shape[axes:])


def _project(w: Weights, x: Array, temperature: float, dtype):
  """q, k, log α [..., M, d_k]; v, r [..., M, d_v]; float32, for x [..., F]."""
  q, k, v, r = (_dot(x, w_in, dtype) for w_in in (w.w_q, w.w_k, w.w_v, w.w_r))
  logit = _dot(_dot(x, w.w_gate_down, dtype), w.w_gate_up, dtype) + w.b_gate.astype(F32)
  return q, k, v, jax.nn.log_sigmoid(logit) / temperature, r


def _readout(w: Weights, o: Array, r: Array, eps: float, dtype) -> Array:
  """y [..., F] float32 = (RMSNorm(o) ⊙ swish(r)) W_o, o and r [..., M, d_v]."""
  normed = o * jax.lax.rsqrt(jnp.mean(o * o, -1, keepdims=True) + eps)
  # γ applied to W_o's rows, (n ⊙ γ) W_o = n (diag(γ) W_o): γ's gradient is then a sum over
  # [M, d_v, F] instead of a reduction over every step
  w_o = w.norm_scale.astype(F32)[:, None] * w.w_o.astype(F32)
  return _dot(normed * jax.nn.silu(r), w_o, dtype, axes=2)


def _recur(state: Array, q: Array, k: Array, v: Array, log_alpha: Array) -> tuple[Array, Array]:
  """One step: S = diag(α) S + kᵀ v, o = (q d_k^{−1/2}) S. state [..., M, d_k, d_v]; q, k,
  log α [..., M, d_k]; v [..., M, d_v] -> (S, o [..., M, d_v]). o as a product and a sum
  over d_k, which XLA fuses with the step (as an einsum, a matrix-vector call of its own each
  step, the stepwise layer took 12.5 against 11.0 ms at T = 4 096 on a CPU)."""
  state = jnp.exp(log_alpha)[..., None] * state + k[..., :, None] * v[..., None, :]
  return state, jnp.sum((q * q.shape[-1] ** -0.5)[..., None] * state, -2)


def _chunks(x: Array, size: int) -> Array:
  """[B, T, ...] -> [B, T / size, size, ...], zeros after step T."""
  count = -(-x.shape[1] // size)
  pad = ((0, 0), (0, count * size - x.shape[1])) + ((0, 0),) * (x.ndim - 2)
  return jnp.pad(x, pad).reshape((x.shape[0], count, size) + x.shape[2:])


def _pair_decays(log_alpha: Array) -> Array:
  """log α [B, n, C, M, d_k] -> e^{Σ_{s<r≤t} log α_r} [B, n, C(t), C(s), M, d_k], zero for
  s > t. Each exponent is the sum of its own terms (a cumulative sum over t of log α_r kept
  where r > s), never a difference of two cumulative sums."""
  t = jnp.arange(log_alpha.shape[2])
  later = (t[:, None] > t[None, :])[:, :, None, None]                      # [r, s]: r > s
  exponent = jnp.cumsum(jnp.where(later, log_alpha[:, :, :, None], 0.0), axis=2)
  return jnp.where((t[:, None] >= t[None, :])[:, :, None, None], jnp.exp(exponent), 0.0)


def _carry(decays: Array, adds: Array, state: Array, reverse: bool = False):
  """S_c = diag(decays_c) S_{c−1} + adds_c over c (backwards when `reverse`) from `state`:
  (the last S, S before each c). decays [n, ..., d_k], adds [n, ..., d_k, d_v]."""
  def step(s, chunk):
    decay, add = chunk
    return decay[..., None] * s + add, s

  return jax.lax.scan(step, state, (decays, adds), reverse=reverse)


@jax.custom_vjp
def _across_chunks(decays: Array, adds: Array, state: Array) -> tuple[Array, Array]:
  """S_out = diag(e^{b_C}) S_in + adds from chunk to chunk (`_carry`). Its backward pass is
  the same recurrence run backwards on the cotangents, H_{c−1} = ∂entering_c + e^{b_C,c} ⊙
  H_c from H_{n−1} = ∂last, then ∂adds_c = H_c and ∂e^{b_C,c} = Σ_v H_c ⊙ S_in,c outside
  the loop: a loop of one product and sum per chunk, as the forward one (autodiff's summed
  over d_v inside it, which took XLA's CPU backend as long as the rest of the chunk form)."""
  return _carry(decays, adds, state)


def _across_chunks_fwd(decays, adds, state):
  last, entering = _carry(decays, adds, state)
  return (last, entering), (decays, entering)


def _across_chunks_bwd(residuals, cotangents):
  decays, entering = residuals
  d_last, d_entering = cotangents
  d_state, after = _carry(decays, d_entering, d_last, reverse=True)     # H_c
  return jnp.einsum("n...kv,n...kv->n...k", after, entering), after, d_state


_across_chunks.defvjp(_across_chunks_fwd, _across_chunks_bwd)


def _chunked(q, k, v, log_alpha, state, size: int):
  """The chunkwise parallel form (§4.2-4.3), inputs and result as
  `gated_linear_attention`'s: time is cut into chunks of C = size steps. Within a chunk,
  with the chunk's start as origin, b_t = Σ_{r≤t} log α_r (≤ 0):

    o_t = (q̃_t ⊙ e^{b_t}) S_in  +  Σ_{s≤t} Σ_i q̃_ti k_si e^{Σ_{s<r≤t} log α_ri} v_s
    S_out = diag(e^{b_C}) S_in  +  Σ_s (k_s ⊙ e^{Σ_{s<r≤C} log α_r})ᵀ v_s

  (q̃ = q d_k^{−1/2}): the chunks' contributions to the state are matrix products side by
  side, then S is carried from chunk to chunk (`jax.lax.scan` over the T / C chunks, as
  fla's kernels loop over chunks), then every output at once.

  Every exponent is a sum of log-gates, ≤ 0, so no exponential can overflow whatever the
  gates (log α = −30 a step is e^{−1920} over 64 steps: it underflows to 0, its value in
  float32). The paper's e^{b_t} · e^{−b_s} is never formed (e^{−b_s} overflows float32
  after 88 / |log α| steps), and neither is b_t − b_s: a difference of two large cumulative
  sums loses their digits (gates of −30 for 5 steps, then mild ones: |b| ≈ 150, whose
  rounding, 10⁻⁵, would be the error of every later decay). Each pair's decay is the sum of
  its own log-gates, per key channel: C² · d_k numbers per chunk and head, C · T · M · d_k
  per sequence (and as many for their gradient). Chunks are therefore short: 8 steps by
  default, the fastest of 4 to 64 for forward and backward on a CPU at T = 4096 (widths 32
  and 128, state_size 16 and 64). fla's GPU kernels also compute sub-chunks of 16 steps in
  log space; on a GPU, where each of the T / C sequential steps costs a kernel launch,
  longer chunks may pay."""
  num_steps = q.shape[1]
  q = q * q.shape[-1] ** -0.5
  q, k, v, log_alpha = (_chunks(a, size) for a in (q, k, v, log_alpha))   # [B, n, C, M, ·]
  into = jnp.cumsum(log_alpha, axis=2)                                     # b_t
  rest = jnp.cumsum(log_alpha[:, :, ::-1], axis=2)[:, :, ::-1]             # Σ_{r≥s} log α_r
  after = jnp.concatenate([rest[:, :, 1:], jnp.zeros_like(rest[:, :, :1])], axis=2)  # r > s
  adds = jnp.einsum("bncmk,bncmv->nbmkv", k * jnp.exp(after), v)           # [n, B, M, d_k, d_v]

  decays = jnp.exp(jnp.moveaxis(rest[:, :, 0], 1, 0))                     # e^{b_C} [n, B, M, d_k]
  last, entering = _across_chunks(decays, adds, state)
  o = jnp.einsum("bntmk,nbmkv->bntmv", q * jnp.exp(into), entering)
  scores = jnp.einsum("bntmk,bnsmk,bntsmk->bntsm", q, k, _pair_decays(log_alpha))
  o = o + jnp.einsum("bntsm,bnsmv->bntmv", scores, v)
  return o.reshape((o.shape[0], -1) + o.shape[3:])[:, :num_steps], last


def gated_linear_attention(q: Array, k: Array, v: Array, log_alpha: Array, state: Array,
                           chunk_size: int | None = None) -> tuple[Array, Array]:
  """S_t = diag(α_t) S_{t−1} + k_tᵀ v_t, o_t = (q_t d_k^{−1/2}) S_t from S_0 = state, the
  equations of fla's `naive_recurrent_gla` (its gk is log α). q, k, log α [B, T, M, d_k];
  v [B, T, M, d_v]; state [B, M, d_k, d_v] -> (o [B, T, M, d_v], S_T), float32. Chunks of
  `chunk_size` steps (the parallel form), or one step at a time when None."""
  q, k, v, log_alpha, state = (a.astype(F32) for a in (q, k, v, log_alpha, state))
  if chunk_size is not None:
    return _chunked(q, k, v, log_alpha, state, min(chunk_size, q.shape[1]))
  step = lambda s, inputs: _recur(s, *inputs)
  last, o = jax.lax.scan(step, state, tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, log_alpha)))
  return jnp.moveaxis(o, 0, 1), last


class GLA(SelectiveLayer):
  """Gated linear attention: x [B, T, F] -> (y [B, T, F], the carry S [B, M, d_k, d_v]).
  `state_size` is d_v, each head's value size (M = F / d_v).

  For x_t [B, F], M = F / state_size heads, each of value size d_v = state_size and key size
  d_k = expand_k · state_size (fla's expand_k = 0.5, expand_v = 1: keys of F/2, values of F
  in all; the paper's 4 heads are state_size = F/4):

    q_t = x_t W_q,  k_t = x_t W_k                                   [B, M, d_k]
    v_t = x_t W_v                                                   [B, M, d_v]
    log α_t = logsigmoid(x_t W_α1 W_α2 + b_α) / τ                   [B, M, d_k]
    S_t = diag(α_t) S_{t−1} + k_tᵀ v_t                              [B, M, d_k, d_v]
    o_t = (q_t d_k^{−1/2}) S_t                                      [B, M, d_v]
    r_t = swish(x_t W_r)                                            [B, M, d_v]
    y_t = (RMSNorm(o_t) ⊙ r_t) W_o                                  [B, F]

  with the gate of low rank r (W_α1 [F, r], W_α2 [r, M·d_k], r = 16) and temperature τ = 16,
  α_t = σ(·)^{1/τ}, kept as its logarithm. RMSNorm is over each head's d_v values,
  o / √(mean(o²) + ε) ⊙ γ, ε = 1e-5, with one scale γ [d_v] shared by the heads (fla's
  FusedRMSNormGated over head_v_dim, elementwise_affine=True). The paper's equations differ
  in three places, where we follow fla: o_t = q_t S_t (no scale d_k^{−1/2}), a LayerNorm of
  each head's output (LN) instead of RMSNorm, and a bias b_r in the output gate,
  r_t = swish(x_t W_r + b_r).

  Initialisation (the `_initialize_weights` of fla's GLA layer in the paper's time; fla's
  models now re-initialise every linear layer N(0, 0.02²) instead): every projection W_q,
  W_k, W_v, W_r, W_α1, W_α2, W_o Xavier-uniform with gain 2^{−2.5},
  U(±2^{−2.5} √(6 / (fan_in + fan_out))) with the fans of the whole matrix (e.g. W_q
  [F, M·d_k]); b_α = 0, γ = 1.

  The carry is S [B, M, d_k, d_v] float32. A padded step (valid False) has log α = 0 and
  k = 0: S passes through it unchanged. The parallel form is `_chunked`; the stepwise form
  is `jax.lax.scan` over time of the recurrence (`_recur`), the per-step math of `advance`.
  Projections run in `dtype` (None: float32) with float32 accumulation; the gates, the
  recurrence, the state and the norm run in float32.
  """
  state_size: int = 64             # d_v, each head's value size; M = F / d_v heads
  chunk_size: int = 8              # parallel form: steps per chunk (see `_chunked`)
  expand_k: float = 0.5            # d_k = expand_k · d_v, each head's key size (fla)
  gate_rank: int = 16              # r, the rank of the forget gate's W_α1 W_α2 (paper, fla)
  gate_temperature: float = 16.0   # τ: log α = logsigmoid(·) / τ (paper; fla's normalizer)
  norm_eps: float = 1e-5           # ε of the per-head RMSNorm (fla)

  def check_options(self) -> None:
    super().check_options()
    check_positive("expand_k", self.expand_k, float)
    check_positive("gate_rank", self.gate_rank)
    check_positive("gate_temperature", self.gate_temperature, float)
    check_positive("norm_eps", self.norm_eps, float)

  def check_width(self, features: int) -> None:
    if features % self.state_size:
      raise ValueError(f"state_size={self.state_size} (each head's value size) must divide "
                       f"the width, {features}")
    key_size = self.expand_k * self.state_size
    if key_size != int(key_size) or key_size < 1:
      raise ValueError(f"expand_k · state_size (each head's key size) must be a positive "
                       f"integer, got {self.expand_k!r} · {self.state_size} = {key_size!r}")

  def geometry(self, features: int) -> tuple[int, int, int]:
    """(M heads, d_k, d_v)."""
    return features // self.state_size, int(self.expand_k * self.state_size), self.state_size

  def direction_parameters(self, features: int) -> int:
    """W_q, W_k [F, M·d_k]; W_v, W_r [F, M·d_v]; W_α1 [F, r], W_α2 [r, M·d_k], b_α
    [M·d_k]; γ [d_v]; W_o [M·d_v, F]."""
    heads, key, value = self.geometry(features)
    keys, values, rank = heads * key, heads * value, self.gate_rank
    return (2 * features * keys + 3 * features * values + features * rank + rank * keys
            + keys + value)

  @nn.compact
  def weights(self, features: int) -> Weights:
    heads, key, value = self.geometry(features)
    param = self.direction_param
    return Weights(
        w_q=param("query", xavier(0, (1, 2)), (features, heads, key)),
        w_k=param("key", xavier(0, (1, 2)), (features, heads, key)),
        w_v=param("value", xavier(0, (1, 2)), (features, heads, value)),
        w_r=param("output_gate", xavier(0, (1, 2)), (features, heads, value)),
        w_gate_down=param("gate_down", xavier(0, 1), (features, self.gate_rank)),
        w_gate_up=param("gate_up", xavier(0, (1, 2)), (self.gate_rank, heads, key)),
        b_gate=param("gate_bias", nn.initializers.zeros, (heads, key)),
        norm_scale=param("norm_scale", nn.initializers.ones, (value,)),
        w_o=param("out", xavier((0, 1), 2), (heads, value, features)))

  @nn.nowrap
  def zero_state(self, batch: int, features: int) -> Array:
    heads, key, value = self.geometry(features)
    return jnp.zeros((batch, heads, key, value), F32)

  @nn.nowrap
  def run(self, w: Weights, x: Array, valid: Array | None, state: Array,
          parallel: bool) -> tuple[Array, Array]:
    dtype = self.dtype or F32
    q, k, v, log_alpha, r = _project(w, x, self.gate_temperature, dtype)
    if valid is not None:   # a padded step: α = 1, nothing added
      keep = valid[..., None, None]
      k, log_alpha = jnp.where(keep, k, 0.0), jnp.where(keep, log_alpha, 0.0)
    o, last = gated_linear_attention(q, k, v, log_alpha, state,
                                     self.chunk_size if parallel else None)
    return _readout(w, o, r, self.norm_eps, dtype), last

  @nn.nowrap
  def advance(self, w: Weights, state: Array, x_t: Array) -> tuple[Array, Array]:
    dtype = self.dtype or F32
    q, k, v, log_alpha, r = _project(w, x_t, self.gate_temperature, dtype)
    state, o = _recur(state.astype(F32), q, k, v, log_alpha)
    return state, _readout(w, o, r, self.norm_eps, dtype)
