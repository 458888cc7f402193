"""DeltaNet (Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight
Programmers"), parallel over the sequence as Yang, Wang, Zhang, Shen & Kim 2024
("Parallelizing Linear Transformers with the Delta Rule over Sequence Length") do, with the
layer around the recurrence as flash-linear-attention's `fla/layers/delta_net.py` builds it.

`DeltaNet` is the layer; `delta_rule_chunked` the delta rule chunkwise (WY / UT form).
"""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.errors import check_positive
from research.recurrent.selective import SelectiveLayer, causal_conv

Array = jax.Array
F32 = jnp.float32
L2_EPS = 1e-6   # fla's l2norm (use_qk_l2norm_in_kernel): q / √(Σ q² + 10⁻⁶)


class Weights(NamedTuple):
  """One direction's parameters, ready to compute with."""
  w_in: Array           # [F, 3F + M (+ F)] in dtype: W_q, W_k, W_v, W_β (, W_g) side by side
  conv: Array | None    # [K, 3F] float32: the q, k and v conv kernels (None: conv_size 0)
  norm: Array           # [d] float32, γ
  w_out: Array          # [F, F] in dtype, W_o


def l2_normalise(x: Array) -> Array:
  """x / √(|x|² + 10⁻⁶) over the last axis."""
  return x * lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + L2_EPS)


def delta_rule_step(state: Array, q: Array, k: Array, v: Array, beta: Array
                    ) -> tuple[Array, Array]:
  """One step of the delta rule: state Ŝ [B, M, d_k, d_v], q, k [B, M, d_k], v [B, M, d_v],
  β [B, M] -> (Ŝ', o [B, M, d_v]) with Ŝ' = Ŝ + β k (v − Ŝᵀ k)ᵀ, o = Ŝ'ᵀ q / √d_k."""
  delta = beta[..., None] * (v - jnp.einsum("bhkv,bhk->bhv", state, k))
  state = state + jnp.einsum("bhk,bhv->bhkv", k, delta)
  return state, jnp.einsum("bhkv,bhk->bhv", state, q * q.shape[-1] ** -0.5)


