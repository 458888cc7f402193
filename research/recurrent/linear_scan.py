"""The linear recurrence h_t = a_t ⊙ h_{t−1} + b_t over time, in parallel or step by step.

Shared by `LRU`, `S5` and `LinearAttentionCell`. With x [batch, time, ...] layouts:

  b: [B, T, *state]          what each step adds (real or complex)
  a: [B | 1, T | 1, *s]      what each step multiplies the state by; s broadcasts to state
                             (e.g. LRU's λ [1, 1, N], a per-head decay [1, 1, heads, 1, 1]);
                             None for a_t = 1 (a cumulative sum)
  h0: [B, *state] or None    the state before the first step (zero when None)

`parallel=True` runs `jax.lax.associative_scan` over the pairs (a_t, b_t) with the
associative operator (a, b) ∘ (a', b') = (a' a, a' b + b'): depth log T instead of T,
which is what makes these recurrences fast on long sequences. h0 enters as
b_0 ← b_0 + a_0 ⊙ h0. `parallel=False` runs the same recurrence one step at a time
(`lax.scan`); the two agree to rounding.

With `valid` [B, T] bool (False on padding past a sequence's end), a padded step keeps the
state unchanged (a_t = 1, b_t = 0), so the final state is each sequence's own, and a
reverse scan starts at each sequence's last valid step.
"""

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def _combine(earlier: tuple[Array, Array], later: tuple[Array, Array]) -> tuple[Array, Array]:
  """(a, b) ∘ (a', b') = (a' a, a' b + b'): applying step (a, b) and then (a', b')."""
  a, b = earlier
  a_later, b_later = later
  return a_later * a, a_later * b + b_later


def linear_scan(a: Array | None, b: Array, h0: Array | None = None, *,
                valid: Array | None = None, reverse: bool = False,
                parallel: bool = True) -> tuple[Array, Array]:
  """All states h_t = a_t ⊙ h_{t−1} + b_t and the last one (see the module docstring).

  a=None means a_t = 1: the scan is then a cumulative sum (only additions).

  Returns:
    h: [B, T, *state], the state after each step (in b's dtype, or a's if wider);
    h_last: [B, *state], the state after the last step in scan order (the first time step
    when `reverse`).
  """
  batch, num_steps = b.shape[:2]
  if a is not None:
    if a.ndim != b.ndim:
      raise ValueError(f"a must have b's rank {b.ndim} (size-1 axes broadcast), got shape {a.shape}")
    a = jnp.broadcast_to(a, (batch, num_steps) + a.shape[2:])
    b = b.astype(jnp.result_type(a, b))
  if valid is not None:
    keep = valid.reshape(valid.shape + (1,) * (b.ndim - 2))
    a = None if a is None else jnp.where(keep, a, jnp.ones((), a.dtype))
    b = jnp.where(keep, b, jnp.zeros((), b.dtype))
  if h0 is not None:
    first = -1 if reverse else 0
    b = b.at[:, first].add(h0 if a is None else a[:, first] * h0)
  if parallel:
    h = (lax.associative_scan(jnp.add, b, reverse=reverse, axis=1) if a is None else
         lax.associative_scan(_combine, (a, b), reverse=reverse, axis=1)[1])
  else:
    if a is None:
      step = lambda h, b_t: (h + b_t,) * 2
      xs = jnp.moveaxis(b, 1, 0)
    else:
      step = lambda h, ab: (ab[0] * h + ab[1],) * 2
      xs = (jnp.moveaxis(a, 1, 0), jnp.moveaxis(b, 1, 0))
    state_shape = b.shape[2:] if a is None else jnp.broadcast_shapes(a.shape[2:], b.shape[2:])
    _, h = lax.scan(step, jnp.zeros((batch,) + state_shape, b.dtype), xs, reverse=reverse)
    h = jnp.moveaxis(h, 0, 1)
  return h, h[:, 0] if reverse else h[:, -1]
