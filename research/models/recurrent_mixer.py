"""A linear recurrence (LRU, S5) in the place of a TransformerBlock's self-attention.

  x [B, L, F] -> y [B, L, F]:  y = LRU(x) or S5(x) with N = `state_size` complex states

Not causal (an encoder, a classifier): bidirectional, a forward and a backward state, so
every position reads the whole sequence as self-attention does; causal (a decoder): the
forward state alone. Padded steps (t ≥ length) give zeros and leave the state as it was.
The block around it (LayerNorm, residual, MLP) is the transformer's, so a model of these
blocks has the transformer's widths and depth, as in the LRU and S5 papers' LRA models.

`block_mixer(kind, ...)` is the constructor a TransformerBlock calls with name="attention":
self-attention for kind "transformer", the recurrence for "lru" and "s5".
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from research.recurrent import LRU, S5

Array = jax.Array
LINEAR_RECURRENT = {"lru": LRU, "s5": S5}


class RecurrentMixer(nn.Module):
  """x [B, L, F], key lengths [B] or None -> [B, L, F] (see the module docstring)."""
  layer: Callable[..., nn.Module]   # LRU or S5
  state_size: int = 64              # N
  dtype: Any = None                 # dtype of the matrix products

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train  # no dropout inside the recurrence
    y, _ = self.layer(state_size=self.state_size, bidirectional=not is_causal,
                      dtype=self.dtype, name="recurrence")(x, seq_lengths=key_value_seq_lengths)
    return y.astype(x.dtype)


def block_mixer(kind: str, self_attention: Callable[[], Callable[..., nn.Module]], *,
                state_size: int, dtype: Any) -> Callable[..., nn.Module]:
  """The mixer of a block of a model of `kind`: `self_attention()` (a constructor, see
  self_attention.py) for "transformer", RecurrentMixer for the LINEAR_RECURRENT kinds."""
  if kind in LINEAR_RECURRENT:
    return functools.partial(RecurrentMixer, LINEAR_RECURRENT[kind], state_size, dtype=dtype)
  return self_attention()