def _chunks(x: Array, size: int) -> Array:
  """[B, T, M, ...] -> [B, M, T / size, size, ...], zeros after step T."""
  batch, steps = x.shape[:2]
  count = -(-steps // size)
  x = jnp.pad(x, ((0, 0), (0, count * size - steps)) + ((0, 0),) * (x.ndim - 2))
  return jnp.moveaxis(x.reshape((batch, count, size) + x.shape[2:]), 3, 1)


def _pairs(x: Array, half: int) -> Array:
  """[..., P, e] -> [..., P / (2 half), 2, half, e]: neighbouring blocks of half rows."""
  return x.reshape(x.shape[:-2] + (-1, 2, half, x.shape[-1]))


def ut_inverse(kb: Array, k: Array) -> Array:
  """(I + StrictTril(kb kᵀ))⁻¹ [..., C, C] for kb, k [..., C, d], by blocks: from the
  1 × 1 diagonal blocks (inverse 1), each level joins neighbouring pairs of diagonal
  blocks, [[A, 0], [B, D]]⁻¹ = [[A⁻¹, 0], [−D⁻¹ B A⁻¹, D⁻¹]], B (the later rows of kb
  against the earlier rows of k) computed where it is needed: log₂ C levels of batched
  products (C padded to a power of two with rows of zeros, I there)."""
  size = k.shape[-2]
  full = 1 << (size - 1).bit_length()
  kb, k = (jnp.pad(x, ((0, 0),) * (x.ndim - 2) + ((0, full - size), (0, 0))) for x in (kb, k))
  inverse = jnp.ones(k.shape[:-2] + (full, 1, 1), F32)           # the diagonal blocks' inverses
  half = 1
  while half < full:
    below = jnp.einsum("...pid,...pjd->...pij", _pairs(kb, half)[..., 1, :, :],
                       _pairs(k, half)[..., 0, :, :])            # B of each pair
    blocks = _pairs(inverse.reshape(inverse.shape[:-3] + (full, half)), half)
    first, second = blocks[..., 0, :, :], blocks[..., 1, :, :]
    corner = -jnp.einsum("...pij,...pjk,...pkl->...pil", second, below, first)
    inverse = jnp.concatenate([jnp.concatenate([first, jnp.zeros_like(first)], -1),
                               jnp.concatenate([corner, second], -1)], -2)
    half *= 2
  return inverse[..., 0, :size, :size]


def delta_rule_chunked(q: Array, k: Array, v: Array, beta: Array, state: Array,
                       chunk: int) -> tuple[Array, Array]:
  """The delta rule over a sequence, chunkwise: q, k [B, T, M, d_k], v [B, T, M, d_v],
  β [B, T, M], state Ŝ [B, M, d_k, d_v] before the first step -> (o [B, T, M, d_v], Ŝ after
  the last step).

  Yang et al. 2024 §3.2–3.3: chunks of C = `chunk` steps. Within a chunk, with K, Q [C, d_k],
  V [C, d_v], β [C] of one head (q already scaled by 1/√d), the product of its C
  transitions is I − Wᵀ K and its C additions Uᵀ K (WY representation), where the UT
  transform gives

    T = (I + StrictTril(diag(β) K Kᵀ))⁻¹ diag(β)                          [C, C]
    W = T K  [C, d_k],   U = T V  [C, d_v]

  (the inverse by blocks, `ut_inverse`: XLA's `triangular_solve` took 0.1 s forward and 2 s
  backward for a 4096-step sequence's 32-step chunks on the CPU). Chunk to chunk, from the
  state S_[c] entering chunk c (`jax.lax.scan`, sequential over the T / C chunks):

    S_[c+1] = S_[c] + (U − W S_[c]ᵀ)ᵀ K
    O_[c] = Q S_[c]ᵀ + (Q Kᵀ ⊙ M)(U − W S_[c]ᵀ)                          M: causal (t ≥ s)

  (with Ŝ = Sᵀ: Ŝ_[c+1] = Ŝ_[c] + Kᵀ (U − W Ŝ_[c]), O = Q Ŝ_[c] + (Q Kᵀ ⊙ M)(U − W Ŝ_[c])).
  Its memory per head is O(T (C + d + d² / C)): no [T, T] matrices.
  """
  steps, d_k = q.shape[1], q.shape[-1]
  size = min(chunk, steps)
  q, k, v, beta = (_chunks(x, size) for x in (q * d_k**-0.5, k, v, beta))   # [B, M, n, C, ·]
  kb, vb = (jnp.einsum("bhnc,bhncd->bhncd", beta, x) for x in (k, v))    # diag(β) K, diag(β) V
  inverse = ut_inverse(kb, k)                                     # T = inverse diag(β)
  w = jnp.einsum("bhnij,bhnjk->bhnik", inverse, kb)
  u = jnp.einsum("bhnij,bhnjv->bhniv", inverse, vb)

  def across(s, chunk_kwu):   # one chunk: Ŝ_[c] -> Ŝ_[c+1]
    k_c, w_c, u_c = chunk_kwu
    delta = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s)
    return s + jnp.einsum("bhck,bhcv->bhkv", k_c, delta), (s, delta)

  by_chunk = lambda x: jnp.moveaxis(x, 2, 0)
  last, (entering, delta) = lax.scan(across, state, (by_chunk(k), by_chunk(w), by_chunk(u)))
  entering, delta = jnp.moveaxis(entering, 0, 2), jnp.moveaxis(delta, 0, 2)
  scores = jnp.where(jnp.tril(jnp.ones((size, size), bool)),
                     jnp.einsum("bhnid,bhnjd->bhnij", q, k), 0.0)
  o = (jnp.einsum("bhnck,bhnkv->bhncv", q, entering)
       + jnp.einsum("bhnij,bhnjv->bhniv", scores, delta))
  batch, heads, count = o.shape[:3]
  o = jnp.moveaxis(o, 1, 3).reshape(batch, count * size, heads, o.shape[-1])
  return o[:, :steps], last


def _keep(valid: Array, new: Array, old: Array) -> Array:
  """new where valid [B], else old (any trailing shape)."""
  return jnp.where(valid.reshape(valid.shape + (1,) * (new.ndim - 1)), new, old)


