"""Recurrent cells with PyTorch's equations and parameter layout, for `flax.linen.RNN`.

`SimpleRNNCell`, `LSTMCell` and `GRUCell` compute the equations of `equations.py` with
PyTorch's parameters and initialisation: `__call__` is one time step (the
`flax.linen.RNNCellBase` contract, so the cells plug into `nn.RNN`), and `sequence` runs a
whole sequence with the fused loop of `recurrence.py`, as the multi-layer layers do.
"""

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.recurrent import equations
from research.recurrent.recurrence import matmul, recurrence

Array = jax.Array
Carry = Any


def torch_uniform(hidden_size: int) -> nn.initializers.Initializer:
  """PyTorch's initialiser for every recurrent weight and bias: U(−1/√H, 1/√H)."""
  bound = 1.0 / math.sqrt(hidden_size)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


class Weights(NamedTuple):
  w_ih: Array           # [in, gates * hidden]
  w_hh: Array           # [out, gates * hidden]
  b_ih: Array           # [gates * hidden]
  b_hh: Array           # [gates * hidden]
  w_hr: Array | None    # [hidden, out], LSTM projection only


class RecurrentCell(nn.RNNCellBase):
  """Base of the three cells: parameters, one step, a whole sequence.

  The carry is h [..., P] for RNN and GRU, and (c, h) for LSTM (flax's order). Parameters
  of a cell with input size D, hidden size H, G gates (RNN 1; LSTM 4 in PyTorch's order
  i, f, g, o; GRU 3 in order r, z, n) and output size P (H, or LSTM's `proj_size`):

    kernel_ih [D, G·H]   = PyTorch's weight_ih_lk transposed
    kernel_hh [P, G·H]   = weight_hh_lk transposed
    bias_ih   [G·H]      = bias_ih_lk
    bias_hh   [G·H]      = bias_hh_lk
    kernel_hr [H, P]     = weight_hr_lk transposed (LSTM with proj_size only)

  and all are initialised like PyTorch's, U(−1/√H, 1/√H).
  """
  features: int                    # hidden size H
  dtype: Any = None                # computation dtype of the matrix products (None: float32)
  param_dtype: Any = jnp.float32   # parameter dtype
  kernel_init: nn.initializers.Initializer | None = None  # default: PyTorch's uniform
  bias_init: nn.initializers.Initializer | None = None    # default: PyTorch's uniform

  @property
  def equations(self) -> equations.CellEquations:
    raise NotImplementedError

  @property
  def out_features(self) -> int:
    return self.features

  @nn.compact
  def weights(self, in_features: int) -> Weights:
    """Creates (at init) or fetches the parameters, cast to the computation dtype."""
    gates_hidden = self.equations.num_gates * self.features
    kernel_init = self.kernel_init or torch_uniform(self.features)
    bias_init = self.bias_init or torch_uniform(self.features)
    param = lambda name, init, shape: self.param(name, init, shape, self.param_dtype)
    w_ih = param("kernel_ih", kernel_init, (in_features, gates_hidden))
    w_hh = param("kernel_hh", kernel_init, (self.out_features, gates_hidden))
    b_ih = param("bias_ih", bias_init, (gates_hidden,))
    b_hh = param("bias_hh", bias_init, (gates_hidden,))
    w_hr = None
    if self.out_features != self.features:
      w_hr = param("kernel_hr", kernel_init, (self.features, self.out_features))
    cast = lambda w: None if w is None else w.astype(self.dtype or jnp.float32)
    return Weights(cast(w_ih), cast(w_hh), b_ih.astype(jnp.float32), b_hh.astype(jnp.float32), cast(w_hr))

  def _split_carry(self, carry: Carry) -> tuple[Array, Array | None]:
    return (carry, None) if not self.equations.has_cell_state else (carry[1], carry[0])

  def _join_carry(self, h: Array, c: Array | None) -> Carry:
    return h if c is None else (c, h)

  def __call__(self, carry: Carry, inputs: Array) -> tuple[Carry, Array]:
    """One time step. inputs: [..., in]; returns (new carry, h_t [..., P]).

    The new carry keeps the dtypes of `carry` (float32 from `initialize_carry`), so the
    cell runs under `nn.scan` / `nn.RNN` with any computation dtype; h_t is in `dtype`.
    """
    w = self.weights(inputs.shape[-1])
    h, c = self._split_carry(carry)
    out = self.equations.forward(matmul(inputs, w.w_ih), matmul(h, w.w_hh), h, c, w.b_ih, w.b_hh)
    h_new = out.h if w.w_hr is None else matmul(out.h, w.w_hr)
    c_new = None if c is None else out.c.astype(c.dtype)
    return self._join_carry(h_new.astype(h.dtype), c_new), h_new.astype(self.dtype or inputs.dtype)

  def sequence(self, inputs: Array, h0: Array, c0: Array | None = None, *,
               valid: Array | None = None, time_axis: int = 1,
               reverse: bool = False) -> tuple[Array, Array, Array | None]:
    """The whole sequence in one fused loop (see `recurrence.recurrence`).

    inputs: [batch, time, in] (time_axis=1) or [time, batch, in] (time_axis=0);
    h0: [batch, P]; c0: [batch, H] (LSTM); valid: [batch, time] bool or None.
    Returns outputs [..., P] in float32, h_last [batch, P], c_last [batch, H] or None.
    """
    w = self.weights(inputs.shape[-1])
    x = inputs.astype(self.dtype or jnp.float32)
    return recurrence(self.equations, x, w.w_ih, w.w_hh, w.b_ih, w.b_hh, h0, c0, w_hr=w.w_hr,
                      valid=valid, time_axis=time_axis, reverse=reverse)

  @nn.nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]) -> Carry:
    """Zero state for inputs of shape [*batch, in]."""
    batch = tuple(input_shape[:-1])
    h = jnp.zeros(batch + (self.out_features,), self.param_dtype)
    c = jnp.zeros(batch + (self.features,), self.param_dtype) if self.equations.has_cell_state else None
    return self._join_carry(h, c)

  @property
  def num_feature_axes(self) -> int:
    return 1


class SimpleRNNCell(RecurrentCell):
  """Elman RNN cell: h_t = act(x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh)."""
  nonlinearity: str = "tanh"       # "tanh" or "relu", as torch.nn.RNN

  @property
  def equations(self) -> equations.CellEquations:
    if self.nonlinearity not in ("tanh", "relu"):
      raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {self.nonlinearity!r}")
    return equations.RNN_TANH if self.nonlinearity == "tanh" else equations.RNN_RELU


class LSTMCell(RecurrentCell):
  """LSTM cell with PyTorch's gate order (i, f, g, o) and optional output projection.

  c_t = f ⊙ c_{t-1} + i ⊙ g,  h_t = (o ⊙ tanh(c_t)) W_hrᵀ  (projection only if proj_size).
  """
  proj_size: int = 0               # 0: no projection; else h_t has proj_size features

  @property
  def equations(self) -> equations.CellEquations:
    return equations.LSTM

  @property
  def out_features(self) -> int:
    return self.proj_size or self.features


class GRUCell(RecurrentCell):
  """GRU cell as PyTorch: the reset gate multiplies (h_{t-1} W_hnᵀ + b_hn)."""

  @property
  def equations(self) -> equations.CellEquations:
    return equations.GRU
