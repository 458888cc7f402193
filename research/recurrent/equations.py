"""PyTorch's recurrence equations for one time step, with hand-written gradients.

Shared by the single-step cells (`cells.py`) and the fused sequence loop (`recurrence.py`);
the backward step uses only products of saved activations, which is what makes the fused
loop's backward pass cheap. `CellEquations` gives the equations of RNN, LSTM and GRU.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


def sigmoid(x: Array) -> Array:
  """σ(x) = (1 + tanh(x/2)) / 2: one vectorised tanh instead of exp and a division."""
  return 0.5 * jnp.tanh(0.5 * x) + 0.5


class StepOutput(NamedTuple):
  h: Array              # [batch, hidden] new hidden state (before any LSTM projection)
  c: Array | None       # [batch, hidden] new LSTM cell state, None for RNN and GRU
  acts: Array           # [batch, gates * hidden] gate activations
  saved: Array | None   # [batch, hidden] extra residual for the backward step


class StepGrads(NamedTuple):
  d_xw: Array              # [batch, gates * hidden] gradient w.r.t. xw (and b_ih)
  d_hw: Array | None       # gradient w.r.t. hw (and b_hh); None when it equals d_xw
  d_h_direct: Array | None  # gradient w.r.t. h_{t-1} not flowing through hw
  d_c: Array | None        # gradient w.r.t. c_{t-1}


class CellEquations(NamedTuple):
  """One cell kind: its gate count and its forward / backward time step.

  Notation follows the PyTorch documentation; the matrix products are computed by the
  caller, without biases, in PyTorch's gate order:

    xw = x_t W_ihᵀ       [batch, gates * hidden]
    hw = h_{t-1} W_hhᵀ   [batch, gates * hidden]

  SimpleRNN (1 gate):      h_t = act(xw + b_ih + hw + b_hh),  act = tanh or relu
  LSTM (4 gates i,f,g,o):  i, f, g, o = σ, σ, tanh, σ (xw + b_ih + hw + b_hh)
                           c_t = f ⊙ c_{t-1} + i ⊙ g,   h_t = o ⊙ tanh(c_t)
  GRU (3 gates r,z,n):     r = σ(xw_r + b_ir + hw_r + b_hr),  z = σ(xw_z + b_iz + hw_z + b_hz)
                           n = tanh(xw_n + b_in + r ⊙ (hw_n + b_hn))
                           h_t = (1 − z) ⊙ n + z ⊙ h_{t-1}

  `forward` returns the new state and what the backward step needs: `acts`, the gate
  activations ([batch, gates * hidden], the same shape as xw so the sequence loop can
  store them in xw's place), and `saved` ([batch, hidden] or None). `backward` uses only
  products of saved activations (no transcendental is recomputed except LSTM's tanh(c_t)).
  """
  name: str
  num_gates: int
  has_cell_state: bool
  forward: Callable[..., StepOutput]   # (xw, hw, h, c, b_ih, b_hh) -> StepOutput
  backward: Callable[..., StepGrads]   # (d_h, d_c, acts, saved, h_prev) -> StepGrads


def _rnn(activation: str) -> CellEquations:
  """Elman RNN with tanh or relu; acts holds h_t, whose value gives act'."""

  def forward(xw, hw, h, c, b_ih, b_hh):
    pre = xw + b_ih + hw + b_hh
    h_new = jnp.tanh(pre) if activation == "tanh" else jax.nn.relu(pre)
    return StepOutput(h_new, None, h_new, None)

  def backward(d_h, d_c, acts, saved, h_prev):
    d_act = 1.0 - acts * acts if activation == "tanh" else (acts > 0).astype(acts.dtype)
    return StepGrads(d_h * d_act, None, None, None)

  return CellEquations(f"rnn_{activation}", 1, False, forward, backward)


def _lstm_forward(xw, hw, h, c, b_ih, b_hh):
  i, f, g, o = jnp.split(xw + b_ih + hw + b_hh, 4, axis=-1)
  i, f, g, o = sigmoid(i), sigmoid(f), jnp.tanh(g), sigmoid(o)
  c_new = f * c + i * g
  return StepOutput(o * jnp.tanh(c_new), c_new, jnp.concatenate([i, f, g, o], -1), c)


def _lstm_backward(d_h, d_c, acts, saved, h_prev):
  i, f, g, o = jnp.split(acts, 4, axis=-1)
  c_prev = saved
  tanh_c = jnp.tanh(f * c_prev + i * g)
  d_c = d_c + d_h * o * (1.0 - tanh_c * tanh_c)
  d_gates = jnp.concatenate([
      d_c * g * i * (1.0 - i),            # input gate
      d_c * c_prev * f * (1.0 - f),       # forget gate
      d_c * i * (1.0 - g * g),            # cell candidate
      d_h * tanh_c * o * (1.0 - o),       # output gate
  ], -1)
  return StepGrads(d_gates, None, None, d_c * f)


def _gru_forward(xw, hw, h, c, b_ih, b_hh):
  x_r, x_z, x_n = jnp.split(xw + b_ih, 3, axis=-1)
  h_r, h_z, h_n = jnp.split(hw + b_hh, 3, axis=-1)
  r = sigmoid(x_r + h_r)
  z = sigmoid(x_z + h_z)
  n = jnp.tanh(x_n + r * h_n)
  h_new = (1.0 - z) * n + z * h
  return StepOutput(h_new, None, jnp.concatenate([r, z, n], -1), h_n)


def _gru_backward(d_h, d_c, acts, saved, h_prev):
  r, z, n = jnp.split(acts, 3, axis=-1)
  h_n = saved
  d_n = d_h * (1.0 - z) * (1.0 - n * n)    # through n's tanh
  d_r = d_n * h_n * r * (1.0 - r)
  d_z = d_h * (h_prev - n) * z * (1.0 - z)
  d_xw = jnp.concatenate([d_r, d_z, d_n], -1)
  d_hw = jnp.concatenate([d_r, d_z, d_n * r], -1)
  return StepGrads(d_xw, d_hw, d_h * z, None)


RNN_TANH = _rnn("tanh")
RNN_RELU = _rnn("relu")
LSTM = CellEquations("lstm", 4, True, _lstm_forward, _lstm_backward)
GRU = CellEquations("gru", 3, False, _gru_forward, _gru_backward)
