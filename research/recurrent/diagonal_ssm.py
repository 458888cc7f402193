"""Diagonal complex linear state space layers: the shared body of `LRU` and `S5`.

A layer of width H with N complex states per direction, h_t = λ ⊙ h_{t−1} + B̄ x_t read out
as y_t = s · Re(C h_t) + D ⊙ x_t, run in parallel over time or stepwise (`linear_scan`);
the subclasses differ only in how they parametrise and initialise λ, B̄ and C.
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.recurrent.layers import valid_mask
from research.recurrent.linear_scan import linear_scan
from research.recurrent.selective import check_scan_options

Array = jax.Array


def _pair(z: Array) -> tuple[Array, Array]:
  return jnp.real(z), jnp.imag(z)


def _skip(x: Array, d: Array) -> Array:
  """D ⊙ x [..., H] in float32, written as an einsum: its gradient for D is then a
  contraction over batch and time, which XLA's CPU backend runs far faster than the
  reduction that `d * x`'s gradient becomes for a batch of one ([1, T, H] -> [1, H]): a
  16K-step LRU's forward + backward took 14.1 ms with `d * x`, 10.4 ms with this, on 2 cores."""
  return jnp.einsum("...h,h->...h", x.astype(jnp.float32), d)


class System(NamedTuple):
  """The discrete system one call runs (see `DiagonalSSM`)."""
  lam: Array      # [N] complex64, λ
  b: Array        # [N, H] complex64, B̄
  c: Array        # [directions, H, N] complex64, C (C_fwd, C_bwd)
  d: Array        # [H] float32, D
  scale: float    # s: 2.0 with conjugate symmetry, else 1.0


