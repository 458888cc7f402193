"""One recurrent layer in one direction over a whole sequence, with a fused backward.

`recurrence` runs a cell's equations (`equations.py`) over time the way cuDNN and oneDNN
do, because differentiating a `lax.scan` step by step is slow on every backend: the input
projection hoisted out of the loop, the gate activations stored in its place, and a
hand-written backward pass whose weight gradients are one matrix product each.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from research.recurrent.equations import CellEquations

Array = jax.Array
F32 = jnp.float32


class _Static(NamedTuple):
  equations: CellEquations
  time_axis: int   # 1 for [batch, time, ...], 0 for [time, batch, ...]
  reverse: bool    # process the sequence from its last step to its first


def _at(a: Array, t: Array, axis: int) -> Array:
  return lax.dynamic_index_in_dim(a, t, axis, keepdims=False)


def _put(buffer: Array, value: Array, t: Array, axis: int) -> Array:
  return lax.dynamic_update_index_in_dim(buffer, value.astype(buffer.dtype), t, axis)


def matmul(a: Array, w: Array) -> Array:
  """a @ w over a's last axis, in w's dtype, accumulated in float32."""
  return jnp.einsum("...i,io->...o", a.astype(w.dtype), w, preferred_element_type=F32)


def _sum_outer(a: Array, b: Array) -> Array:
  """Σ over every leading (batch, time) index of a[..., m] b[..., n] -> [m, n]."""
  return jnp.einsum("nm,nk->mk", a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]),
                    preferred_element_type=F32)


def _step_index(k: Array, num_steps: int, reverse: bool) -> Array:
  return num_steps - 1 - k if reverse else k


def _valid_at(valid: Array | None, t: Array) -> Array | None:
  return None if valid is None else lax.dynamic_index_in_dim(valid, t, 1, keepdims=False)[:, None]


def _previous_states(ys: Array, h0: Array, valid: Array | None, s: _Static) -> Array:
  """The state each step started from, h_{t∓1}, in ys's layout.

  It is the previous step's output when that step was valid, else h0 (the first step
  of the loop, or the reverse direction's first valid step after padding).
  """
  num_steps = ys.shape[s.time_axis]
  shift = -1 if s.reverse else 1
  t = jnp.arange(num_steps)
  has_previous = jnp.broadcast_to(t != (num_steps - 1 if s.reverse else 0), (h0.shape[0], num_steps))
  if valid is not None:
    has_previous &= jnp.roll(valid, shift, axis=1)
  if s.time_axis == 0:
    has_previous = has_previous.T
  previous = jnp.roll(ys, shift, axis=s.time_axis)
  return jnp.where(has_previous[..., None], previous, jnp.expand_dims(h0, s.time_axis))


def _run_forward(s: _Static, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid, *, save: bool):
  eq, ax = s.equations, s.time_axis
  num_steps = x.shape[ax]
  xw = matmul(x, w_ih)                                      # [..., gates * hidden]
  ys = jnp.zeros(xw.shape[:-1] + h0.shape[-1:], F32)
  xw_step = _at(xw, 0, ax)
  step_shape = jax.eval_shape(eq.forward, xw_step, xw_step, h0, c0, b_ih, b_hh)
  buffer = lambda like: None if like is None else jnp.zeros(xw.shape[:-1] + like.shape[-1:], F32)
  saved = buffer(step_shape.saved) if save else None
  pre_projection = buffer(step_shape.h) if save and w_hr is not None else None

  def body(k, carry):
    h, c, xw, ys, saved, pre_projection = carry
    t = _step_index(k, num_steps, s.reverse)
    out = eq.forward(_at(xw, t, ax), matmul(h, w_hh), h, c, b_ih, b_hh)
    h_new = out.h if w_hr is None else matmul(out.h, w_hr)
    m = _valid_at(valid, t)
    y = h_new if m is None else jnp.where(m, h_new, 0.0)
    h = h_new if m is None else jnp.where(m, h_new, h)
    if c is not None:
      c = out.c if m is None else jnp.where(m, out.c, c)
    xw = _put(xw, out.acts, t, ax)  # also when not saving: one contiguous gate fusion is faster
    if saved is not None:
      saved = _put(saved, out.saved, t, ax)
    if pre_projection is not None:
      pre_projection = _put(pre_projection, out.h, t, ax)
    return h, c, xw, _put(ys, y, t, ax), saved, pre_projection

  carry = (h0.astype(F32), None if c0 is None else c0.astype(F32), xw, ys, saved, pre_projection)
  h, c, acts, ys, saved, pre_projection = lax.fori_loop(0, num_steps, body, carry)
  return (ys, h, c), (acts, saved, pre_projection)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recurrence(s, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid):
  return _run_forward(s, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid, save=False)[0]


def _recurrence_fwd(s, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid):
  outputs, buffers = _run_forward(s, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid, save=True)
  return outputs, (x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid, outputs[0], buffers)


def _recurrence_bwd(s, residuals, cotangents):
  x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid, ys, (acts, saved, pre_projection) = residuals
  d_ys, d_h_last, d_c_last = cotangents
  eq, ax = s.equations, s.time_axis
  num_steps = x.shape[ax]
  h_prev = _previous_states(ys, h0.astype(F32), valid, s)
  w_hh_t, w_hr_t = w_hh.T, None if w_hr is None else w_hr.T
  step = lambda t, d_h, d_c: eq.backward(d_h, d_c, _at(acts, t, ax), None if saved is None else _at(saved, t, ax), _at(h_prev, t, ax))
  d_h_shape = jax.ShapeDtypeStruct((h0.shape[0], acts.shape[-1] // eq.num_gates), F32)
  separate_hw = jax.eval_shape(step, 0, d_h_shape, d_c_last).d_hw is not None
  d_hw_buffer = jnp.zeros_like(acts) if separate_hw else None
  d_projected = jnp.zeros_like(ys) if w_hr is not None else None

  def body(k, carry):
    d_h, d_c, grads, d_hw_buffer, d_projected = carry
    t = _step_index(k, num_steps, not s.reverse)
    m = _valid_at(valid, t)
    d_h_step = d_h + _at(d_ys, t, ax)
    d_c_step = d_c
    if m is not None:  # a padded step passed the state through unchanged
      d_h_step, d_h_through = jnp.where(m, d_h_step, 0.0), jnp.where(m, 0.0, d_h)
      if d_c is not None:
        d_c_step, d_c_through = jnp.where(m, d_c, 0.0), jnp.where(m, 0.0, d_c)
    if w_hr is not None:
      d_projected = _put(d_projected, d_h_step, t, ax)
      d_h_step = matmul(d_h_step, w_hr_t)
    g = step(t, d_h_step, d_c_step)
    d_hw = g.d_xw if g.d_hw is None else g.d_hw
    d_h = matmul(d_hw, w_hh_t)
    if g.d_h_direct is not None:
      d_h = d_h + g.d_h_direct
    if m is not None:
      d_h = d_h + d_h_through
    if d_c is not None:
      d_c = g.d_c if m is None else g.d_c + d_c_through
    if d_hw_buffer is not None:
      d_hw_buffer = _put(d_hw_buffer, g.d_hw, t, ax)
    return d_h, d_c, _put(grads, g.d_xw, t, ax), d_hw_buffer, d_projected

  carry = (d_h_last.astype(F32), None if d_c_last is None else d_c_last.astype(F32), acts, d_hw_buffer, d_projected)
  d_h0, d_c0, d_xw, d_hw_buffer, d_projected = lax.fori_loop(0, num_steps, body, carry)
  d_hw = d_xw if d_hw_buffer is None else d_hw_buffer
  return (
      matmul(d_xw, w_ih.T).astype(x.dtype),
      _sum_outer(x, d_xw).astype(w_ih.dtype),
      _sum_outer(h_prev, d_hw).astype(w_hh.dtype),
      d_xw.sum(range(d_xw.ndim - 1)).astype(b_ih.dtype),
      d_hw.sum(range(d_hw.ndim - 1)).astype(b_hh.dtype),
      None if w_hr is None else _sum_outer(pre_projection, d_projected).astype(w_hr.dtype),
      d_h0.astype(h0.dtype),
      None if c0 is None else d_c0.astype(c0.dtype),
      None,
  )


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def recurrence(equations: CellEquations, x: Array, w_ih: Array, w_hh: Array, b_ih: Array,
               b_hh: Array, h0: Array, c0: Array | None = None, *, w_hr: Array | None = None,
               valid: Array | None = None, time_axis: int = 1,
               reverse: bool = False) -> tuple[Array, Array, Array | None]:
  """Runs one direction of one recurrent layer over a sequence.

  * forward: the input projection of all time steps, x W_ihᵀ, is one matrix product
    outside the loop; the loop does one [batch, hidden] × [hidden, gates·hidden] product
    per step and overwrites its slot of that projection with the gate activations (no
    extra buffer, no transcendental saved twice).
  * backward (custom VJP): a reverse loop does only the recurrent product
    d_hw W_hh and cheap products of saved activations, writing the gate gradients in
    place of the activations; every weight gradient (W_ih, W_hh, W_hr, biases) and dx is
    then one large matrix product over all (batch, time) pairs after the loop.

  Both layouts are handled in place by indexing the time axis (no transposes), and the
  reverse direction simply runs the loop from the last step to the first. With `valid`
  (PyTorch packed-sequence semantics) a step past a sequence's end leaves the state
  unchanged and outputs zeros, so a reverse pass starts at each sequence's last valid
  step and every final state is the sequence's own.

  Args:
    equations: the cell kind (`equations.LSTM`, `GRU`, `RNN_TANH`, `RNN_RELU`).
    x: [batch, time, in] if time_axis == 1, else [time, batch, in].
    w_ih: [in, gates * hidden]; w_hh: [out, gates * hidden]; b_ih, b_hh: [gates * hidden].
    h0: [batch, out] initial hidden state; c0: [batch, hidden] for LSTM, else None.
    w_hr: LSTM projection [hidden, out] (PyTorch's proj_size), or None (out = hidden).
    valid: [batch, time] bool, False on padding past a sequence's end, or None.
    time_axis: which axis of x (and of the outputs) is time.
    reverse: run from the last time step to the first.

  Returns:
    ys: outputs [batch, time, out] (or [time, batch, out]) in float32, zero on padding;
    h_last: [batch, out]; c_last: [batch, hidden] or None.
  """
  if time_axis not in (0, 1):
    raise ValueError(f"time_axis must be 0 or 1, got {time_axis}")
  s = _Static(equations, time_axis, reverse)
  return _recurrence(s, x, w_ih, w_hh, b_ih, b_hh, w_hr, h0, c0, valid)
