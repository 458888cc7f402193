"""Causal linear attention as a recurrent cell (Katharopoulos et al. 2020, "Transformers are
RNNs"), with an optional per-head decay (retention, Sun et al. 2023, "Retentive Network").

Attention with the kernel φ(q)·φ(k) and a decay mask, unrolled, is a linear recurrence on a
state of d × (d + 1) numbers per head: `LinearAttentionCell` runs it one step or a whole
sequence (in parallel over time or stepwise), `LinearAttention` is the layer of a block stack.
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_choice, check_positive
from research.recurrent.layers import valid_mask
from research.recurrent.linear_scan import linear_scan

Array = jax.Array
F32 = jnp.float32
MODES = ("parallel", "stepwise")
FEATURE_MAPS = {"elu_plus_one": lambda u: jax.nn.elu(u) + 1.0, "identity": lambda u: u}


def retnet_decay(num_heads: int) -> tuple[float, ...]:
  """RetNet's per-head decays γ_m = 1 − 2^(−5−m), m = 0 … M − 1."""
  return tuple(1.0 - 2.0 ** (-5 - m) for m in range(num_heads))


class Weights(NamedTuple):
  w_qkv: Array          # [D, 3, M, d] (query, key, value)
  b_qkv: Array | None   # [3, M, d]
  w_out: Array          # [M, d, out]
  b_out: Array | None   # [out]