class DiagonalSSM(nn.Module):
  """Shared body of `LRU` and `S5`; subclasses build the system from their parameters.

  A layer of width H (input and output) with N complex states per direction maps
  x [B, T, H] to y [B, T, H]:

    h_t = λ ⊙ h_{t−1} + B̄ x_t              λ [N] complex, |λ| < 1; B̄ [N, H] complex
    y_t = s · Re(C h_t) + D ⊙ x_t           C [H, N] complex, D [H] real, s = 1 or 2

  (s = 2 when only one of each pair of conjugate states is kept, S5's conjugate symmetry).
  Bidirectional: a second state h'_t runs from the last step to the first with the same λ
  and B̄, and y_t = s · Re(C_fwd h_t + C_bwd h'_t) + D ⊙ x_t.

  `mode` picks how the recurrence runs over a sequence: "parallel" (chunks of `chunk_size`
  steps side by side, joined by `associative_scan`: see `linear_scan.py`) or "stepwise" (one
  step at a time); the two agree to rounding. `step` is one time step with a carried state,
  for decoding and streams of any length.

  `seq_lengths` [B] (ints): steps t ≥ seq_lengths[b] are padding; their outputs are zero,
  the state stays as it was (the final state is each sequence's own) and the reverse
  direction starts at each sequence's last valid step, as the `RNN` / `LSTM` / `GRU` layers.

  The matrix products with B̄ and C run in `dtype` (None: float32) with float32
  accumulation; the state is complex64 and the recurrence runs in it.
  """
  mode: str = "parallel"           # "parallel" (chunks joined by associative_scan) or "stepwise"
  chunk_size: int = 64             # parallel form: steps per chunk (see `linear_scan`)
  bidirectional: bool = False      # add a reverse-time state (see the class docstring)
  dtype: Any = None                # computation dtype of the matrix products (None: float32)
  param_dtype: Any = jnp.float32   # parameter dtype

  @property
  def num_states(self) -> int:
    """N, the complex states per direction."""
    raise NotImplementedError

  def system(self, features: int) -> System:
    """Creates (at init) or fetches the parameters; returns the discrete system."""
    raise NotImplementedError

  def check_config(self) -> None:
    """ValueError for a field the layer refuses: `check_options`, then the state size's
    own checks (subclasses'); all run before anything is traced."""
    self.check_options()

  def check_options(self) -> None:
    """ValueError for an option the layer refuses whatever its state size (subclasses add
    theirs): every float field (a ring's radius, a phase, a time step) finite, the mode,
    the chunk size (`check_scan_options`)."""
    check_scan_options(self)

  @property
  def num_directions(self) -> int:
    return 2 if self.bidirectional else 1

  def parameter_count(self, features: int) -> int:
    """Per kept state P: λ's (or Λ's and the step's) 3 numbers, B̃ [P, F] complex and a
    C̃ [F, P] complex per direction; D [F]."""
    return self.num_states * (3 + 2 * features + 2 * features * self.num_directions) + features

  @nn.nowrap
  def zero_state(self, batch_size: int) -> Array:
    """The zero state: [batch, N] complex64 ([2, batch, N] when bidirectional)."""
    shape = (batch_size, self.num_states)
    return jnp.zeros((2, *shape) if self.bidirectional else shape, jnp.complex64)

  def __call__(self, x: Array, *, initial_state: Array | None = None,
               seq_lengths: Array | None = None) -> tuple[Array, Array]:
    """The whole sequence.

    Args:
      x: [batch, time, H].
      initial_state: [batch, N] complex (bidirectional: [2, batch, N], the reverse
        direction's state before the last valid step), or None for zeros.
      seq_lengths: [batch] ints, or None (every sequence is T long).

    Returns:
      y [batch, time, H] in `dtype` (None: float32), zero past each sequence's length;
      the final state [batch, N] complex64 (bidirectional: [2, batch, N], the reverse
      direction's state after t = 0).
    """
    self.check_config()
    if x.ndim != 3:
      raise ValueError(f"x must be [batch, time, features], got shape {x.shape}")
    batch, num_steps, features = x.shape
    h0 = self._initial_state(initial_state, batch)
    valid = valid_mask(seq_lengths, batch, num_steps)
    s = self.system(features)
    bx = self._input_product(x, s.b)
    y = _skip(x, s.d)
    last = []
    for k in range(self.num_directions):   # complex values as (re, im) pairs: see linear_scan
      h, h_last = linear_scan(_pair(s.lam), bx, None if h0 is None else _pair(h0[k]),
                              lengths=seq_lengths, reverse=k == 1,
                              parallel=self.mode == "parallel", chunk=self.chunk_size)
      y = y + s.scale * self._output_product(h, s.c[k])
      last.append(jax.lax.complex(*h_last))
    if valid is not None:
      y = jnp.where(valid[..., None], y, 0.0)
    state = jnp.stack(last) if self.bidirectional else last[0]
    return y.astype(self.dtype or jnp.float32), state

  def step(self, state: Array, x: Array) -> tuple[Array, Array]:
    """One time step (unidirectional layers only): state [batch, N] complex, x [batch, H].

    Returns the new state [batch, N] complex64 and y [batch, H] in `dtype`.
    """
    self.check_config()
    if self.bidirectional:
      raise ValueError("step needs a unidirectional layer (bidirectional=False): the reverse "
                       "direction needs the whole sequence")
    s = self.system(x.shape[-1])
    h = s.lam * state.astype(jnp.complex64) + jax.lax.complex(*self._input_product(x, s.b))
    y = s.scale * self._output_product(_pair(h), s.c[0]) + _skip(x, s.d)
    return h, y.astype(self.dtype or jnp.float32)

  def _input_product(self, x: Array, b: Array) -> tuple[Array, Array]:
    """B̄ x [..., N] as (re, im) float32, two real products in `dtype`."""
    dtype = self.dtype or jnp.float32
    product = lambda w: jnp.einsum("...h,nh->...n", x.astype(dtype), w.astype(dtype),
                                   preferred_element_type=jnp.float32)
    return product(b.real), product(b.imag)

  def _output_product(self, h: tuple[Array, Array], c: Array) -> Array:
    """Re(C h) [..., H] float32 = C_re h_re + (−C_im) h_im for h = (h_re, h_im), in `dtype`
    (the small C_im negated, not the product: no negated copy of it or of its cotangent)."""
    dtype = self.dtype or jnp.float32
    product = lambda v, w: jnp.einsum("...n,hn->...h", v.astype(dtype), w.astype(dtype),
                                      preferred_element_type=jnp.float32)
    return product(h[0], c.real) + product(h[1], -c.imag)

  def _initial_state(self, initial_state: Array | None, batch: int) -> Array | None:
    """[directions, batch, N] complex64, or None for zeros."""
    if initial_state is None:
      return None
    expected = self.zero_state(batch).shape
    initial_state = jnp.asarray(initial_state)
    if initial_state.shape != expected:
      raise ValueError(f"initial_state must have shape {expected} "
                       f"({'[2, batch, N]' if self.bidirectional else '[batch, N]'}), "
                       f"got {initial_state.shape}")
    return initial_state.astype(jnp.complex64).reshape((self.num_directions, batch, self.num_states))
