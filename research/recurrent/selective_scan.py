"""Mamba's selective scan (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces", Algorithm 2, the S6 recurrence), in parallel over time or step by step.

Fused as the reference CUDA kernel is, with a hand-written backward pass; the parallel form
runs chunks of steps side by side joined by `jax.lax.associative_scan`. `selective_scan`
gives the equations, the two forms and the gradients.
"""

import functools
import math
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from research.errors import check_positive

Array = jax.Array


class Inputs(NamedTuple):
  """Each step's inputs: [B, T, ·]; in the stepwise loop [T, B, 1, ·] (`_blocks`); in the
  parallel loops [steps, ·, R] (`_rows`), with B_t and C_t as [steps, N, R]."""
  delta: Array    # Δ [..., D]
  u: Array        # [..., D]
  b: Array        # B_t [..., N]
  c: Array        # C_t [..., N]


def decay(a: Array, delta_t: Array) -> Array:
  """exp(Δ_t ⊗ A) [..., D, N] for Δ_t [..., D]."""
  return jnp.exp(delta_t[..., None] * a)


def _added(delta_t: Array, u_t: Array, b_t: Array) -> Array:
  """(Δ_t ⊙ u_t) ⊗ B_t [..., D, N]."""
  return (delta_t * u_t)[..., None] * b_t[..., None, :]


def s6_step(h: Array, a: Array, delta_t: Array, u_t: Array, b_t: Array) -> Array:
  """One step: h [..., D, N] -> exp(Δ_t ⊗ A) ⊙ h + (Δ_t ⊙ u_t) ⊗ B_t."""
  return decay(a, delta_t) * h + _added(delta_t, u_t, b_t)


def readout(h: Array, c_t: Array) -> Array:
  """y_t = h_t C_t [..., D], as a product and a sum over n that XLA fuses with the step (an
  einsum is a matrix-vector call of its own each step: 6% of the layer's stepwise forward +
  backward at T = 4 096 on a CPU)."""
  return jnp.sum(h * c_t[..., None, :], -1)


def _at(x: Array, t) -> Array:
  """Step t: x [steps, ...] -> [...]."""
  return lax.dynamic_index_in_dim(x, t, 0, keepdims=False)


def _put(x: Array, value: Array, t) -> Array:
  return lax.dynamic_update_index_in_dim(x, value, t, 0)


# The stepwise form: one loop over T steps, the state [B, 1, D, N].

def _sweep(a: Array, x: Inputs, h: Array, keep: bool):
  """The steps forwards from h [B, 1, D, N]: (the last state; y [T, B, 1, D]; the state
  before each step [T, B, 1, D, N] when `keep`)."""
  def body(t, carry):
    h, y, kept = carry
    delta, u, b, c = (_at(v, t) for v in x)
    if keep:
      kept = _put(kept, h, t)
    h = s6_step(h, a, delta, u, b)
    return h, _put(y, readout(h, c), t), kept

  kept = jnp.zeros(x.delta.shape + a.shape[-1:], h.dtype) if keep else None
  return lax.fori_loop(0, x.delta.shape[0], body, (h, jnp.zeros_like(x.delta), kept))


def _sweep_back(a: Array, x: Inputs, d_y: Array, m: Array, kept: Array):
  """The steps backwards from m [B, 1, D, N], the cotangent of the last state, given the
  state before each step: (a_0 ⊙ g_0; the gradients Inputs(∂Δ, ∂u, ∂B, ∂C); ∂A)."""
  num_steps = x.delta.shape[0]

  def body(k, carry):
    m, grads, d_a = carry
    t = num_steps - 1 - k
    delta, u, b, c = (_at(v, t) for v in x)
    d_y_t = _at(d_y, t)
    a_t = decay(a, delta)
    g = m + d_y_t[..., None] * c[..., None, :]
    h_before = _at(kept, t)
    h = a_t * h_before + _added(delta, u, b)
    s = g * h_before * a_t
    g_b = jnp.einsum("...dn,...n->...d", g, b)
    step = Inputs(delta=g_b * u + jnp.einsum("...dn,dn->...d", s, a), u=g_b * delta,
                  b=jnp.einsum("...dn,...d->...n", g, delta * u),
                  c=jnp.einsum("...dn,...d->...n", h, d_y_t))
    grads = Inputs(*(_put(v, w, t) for v, w in zip(grads, step)))
    return a_t * g, grads, d_a + s * delta[..., None]

  grads = Inputs(*map(jnp.zeros_like, x))
  return lax.fori_loop(0, num_steps, body, (m, grads, jnp.zeros_like(m)))


