"""The linear recurrence h_t = a ⊙ h_{t−1} + b_t over time, in parallel or step by step.

Shared by `LRU`, `S5` and `LinearAttentionCell`, whose coefficient a does not change with
time (LRU's λ, S5's Λ̄, a per-head decay). The parallel form runs chunks of steps side by
side joined by `jax.lax.associative_scan`, with a hand-written backward pass of the same
kind; `linear_scan` gives both forms and their gradients.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from research.errors import check_positive

Array = jax.Array
Value = tuple[Array, ...]        # (x,) for a real array, (re, im) for a complex one
Values = Array | tuple[Array, Array]   # the public form: a real array or (re, im)


def _mul(a: Value | None, h: Value) -> Value:
  """a ⊙ h, as complex numbers when the values are pairs; a = None is 1."""
  if a is None:
    return h
  if len(a) == 1:
    return (a[0] * h[0],)
  (ar, ai), (hr, hi) = a, h
  return ar * hr - ai * hi, ar * hi + ai * hr


def _add(x: Value, y: Value) -> Value:
  return tuple(p + q for p, q in zip(x, y))


def _conj(v: Value | None) -> Value | None:
  return v if v is None or len(v) == 1 else (v[0], -v[1])


def _map(fn, v: Value) -> Value:
  return tuple(fn(x) for x in v)


def _loop(a: Value | None, b: Value, reverse: bool, axis: int, h: Value | None = None,
          store: bool = True, against: tuple[Value, Value] | None = None):
  """One step at a time along `axis` of b, vectorised over the other axes, from the state
  h (zero when None; shaped like b without `axis`). Returns every state, or only the last
  when not `store`.

  The states overwrite b's buffer as they are computed (step t reads b_t, then writes h_t
  in its place): no zero-filled buffer to allocate, and XLA works in place where b is not
  needed afterwards.

  `against` = (r, r_after), r shaped like b and r_after like the state: also returns
  Σ_t h_t ⊙ conj(r_t'), t' the step after t in this loop's order (r_after after the last),
  summed over `axis` only: the backward pass's ∂L/∂a, accumulated while the states are at
  hand instead of in passes over them afterwards."""
  num_steps = b[0].shape[axis]
  at = lambda x, t: lax.dynamic_index_in_dim(x, t, axis, keepdims=False)
  if h is None:
    h = _map(lambda x: jnp.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype), b)
  total = None if against is None else _map(jnp.zeros_like, h)

  def body(k, carry):
    h, buffer, total = carry
    t = num_steps - 1 - k if reverse else k
    h = _add(_mul(a, h), _map(lambda x: at(x, t), buffer))
    if store:
      buffer = tuple(lax.dynamic_update_index_in_dim(s, x, t, axis) for s, x in zip(buffer, h))
    if against is not None:
      r, r_after = against
      index = jnp.clip(t - 1 if reverse else t + 1, 0, num_steps - 1)
      r_next = tuple(jnp.where(k == num_steps - 1, y, at(x, index)) for x, y in zip(r, r_after))
      total = _add(total, _mul(h, _conj(r_next)))
    return h, buffer, total

  h, states, total = lax.fori_loop(0, num_steps, body, (h, b, total))
  out = states if store else h
  return out if against is None else (out, total)


def _blocks(x: Array, size: int) -> Array:
  """[B, T, *state] -> [B, chunks, size, *state], zeros after step T."""
  chunks = -(-x.shape[1] // size)
  pad = ((0, 0), (0, chunks * size - x.shape[1])) + ((0, 0),) * (x.ndim - 2)
  return jnp.pad(x, pad).reshape((x.shape[0], chunks, size) + x.shape[2:])


def _chunked(a: Value | None, b: Value, reverse: bool, chunk: int, against: Value | None = None):
  """The parallel form (see `linear_scan`) over axis 1 of b [B, T, *state]; with `against`
  (r like b), also Σ_t h_t ⊙ conj(r_t') as in `_loop` (r zero after the last step),
  summed over time to [B, *state]."""
  batch, num_steps = b[0].shape[:2]
  size = min(chunk, num_steps)
  blocks = _map(lambda x: _blocks(x, size), b)
  chunks = blocks[0].shape[1]
  # 1. each chunk's end state from a zero start (padding at the end adds nothing: a reverse
  # scan starts there, a forward one ends there and its states are cut off)
  ends = _loop(a, blocks, reverse, axis=2, store=False)                  # [B, chunks, *state]
  # 2. the state entering each chunk: the previous chunk's end (the next one's if reverse)
  if a is None:
    carried = _map(lambda x: lax.associative_scan(jnp.add, x, reverse=reverse, axis=1), ends)
  else:
    one = (jnp.ones_like(a[0]),) + tuple(jnp.zeros_like(x) for x in a[1:])
    power = lax.fori_loop(0, size, lambda _, p: _mul(a, p), one)               # a^size
    a_chunk = _map(lambda x: jnp.broadcast_to(x, (1, chunks) + x.shape), power)

    def combine(earlier, later):
      return _mul(later[0], earlier[0]), _add(_mul(later[0], earlier[1]), later[1])

    carried = lax.associative_scan(combine, (a_chunk, ends), reverse=reverse, axis=1)[1]
  # chunk c's value from chunk c - 1 (from c + 1 when `later`), zero at the edge
  zero = lambda x: jnp.zeros_like(x[:, :1])
  shift = lambda x, later: (jnp.concatenate([x[:, 1:], zero(x)], 1) if later
                            else jnp.concatenate([zero(x), x[:, :-1]], 1))
  into = _map(lambda x: shift(x, reverse), carried)   # what enters each chunk
  # 3. every state, each chunk starting from what enters it
  if against is None:
    h = _loop(a, blocks, reverse, axis=2, h=into)
  else:   # r after each chunk in the loop's order: the next chunk's first step, zero at the end
    r = _map(lambda x: _blocks(x, size), against)
    after = _map(lambda x: shift(x[:, :, -1] if reverse else x[:, :, 0], not reverse), r)
    h, total = _loop(a, blocks, reverse, axis=2, h=into, against=(r, after))
  h = _map(lambda x: x.reshape((batch, chunks * size) + x.shape[3:])[:, :num_steps], h)
  return h if against is None else (h, _map(lambda x: x.sum(1), total))


def _run(a: Value | None, b: Value, reverse: bool, parallel: bool, chunk: int,
         against: Value | None = None):
  """All states of h_t = a ⊙ h_{t−1} + b_t; with `against`, also Σ_t h_t ⊙ conj(r_t')
  [B, *state] (see `_loop`)."""
  if parallel:
    return _chunked(a, b, reverse, chunk, against)
  after = None if against is None else _map(lambda x: jnp.zeros_like(x[:, 0]), against)
  return _loop(a, b, reverse, axis=1, against=None if against is None else (against, after))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _scan(a: Value | None, b: Value, reverse: bool, parallel: bool, chunk: int) -> Value:
  return _run(a, b, reverse, parallel, chunk)


def _scan_fwd(a, b, reverse, parallel, chunk):
  h = _run(a, b, reverse, parallel, chunk)
  return h, (a, h)


def _scan_bwd(reverse, parallel, chunk, residuals, d_h):
  a, h = residuals
  if a is None:
    return None, _run(None, d_h, not reverse, parallel, chunk)
  # g runs the other way; ∂L/∂a = Σ_t g_t ⊙ conj(h_{t−1}) (h_{t+1} when reverse): h at the
  # step after t in g's order, zero past the end (the step without a predecessor adds nothing)
  g, d_a = _run(_conj(a), d_h, not reverse, parallel, chunk, against=h)
  leading = d_a[0].ndim - a[0].ndim
  summed = tuple(range(leading)) + tuple(
      leading + i for i, n in enumerate(a[0].shape) if n == 1 and d_a[0].shape[leading + i] != 1)
  return _map(lambda x: x.sum(summed).reshape(a[0].shape), d_a), g


_scan.defvjp(_scan_fwd, _scan_bwd)


def linear_scan(a: Values | None, b: Values, h0: Values | None = None, *,
                lengths: Array | None = None, reverse: bool = False, parallel: bool = True,
                chunk: int = 64) -> tuple[Values, Values]:
  """All states h_t = a ⊙ h_{t−1} + b_t and the last one.

    b: [B, T, *state]      what each step adds
    a: [*s] or None        s broadcasts to state (λ [N]; a decay [heads, 1, 1]); None: a = 1
    h0: [B, *state]        the state before the first step (zero when None)

  each a real array or, for complex values, a pair (re, im) of real arrays (a and b of the
  same kind): XLA's CPU backend multiplies complex numbers element by element far more
  slowly than reals, and splitting or joining complex arrays costs passes over memory.

  `parallel=True` splits time into chunks of `chunk` steps and runs all chunks side by side
  (one step of every chunk at a time, `chunk` steps in all): first from a zero start,
  keeping only each chunk's end state e; then `jax.lax.associative_scan` over the chunks,
  with the operator (A, e) ∘ (A', e') = (A' A, A' e + e') on (a^chunk, e), gives the state
  entering each chunk; then the chunks run again from those states, keeping every state.
  The depth is 2·chunk + log(T / chunk) instead of T, and every operation is a vector over
  all chunks; `chunk=1` is `associative_scan` over every step. `parallel=False` runs one
  step at a time. Both agree to rounding.

  The backward pass is written out (custom VJP): the states' cotangent g (for a pair, the
  gradients of its real and imaginary parts, g = ∂L/∂h_re + i ∂L/∂h_im) obeys the same
  recurrence in the other direction, g_t = ā ⊙ g_{t+1} + ∂L/∂h_t (ā the complex conjugate),
  then ∂L/∂b_t = g_t and ∂L/∂a = Σ_t g_t ⊙ conj(h_{t−1}): one more scan of the same kind,
  parallel or stepwise as the forward was, which sums ∂L/∂a as it goes.

  `lengths` [B] ints: steps t ≥ lengths[b] are padding. Their b_t is ignored, `h_last` is
  the state after each sequence's own last step (h0 or zero for length 0) and a reverse
  scan starts at the sequence's last step. The states returned for padded steps are not
  meaningful (callers zero their outputs there).

  Returns, in b's form (an array, or a pair (re, im)):
    h: [B, T, *state], the state after each step;
    h_last: [B, *state], the state after each sequence's last step in scan order (its
    first time step when `reverse`).
  """
  pair = isinstance(b, tuple)
  for name, x in (("a", a), ("b", b), ("h0", h0)):
    if x is None:
      continue
    if isinstance(x, tuple) != pair or (pair and len(x) != 2):
      raise ValueError(f"a, b and h0 must all be real arrays or all (re, im) pairs of real "
                       f"arrays; {name} is {'a tuple' if isinstance(x, tuple) else 'an array'}")
  value = lambda x: None if x is None else (tuple(x) if pair else (x,))
  a, b, h0 = value(a), value(b), value(h0)
  check_positive("chunk", chunk)
  batch, num_steps = b[0].shape[:2]
  expand = lambda x: x.reshape(x.shape + (1,) * (b[0].ndim - 2))   # [B] or [B, T] against b
  t = jnp.arange(num_steps)
  if lengths is not None:
    b = _map(lambda x: jnp.where(expand(t[None] < lengths[:, None]), x, 0.0), b)
  if h0 is not None:   # enters at the first step in scan order, as a ⊙ h0
    start = (lengths - 1 if lengths is not None else jnp.full((batch,), num_steps - 1)) \
        if reverse else jnp.zeros((batch,), jnp.int32)
    at_start = expand(t[None] == start[:, None])
    b = _add(b, _map(lambda x: jnp.where(at_start, x[:, None], 0.0), _mul(a, h0)))
  h = _scan(a, b, reverse, parallel, chunk)
  if reverse or lengths is None:
    h_last = _map(lambda x: x[:, 0] if reverse else x[:, -1], h)
  else:
    last = expand(jnp.maximum(lengths - 1, 0)[:, None])
    h_last = _map(lambda x: jnp.take_along_axis(x, last, axis=1)[:, 0], h)
  if lengths is not None:   # length 0: nothing ran
    empty = expand(lengths == 0)
    h_last = tuple(jnp.where(empty, 0.0 if h0 is None else h0[i], x) for i, x in enumerate(h_last))
  return (h, h_last) if pair else (h[0], h_last[0])