class LinearAttentionCell(nn.RNNCellBase):
  """Causal linear attention, one step or a whole sequence.

  For x_t [B, D], M heads of key and value size d = qkv_features / M:

    q_t = x_t W_q + b_q,  k_t = x_t W_k + b_k,  v_t = x_t W_v + b_v      [B, M, d] each
    S_t = γ S_{t−1} + φ(k_t) v_tᵀ                                         [B, M, d, d]
    z_t = γ z_{t−1} + φ(k_t)                                              [B, M, d]
    o_t = S_tᵀ φ(q_t) / (z_t · φ(q_t) + ε)    (`normalize`; else o_t = S_tᵀ φ(q_t))
    y_t = o_t W_o + b_o                                                   [B, out]

  with φ(u) = elu(u) + 1 ("elu_plus_one", positive, so z_t · φ(q_t) > 0) or φ(u) = u
  ("identity", retention's, with normalize=False), and γ [M] the per-head `decay` (γ = 1
  without). Unrolled, this is causal attention with the kernel φ(q)·φ(k) and a decay mask:
  o_t = Σ_{s≤t} γ^{t−s} (φ(q_t)·φ(k_s)) v_s / Σ_{s≤t} γ^{t−s} φ(q_t)·φ(k_s). RetNet's
  decays are `retnet_decay(M)`, γ_m = 1 − 2^(−5−m).

  The carry holds S and z side by side, [B, M, d, d + 1] float32 (the last column is z),
  so one linear recurrence (`linear_scan.py`) updates both: φ(k_t) [v_t; 1]ᵀ is added.

  `__call__(carry, x_t)` is one time step (the `flax.linen.RNNCellBase` contract, so the
  cell also runs under `nn.RNN`); `sequence(x)` runs a whole sequence, in parallel over time
  (`mode="parallel"`: chunks side by side joined by `associative_scan`, see `linear_scan.py`)
  or step by step (`"stepwise"`), the two equal; with `seq_lengths` a padded step outputs
  zeros and leaves the carry unchanged. The projections run in `dtype` with float32
  accumulation; φ, the carry and the readout run in float32.
  """
  num_heads: int = 1                        # M
  qkv_features: int | None = None           # M·d (None: the input's width D)
  out_features: int | None = None           # width of y (None: the input's width D)
  decay: tuple[float, ...] | None = None    # γ per head, each in (0, 1]; None: no decay
  feature_map: str = "elu_plus_one"         # φ: "elu_plus_one" or "identity"
  normalize: bool = True                    # divide by z_t · φ(q_t) + ε
  eps: float = 1e-6                         # ε
  use_bias: bool = True                     # biases b_q, b_k, b_v, b_o
  mode: str = "parallel"                    # sequence(): "parallel" or "stepwise"
  chunk_size: int = 64                      # parallel form: steps per chunk (`linear_scan`)
  dtype: Any = None                         # computation dtype of the projections (None: float32)
  param_dtype: Any = jnp.float32            # parameter dtype

  def _check_config(self, features: int) -> None:
    qkv = self.qkv_features or features
    if not isinstance(self.num_heads, int) or self.num_heads < 1 or qkv % self.num_heads:
      raise ValueError(f"num_heads must be a positive int dividing qkv_features={qkv}, "
                       f"got {self.num_heads!r}")
    check_choice("feature_map", self.feature_map, tuple(FEATURE_MAPS))
    check_choice("mode", self.mode, MODES)
    check_positive("chunk_size", self.chunk_size)
    if self.decay is not None and (len(self.decay) != self.num_heads
                                   or not all(0.0 < g <= 1.0 for g in self.decay)):
      raise ValueError(f"decay must be None or num_heads={self.num_heads} values in (0, 1], "
                       f"got {self.decay!r}")

  def _head_size(self, features: int) -> int:
    return (self.qkv_features or features) // self.num_heads

  @nn.compact
  def weights(self, features: int) -> Weights:
    """Creates (at init) or fetches the projections, cast to the computation dtype."""
    self._check_config(features)
    heads, size, out = self.num_heads, self._head_size(features), self.out_features or features
    dtype = self.dtype or F32
    lecun = lambda in_axis, out_axis: nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis)
    w_qkv = self.param("qkv_kernel", lecun(0, (1, 2, 3)), (features, 3, heads, size),
                       self.param_dtype)
    w_out = self.param("out_kernel", lecun((0, 1), 2), (heads, size, out), self.param_dtype)
    b_qkv = b_out = None
    if self.use_bias:
      b_qkv = self.param("qkv_bias", nn.initializers.zeros, (3, heads, size), self.param_dtype)
      b_out = self.param("out_bias", nn.initializers.zeros, (out,), self.param_dtype)
    cast = lambda w: None if w is None else w.astype(dtype)
    return Weights(cast(w_qkv), cast(b_qkv), cast(w_out), cast(b_out))

  def _phi_qkv(self, x: Array, w: Weights) -> tuple[Array, Array, Array]:
    """φ(q), φ(k), v [..., M, d] in float32 for x [..., D]."""
    qkv = jnp.einsum("...d,dcmh->...cmh", x.astype(w.w_qkv.dtype), w.w_qkv,
                     preferred_element_type=F32)
    if w.b_qkv is not None:
      qkv = qkv + w.b_qkv.astype(F32)
    q, k, v = (qkv[..., i, :, :] for i in range(3))
    phi = FEATURE_MAPS[self.feature_map]
    return phi(q), phi(k), v

  def _readout(self, state: Array, phi_q: Array, w: Weights) -> Array:
    """y [..., out] from the carry [..., M, d, d + 1] and φ(q) [..., M, d]."""
    read = jnp.einsum("...mkv,...mk->...mv", state, phi_q)
    o = read[..., :-1]
    if self.normalize:
      o = o / (read[..., -1:] + self.eps)
    y = jnp.einsum("...mv,mvo->...o", o.astype(w.w_out.dtype), w.w_out,
                   preferred_element_type=F32)
    return y if w.b_out is None else y + w.b_out.astype(F32)

  def _increment(self, phi_k: Array, v: Array) -> Array:
    """φ(k) [v; 1]ᵀ [..., M, d, d + 1]."""
    return jnp.einsum("...mk,...mv->...mkv", phi_k, jnp.concatenate([v, jnp.ones_like(v[..., :1])], -1))

  def _decay(self) -> Array | None:
    return None if self.decay is None else jnp.asarray(self.decay, F32)[:, None, None]

  def __call__(self, carry: Array, inputs: Array) -> tuple[Array, Array]:
    """One time step: carry [..., M, d, d + 1], inputs [..., D] -> (carry, y [..., out]).

    y is in `dtype` (None: float32); the carry stays float32.
    """
    w = self.weights(inputs.shape[-1])
    phi_q, phi_k, v = self._phi_qkv(inputs, w)
    decay = self._decay()
    state = carry.astype(F32) if decay is None else decay * carry.astype(F32)
    state = state + self._increment(phi_k, v)
    return state, self._readout(state, phi_q, w).astype(self.dtype or F32)

  def sequence(self, x: Array, *, initial_state: Array | None = None,
               seq_lengths: Array | None = None, reverse: bool = False) -> tuple[Array, Array]:
    """The whole sequence: x [B, T, D] -> (y [B, T, out] in `dtype`, zero past each
    sequence's length; the final carry [B, M, d, d + 1], each sequence's own).

    initial_state: the carry before the first step (None: zeros). reverse: read each
    sequence backwards, from its last valid step to t = 0 (the final carry is after t = 0).
    """
    if x.ndim != 3:
      raise ValueError(f"x must be [batch, time, features], got shape {x.shape}")
    batch, num_steps, features = x.shape
    w = self.weights(features)
    expected = self.initialize_carry(None, (batch, features)).shape
    if initial_state is not None and initial_state.shape != expected:
      raise ValueError(f"initial_state must have shape {expected} (batch, num_heads, d, d + 1), "
                       f"got {initial_state.shape}")
    valid = valid_mask(seq_lengths, batch, num_steps)
    phi_q, phi_k, v = self._phi_qkv(x, w)
    b = self._increment(phi_k, v)                                # [B, T, M, d, d + 1]
    h0 = None if initial_state is None else initial_state.astype(F32)
    states, last = linear_scan(self._decay(), b, h0, lengths=seq_lengths, reverse=reverse,
                               parallel=self.mode == "parallel", chunk=self.chunk_size)
    y = self._readout(states, phi_q, w)
    if valid is not None:
      y = jnp.where(valid[..., None], y, 0.0)
    return y.astype(self.dtype or F32), last

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array | None, input_shape: tuple[int, ...]) -> Array:
    """Zero carry [*batch, M, d, d + 1] float32 for inputs of shape [*batch, D]."""
    del rng
    size = self._head_size(input_shape[-1])
    return jnp.zeros(tuple(input_shape[:-1]) + (self.num_heads, size, size + 1), F32)

  @property
  def num_feature_axes(self) -> int:
    return 1