def _blocks(x: Array) -> Array:
  """[B, T, ·] -> [T, B, 1, ·]: time first, a step one contiguous slice."""
  return x.transpose(1, 0, 2)[:, :, None]


def _unblock(x: Array) -> Array:
  """[T, B, 1, ·] -> [B, T, ·]."""
  return x[:, :, 0].transpose(1, 0, 2)


def _stepwise(x: Inputs, a: Array, h0: Array, keep: bool):
  """(y, h_last, the states before each step or None)."""
  h, y, kept = _sweep(a, Inputs(*map(_blocks, x)), h0[:, None], keep)
  return _unblock(y), h[:, 0], kept


def _stepwise_back(x: Inputs, a: Array, kept: Array, d_y: Array, d_last: Array):
  """(Inputs(∂Δ, ∂u, ∂B, ∂C), ∂A, ∂h0) from the states kept before each step."""
  m, grads, d_a = _sweep_back(a, Inputs(*map(_blocks, x)), _blocks(d_y), d_last[:, None], kept)
  return Inputs(*map(_unblock, grads)), d_a.sum((0, 1)), m[:, 0]


# The parallel form: chunks side by side, the state [N, D, R] (R = B·chunks rows), A as
# [N, D, 1], a step's Δ, u, ∂y [D, R] and B_t, C_t [N, R].

def _contract(x: Array, w: Array, axis: int) -> Array:
  """Σ_i x_i ⊙ w_i over `axis` (w broadcasts against x, full along `axis`), as sums of
  products of slices: one loop fusion that reads x and w once, no reduction."""
  def term(i):
    return lax.index_in_dim(x, i, axis, keepdims=False) * lax.index_in_dim(w, i, axis,
                                                                          keepdims=False)
  return functools.reduce(operator.add, map(term, range(x.shape[axis])))


def _step(h: Array, a: Array, delta: Array, u: Array, b: Array) -> Array:
  """s6_step in the parallel layout: h [N, D, R]."""
  return jnp.exp(delta * a) * h + (delta * u) * b[:, None]