class DeltaNet(SelectiveLayer):
  """DeltaNet layer: x [B, T, F] -> y [B, T, F]; the carry is (the last conv inputs
  [B, max(conv_size − 1, 0), 3F], Ŝ [B, F / d, d, d]), float32.

  Width F, M = F / d heads of key and value size d = `state_size`. For x_t [B, F]:

    q̃_t, k̃_t, ṽ_t = x_t W_q, x_t W_k, x_t W_v                          [B, F] each
    q_t, k_t, v_t = SiLU(short causal depthwise conv of q̃, k̃, ṽ)        (kernel `conv_size`
                    K: c_t = Σ_{i<K} w_i ⊙ ũ_{t−K+1+i}; conv_size 0: SiLU(ũ_t), no conv)
    q_t, k_t ← q_t / √(|q_t|² + 10⁻⁶), k_t / √(|k_t|² + 10⁻⁶)          per head [B, M, d]
    β_t = σ(x_t W_β)                                                      [B, M] (2σ(·) with
                    `allow_neg_eigval`, Grazzi et al. 2024: eigenvalues of I − β k kᵀ in
                    [−1, 1])
    S_t = S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ                      per head [d_v, d_k]
    o_t = S_t q_t / √d                                                    [B, M, d]
    y_t = (RMSNorm(o_t) ⊙ γ [⊙ SiLU(x_t W_g) with `use_gate`]) W_o      per head; [B, F]

  RMSNorm(o) = o / √(mean(o²) + ε), ε = `norm_eps`, γ [d] shared by the heads. The 1/√d is
  the scale fla's layer leaves at chunk_delta_rule's default, d_k^{−1/2}, which its
  reference `delta_rule_recurrence` applies as well; the L2 norm is its
  use_qk_l2norm_in_kernel (ε 10⁻⁶). fla's layer defaults: conv_size 4 without bias, no gate,
  SiLU on q, k and v, L2 norm, norm_eps 10⁻⁵. Its own initialisation (the layer's, before
  any model's `_init_weights`), as here: PyTorch's defaults, every W ~ U(±1/√fan_in) (W_o:
  fan_in F), each conv kernel w ~ U(±1/√K) (depthwise: fan_in K), γ = 1.

  The carry holds Ŝ = Sᵀ [B, M, d_k, d_v] (fla's layout, so Ŝ_t = Ŝ_{t−1} + k_t β_t
  (v_t − Ŝ_{t−1}ᵀ k_t)ᵀ and o_t = Ŝ_tᵀ q_t / √d), and the last K − 1 conv inputs
  [B, K − 1, 3F] (q̃, k̃, ṽ side by side): the carry is the pair (conv, Ŝ), float32.

  Parallel form: `delta_rule_chunked`. Stepwise: the delta rule one step at a time
  (`advance` in `jax.lax.scan`). A padded step has β = 0 (S unchanged: T's row for it is
  zero) and leaves the conv inputs as they were; the final carry is each sequence's own.
  The transitions are contractions (|k| ≤ 1, β ≤ 1; reflections at most with
  allow_neg_eigval), so no state grows over long sequences. Projections run in `dtype`
  (None: float32) with float32 accumulation; the conv, norms, the recurrence and the carry
  run in float32.
  """
  state_size: int = 64             # d: each head's key and value size (M = F / d heads)
  conv_size: int = 4               # K: the short conv's kernel on q, k, v (0: no conv)
  use_gate: bool = False           # gate the normed output by SiLU(x W_g)
  allow_neg_eigval: bool = False   # β = 2σ(x W_β) in (0, 2) instead of σ in (0, 1)
  norm_eps: float = 1e-5           # ε of the output RMSNorm

  def check_options(self) -> None:
    super().check_options()
    if not isinstance(self.conv_size, int) or isinstance(self.conv_size, bool) \
        or self.conv_size < 0:
      raise ValueError(f"conv_size must be an int >= 0 (0: no conv), got {self.conv_size!r}")
    for name in ("use_gate", "allow_neg_eigval"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
    check_positive("norm_eps", self.norm_eps, float)

  def check_width(self, features: int) -> None:
    if features % self.state_size:
      raise ValueError(f"state_size={self.state_size} (the heads' size) must divide the "
                       f"width, {features}")

  def direction_parameters(self, features: int) -> int:
    heads = features // self.state_size
    gate = features**2 if self.use_gate else 0
    return 4 * features**2 + gate + features * heads + 3 * features * self.conv_size \
        + self.state_size

  @nn.compact
  def weights(self, features: int) -> Weights:
    heads, dtype = features // self.state_size, self.dtype or F32
    torch_default = lambda: nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
    linear = lambda name, out: self.direction_param(name, torch_default(), (features, out))
    w_in = [linear(f"{name}_proj", features) for name in "qkv"] + [linear("b_proj", heads)]
    if self.use_gate:
      w_in.append(linear("g_proj", features))
    conv = None
    if self.conv_size:
      conv = jnp.concatenate([self.direction_param(f"{name}_conv1d", torch_default(),
                                                   (self.conv_size, features))
                              for name in "qkv"], -1).astype(F32)
    norm = self.direction_param("o_norm", nn.initializers.ones, (self.state_size,))
    w_out = linear("o_proj", features)
    return Weights(jnp.concatenate(w_in, -1).astype(dtype), conv, norm.astype(F32),
                   w_out.astype(dtype))

  def zero_state(self, batch: int, features: int) -> tuple[Array, Array]:
    d = self.state_size
    return (jnp.zeros((batch, max(self.conv_size - 1, 0), 3 * features), F32),
            jnp.zeros((batch, features // d, d, d), F32))

  def _project(self, w: Weights, x: Array) -> tuple[Array, Array, Array | None]:
    """x [..., F] -> (q̃ k̃ ṽ [..., 3F], β [..., M], the gate's x W_g [..., F] or None)."""
    features = x.shape[-1]
    heads = features // self.state_size
    z = jnp.einsum("...f,fo->...o", x.astype(w.w_in.dtype), w.w_in, preferred_element_type=F32)
    beta = jax.nn.sigmoid(z[..., 3 * features:3 * features + heads])
    beta = 2.0 * beta if self.allow_neg_eigval else beta
    return z[..., :3 * features], beta, z[..., 3 * features + heads:] if self.use_gate else None

  def _qkv(self, w: Weights, padded: Array) -> tuple[Array, Array, Array]:
    """The conv inputs [B, K − 1 + T, 3F] (carried, then new) -> q, k (L2-normed), v
    [B, T, M, d]."""
    features = padded.shape[-1] // 3
    c = causal_conv(padded, w.conv) if self.conv_size else padded
    heads = lambda a: a.reshape(a.shape[:-1] + (features // self.state_size, self.state_size))
    q, k, v = (heads(a) for a in jnp.split(jax.nn.silu(c), 3, -1))
    return l2_normalise(q), l2_normalise(k), v

  def _readout(self, w: Weights, o: Array, gate: Array | None) -> Array:
    """o [..., M, d] -> y [..., F]: RMSNorm per head, γ, the gate, W_o."""
    o = jnp.einsum("...d,d->...d", o * lax.rsqrt(jnp.mean(o * o, -1, keepdims=True)
                                                 + self.norm_eps), w.norm)
    o = o.reshape(o.shape[:-2] + (-1,))
    if gate is not None:
      o = o * jax.nn.silu(gate)
    return jnp.einsum("...f,fo->...o", o.astype(w.w_out.dtype), w.w_out,
                      preferred_element_type=F32)

  def advance(self, w: Weights, state: tuple[Array, Array], x_t: Array
              ) -> tuple[tuple[Array, Array], Array]:
    conv, s = (jnp.asarray(a, F32) for a in state)
    u, beta, gate = self._project(w, x_t)
    padded = jnp.concatenate([conv, u[:, None]], 1)              # [B, K, 3F]
    q, k, v = (a[:, 0] for a in self._qkv(w, padded))
    s, o = delta_rule_step(s, q, k, v, beta)
    return (padded[:, 1:] if self.conv_size else conv, s), self._readout(w, o, gate)

  def run(self, w: Weights, x: Array, valid: Array | None, state: tuple[Array, Array],
          parallel: bool) -> tuple[Array, tuple[Array, Array]]:
    batch, steps = x.shape[:2]
    state = tuple(jnp.asarray(a, F32) for a in state)
    if not parallel:
      def body(carry, inputs):
        x_t, valid_t = inputs
        new, y_t = self.advance(w, carry, x_t)
        return jax.tree.map(lambda a, b: _keep(valid_t, a, b), new, carry), y_t

      mask = jnp.ones((batch, steps), bool) if valid is None else valid
      last, y = lax.scan(body, state, (jnp.swapaxes(x, 0, 1), mask.T))
      return jnp.swapaxes(y, 0, 1), last
    conv, s = state
    u, beta, gate = self._project(w, x)
    padded = jnp.concatenate([conv, u], 1)                       # [B, K − 1 + T, 3F]
    q, k, v = self._qkv(w, padded)
    if valid is not None:
      beta = jnp.where(valid[..., None], beta, 0.0)
    o, s = delta_rule_chunked(q, k, v, beta, s, self.chunk_size)
    lengths = jnp.full((batch,), steps) if valid is None else valid.sum(1)
    index = lengths[:, None] + jnp.arange(conv.shape[1])        # the K − 1 inputs before it
    conv = jnp.take_along_axis(padded, index[..., None], axis=1)
    return self._readout(w, o, gate), (conv, s)