DECAYS = ("none", "retnet")       # LinearAttention's decay: none, or retnet_decay(heads)


class LinearAttention(nn.Module):
  """The cell over whole sequences, as a layer of a block stack (the interface of `LRU` and
  `S5`): x [B, T, F] -> (y [B, T, F] in `dtype`, zero past each length; the final carry).

  F / state_size heads of key and value size d = state_size (the state of a head is
  d × (d + 1): S and z); `decay` "retnet" gives head m RetNet's γ_m = 1 − 2^(−5−m).
  Bidirectional: a second cell ("reverse") reads each sequence backwards from its last
  valid step, and the two outputs add (the carry: [2, B, M, d, d + 1], forward first).
  """
  state_size: int = 64                  # d, each head's key and value size
  decay: str = "none"                   # "none" or "retnet"
  feature_map: str = "elu_plus_one"     # φ: "elu_plus_one" or "identity"
  normalize: bool = True                # divide by z_t · φ(q_t) + ε
  mode: str = "parallel"                # "parallel" or "stepwise"
  chunk_size: int = 64                  # parallel form: steps per chunk
  bidirectional: bool = False           # add a reverse-time cell
  dtype: Any = None                     # computation dtype of the projections (None: float32)

  @property
  def num_directions(self) -> int:
    return 2 if self.bidirectional else 1

  def check_options(self) -> None:
    """ValueError for an option the layer refuses whatever its width."""
    check_choice("decay", self.decay, DECAYS)
    check_choice("feature_map", self.feature_map, tuple(FEATURE_MAPS))
    if not isinstance(self.normalize, bool):
      raise ValueError(f"normalize must be True or False, got {self.normalize!r}")
    check_choice("mode", self.mode, MODES)
    check_positive("chunk_size", self.chunk_size)

  def check_config(self, features: int | None = None) -> None:
    """check_options, and a state size that is a positive int (dividing `features`)."""
    self.check_options()
    check_positive("state_size", self.state_size)
    if features is not None and features % self.state_size:
      raise ValueError(f"state_size={self.state_size} (the heads' size) must divide the "
                       f"width, {features}")

  def parameter_count(self, features: int) -> int:
    """W_qkv [F, 3F], W_o [F, F] and their biases, per direction."""
    return self.num_directions * (4 * features**2 + 4 * features)

  @nn.compact
  def __call__(self, x: Array, *, initial_state: Array | None = None,
               seq_lengths: Array | None = None) -> tuple[Array, Array]:
    """x [B, T, F]; initial_state [B, M, d, d + 1] ([2, …] bidirectional) or None."""
    features = x.shape[-1]
    self.check_config(features)
    heads = features // self.state_size
    decay = retnet_decay(heads) if self.decay == "retnet" else None
    y, last = 0.0, []
    for k, name in enumerate(("cell", "reverse")[:self.num_directions]):
      cell = LinearAttentionCell(heads, decay=decay, feature_map=self.feature_map,
                                 normalize=self.normalize, mode=self.mode,
                                 chunk_size=self.chunk_size, dtype=self.dtype, name=name)
      h0 = None if initial_state is None else (
          initial_state[k] if self.bidirectional else initial_state)
      out, state = cell.sequence(x, initial_state=h0, seq_lengths=seq_lengths, reverse=k == 1)
      y, last = y + out.astype(F32), [*last, state]
    return y.astype(self.dtype or F32), jnp.stack(last) if self.bidirectional else last[0]