class Chunks(NamedTuple):
  """How the parallel form cuts time: chunks of `size` steps, each `stretches` stretches of
  `stretch` steps (the last ones padded with Δ = 0)."""
  size: int
  stretch: int
  stretches: int

  @classmethod
  def of(cls, size: int) -> "Chunks":
    """Stretches of ⌈√size⌉ steps."""
    stretch = math.isqrt(size - 1) + 1
    return cls(size, stretch, -(-size // stretch))

  @property
  def steps(self) -> int:
    """Steps per chunk with the padding."""
    return self.stretch * self.stretches


def _rows(x: Array, chunks: Chunks) -> Array:
  """[B, T, ·] -> [chunks.steps, ·, R]: step t of every chunk side by side, R = B·(T / size)
  rows (batch-major), zeros after step T and after each chunk's `size` steps."""
  batch, num_steps, width = x.shape
  count = -(-num_steps // chunks.size)
  x = jnp.pad(x, ((0, 0), (0, count * chunks.size - num_steps), (0, 0)))
  x = x.reshape((batch, count, chunks.size, width))
  x = jnp.pad(x, ((0, 0), (0, 0), (0, chunks.steps - chunks.size), (0, 0)))
  return x.transpose(2, 3, 0, 1).reshape((chunks.steps, width, batch * count))


def _unrows(x: Array, chunks: Chunks, batch: int, num_steps: int) -> Array:
  """[chunks.steps, ·, R] -> [B, T, ·]."""
  width = x.shape[1]
  x = x[:chunks.size].reshape((chunks.size, width, batch, -1))
  return x.transpose(2, 3, 0, 1).reshape((batch, -1, width))[:, :num_steps]


def _by_batch(x: Array, batch: int) -> Array:
  """[..., R] -> [..., B, chunks]."""
  return x.reshape(x.shape[:-1] + (batch, -1))


def _chunk_ends(a: Array, x: Inputs) -> tuple[Array, Array]:
  """Each chunk from a zero state: (its end state [N, D, R], Σ_t Δ_t [D, R])."""
  def body(t, carry):
    h, total = carry
    delta = _at(x.delta, t)
    return _step(h, a, delta, _at(x.u, t), _at(x.b, t)), total + delta

  zero = jnp.zeros(x.b.shape[1:2] + x.delta.shape[1:], x.delta.dtype)
  return lax.fori_loop(0, x.delta.shape[0], body, (zero, zero[0]))


def _chunk_ends_back(a: Array, x: Inputs, d_y: Array) -> tuple[Array, Array]:
  """Each chunk backwards from a zero cotangent: (what leaves it, a_first ⊙ g_first
  [N, D, R] = Σ_t exp(A ⊗ Σ_{s≤t} Δ_s) ⊙ (dy_t ⊗ C_t); Σ_t Δ_t [D, R])."""
  num_steps = x.delta.shape[0]

  def body(k, carry):
    m, total = carry
    t = num_steps - 1 - k
    delta = _at(x.delta, t)
    return jnp.exp(delta * a) * (m + _at(d_y, t) * _at(x.c, t)[:, None]), total + delta

  zero = jnp.zeros(x.c.shape[1:2] + x.delta.shape[1:], x.delta.dtype)
  return lax.fori_loop(0, num_steps, body, (zero, zero[0]))


def _entering(a: Array, total: Array, ends: Array, edge: Array, reverse: bool) -> Array:
  """What enters each chunk [N, D, B, chunks] from the chunk before it (after it when
  `reverse`), given Σ_t Δ_t [D, B, chunks] and each chunk's end from zero [N, D, B, chunks],
  and `edge` [N, D, B], what enters the first (the last) chunk: an associative scan of
  (P_c, E_c) over the chunks."""
  products = jnp.exp(a[..., None] * total)                     # P_c [N, D, B, chunks]
  first = -1 if reverse else 0
  ends = ends.at[..., first].add(products[..., first] * edge)

  def combine(earlier, later):
    return later[0] * earlier[0], later[0] * earlier[1] + later[1]

  after = lax.associative_scan(combine, (products, ends), reverse=reverse, axis=3)[1]
  if reverse:
    return jnp.concatenate([after[..., 1:], edge[..., None]], 3)
  return jnp.concatenate([edge[..., None], after[..., :-1]], 3)


def _chunk_sweep(a: Array, x: Inputs, h: Array, chunks: Chunks):
  """Every chunk forwards from its entering state h [N, D, R]: (the end states; y
  [steps, D, R]; the state before each stretch [stretches, N, D, R])."""
  def stretch(j, carry):
    h, y, kept = carry

    def body(i, carry):
      h, y = carry
      t = j * chunks.stretch + i
      delta, u, b, c = (_at(v, t) for v in x)
      h = _step(h, a, delta, u, b)
      return h, _put(y, _contract(h, c[:, None], 0), t)

    return lax.fori_loop(0, chunks.stretch, body, (h, y)) + (_put(kept, h, j),)

  kept = jnp.zeros((chunks.stretches,) + h.shape, h.dtype)
  return lax.fori_loop(0, chunks.stretches, stretch, (h, jnp.zeros_like(x.delta), kept))


def _chunk_sweep_back(a: Array, x: Inputs, d_y: Array, m: Array, kept: Array,
                      chunks: Chunks):
  """Every chunk backwards from m [N, D, R], what enters it from the chunk after it, given
  the state before each stretch: (what leaves it, a_first ⊙ g_first; the gradients
  Inputs(∂Δ, ∂u, ∂B, ∂C) [steps, ·, R]; ∂A [N, D, R] summed over the chunk's steps)."""
  def states(j, before, d_c):
    """The states before each step of stretch j [stretch, N, D, R]; ∂C of its steps."""
    def body(i, carry):
      h, before, d_c = carry
      t = j * chunks.stretch + i
      before = _put(before, h, i)
      h = _step(h, a, _at(x.delta, t), _at(x.u, t), _at(x.b, t))
      return h, before, _put(d_c, _contract(h, _at(d_y, t)[None], 1), t)

    return lax.fori_loop(0, chunks.stretch, body, (_at(kept, j), before, d_c))[1:]

  def stretch(k, carry):
    m, grads, d_a, before = carry
    j = chunks.stretches - 1 - k
    before, d_c = states(j, before, grads.c)

    def body(k, carry):
      m, grads, d_a = carry
      i = chunks.stretch - 1 - k
      t = j * chunks.stretch + i
      delta, u, b, c = (_at(v, t) for v in x)
      g = m + _at(d_y, t) * c[:, None]
      m = jnp.exp(delta * a) * g                               # a_t ⊙ g_t
      s = m * _at(before, i)                                   # s_t = g_t ⊙ h_{t−1} ⊙ a_t
      g_b = _contract(g, b[:, None], 0)
      grads = Inputs(_put(grads.delta, g_b * u + _contract(s, a, 0), t),
                     _put(grads.u, g_b * delta, t),
                     _put(grads.b, _contract(g, (delta * u)[None], 1), t), grads.c)
      return m, grads, d_a + s * delta

    m, grads, d_a = lax.fori_loop(0, chunks.stretch, body, (m, grads._replace(c=d_c), d_a))
    return m, grads, d_a, before

  grads = Inputs(*map(jnp.zeros_like, x))
  before = jnp.zeros((chunks.stretch,) + m.shape, m.dtype)
  return lax.fori_loop(0, chunks.stretches, stretch, (m, grads, jnp.zeros_like(m), before))[:3]


def _parallel(x: Inputs, a: Array, h0: Array, chunks: Chunks):
  """(y, h_last, the state before each stretch [stretches, N, D, R])."""
  batch, num_steps = x.delta.shape[:2]
  x = Inputs(*(_rows(v, chunks) for v in x))
  a = a.T[..., None]
  ends, total = _chunk_ends(a, x)
  entering = _entering(a, _by_batch(total, batch), _by_batch(ends, batch),
                       h0.transpose(2, 1, 0), reverse=False)
  entering = entering.reshape(ends.shape)
  h, y, kept = _chunk_sweep(a, x, entering, chunks)
  h_last = _by_batch(h, batch)[..., -1].transpose(2, 1, 0)
  return _unrows(y, chunks, batch, num_steps), h_last, kept


def _parallel_back(x: Inputs, a: Array, kept: Array, d_y: Array, d_last: Array,
                   chunks: Chunks):
  """(Inputs(∂Δ, ∂u, ∂B, ∂C), ∂A, ∂h0) from the states kept before each stretch."""
  batch, num_steps = x.delta.shape[:2]
  x = Inputs(*(_rows(v, chunks) for v in x))
  d_y = _rows(d_y, chunks)
  a = a.T[..., None]
  leaving, total = _chunk_ends_back(a, x, d_y)
  entering = _entering(a, _by_batch(total, batch), _by_batch(leaving, batch),
                       d_last.transpose(2, 1, 0), reverse=True)
  m, grads, d_a = _chunk_sweep_back(a, x, d_y, entering.reshape(leaving.shape), kept, chunks)
  d_h0 = _by_batch(m, batch)[..., 0].transpose(2, 1, 0)
  return Inputs(*(_unrows(v, chunks, batch, num_steps) for v in grads)), d_a.sum(-1).T, d_h0


def _chunks(num_steps: int, parallel: bool, chunk: int) -> Chunks | None:
  """The parallel form's chunks; None for one chunk (the stepwise form)."""
  return Chunks.of(chunk) if parallel and chunk < num_steps else None


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _scan(x: Inputs, a: Array, h0: Array, parallel: bool, chunk: int):
  chunks = _chunks(x.delta.shape[1], parallel, chunk)
  if chunks is None:
    return _stepwise(x, a, h0, False)[:2]
  return _parallel(x, a, h0, chunks)[:2]


def _scan_fwd(x, a, h0, parallel, chunk):
  chunks = _chunks(x.delta.shape[1], parallel, chunk)
  if chunks is None:
    y, h_last, kept = _stepwise(x, a, h0, True)
  else:
    y, h_last, kept = _parallel(x, a, h0, chunks)
  return (y, h_last), (x, a, kept)


def _scan_bwd(parallel, chunk, residuals, cotangents):
  x, a, kept = residuals
  chunks = _chunks(x.delta.shape[1], parallel, chunk)
  if chunks is None:
    return _stepwise_back(x, a, kept, *cotangents)
  return _parallel_back(x, a, kept, *cotangents, chunks)


_scan.defvjp(_scan_fwd, _scan_bwd)


def selective_scan(delta: Array, u: Array, b: Array, c: Array, a: Array, h0: Array, *,
                   parallel: bool = True, chunk: int = 128) -> tuple[Array, Array]:
  """y [B, T, D] and h_last [B, D, N], the state after the last step:

    h_t = exp(Δ_t ⊗ A) ⊙ h_{t−1} + (Δ_t ⊙ u_t) ⊗ B_t        h [B, D, N]
    y_t = h_t C_t                                          y [B, T, D]

    delta (Δ), u: [B, T, D]    b (B_t), c (C_t): [B, T, N]    a (A): [D, N], A < 0
    h0: [B, D, N]              all float32

  Fused, as the reference CUDA kernel: a step's decay exp(Δ_t ⊗ A), its input and its state
  [D, N] are made in the loop that uses them, so only the [D]- and [N]-sized inputs and
  outputs of each step go through memory (and, for the backward pass, the states of one
  stretch of steps at a time).

  Padding is the caller's: a step with Δ_t = 0 leaves the state as it was (a decay of 1,
  nothing added), so with padding at the end of each sequence h_last is the state after
  the sequence's own last step.

  The two forms agree to rounding:
    stepwise: one loop over the T steps (`s6_step`, which is also the layer's single step),
    keeping the state before each step for the backward pass.
    parallel: time cut into chunks of `chunk` steps, R = B·chunks rows run side by side one
    step at a time: 1. each chunk from a zero start, keeping its end state E_c and
    Σ_{t∈c} Δ_t; 2. the state entering each chunk, from `jax.lax.associative_scan` over the
    chunks with (P, E) ∘ (P', E') = (P' P, P' E + E'), P_c = exp(A ⊗ Σ_{t∈c} Δ_t) the
    chunk's decay (the exp of a sum ≤ 0: it can underflow, never overflow); 3. each chunk
    again from its entering state, with the outputs, keeping the state every
    Q = ⌈√chunk⌉ steps ([T / Q, D, N] for the backward pass). The depth is
    2·chunk + log(T / chunk) instead of T; a chunk ≥ T is the stepwise form. Its loops hold
    the state as [N, D, R] (rows last: a step of every chunk is one stretch of contiguous
    numbers, and the sums over n and d are additions of whole slices, which XLA fuses into
    one loop). Why this layout, and its speed on a CPU: docs/recurrent.md.

  The backward pass is written out (custom VJP) and runs the same forms backwards in time:
  the state's cotangent g_t = exp(Δ_{t+1} ⊗ A) ⊙ g_{t+1} + dy_t ⊗ C_t (plus the cotangent
  of h_last at the last step), and per step, with a_t = exp(Δ_t ⊗ A) and
  s_t = g_t ⊙ h_{t−1} ⊙ a_t:
    ∂C_t = h_tᵀ dy_t,  ∂B_t = g_tᵀ (Δ_t ⊙ u_t),  ∂u_t = Δ_t ⊙ (g_t B_t),
    ∂Δ_t = u_t ⊙ (g_t B_t) + Σ_n s_t ⊙ A,  ∂A = Σ_t s_t ⊙ Δ_t,  ∂h0 = a_0 ⊙ g_0.
  The parallel form's: 1. each chunk backwards from zero (what leaves it,
  a_first ⊙ g_first); 2. what enters each chunk from the one after it (the same associative
  scan, reversed); 3. each chunk backwards again, a stretch of Q steps at a time: the
  stretch's states again from the state kept before it (with ∂C), then its steps backwards
  with the gradients.
  """
  check_positive("chunk", chunk)
  return _scan(Inputs(delta, u, b, c), a, h0, parallel, chunk)
