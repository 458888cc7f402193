"""Sequence models for the synthetic tasks: a recurrent stack or a small transformer encoder.

  rnn | lstm | gru   inputs (one-hot tokens, or the float features as they are) ->
                     research.recurrent layer (num_layers × hidden_size) -> head
  transformer        token embedding (or Dense for float inputs) + sinusoidal positions ->
                     num_layers pre-norm TransformerBlocks (x += MHA(LN(x)); x += MLP(LN(x)))
                     with non-causal self-attention, "full" or "local" (query i sees keys
                     i − window … i + window) -> LayerNorm -> head
  lru | s5           the same blocks with a bidirectional linear recurrence in the place of
                     the self-attention (recurrent_mixer.py)

With `causal`, position i of the blocks reads positions ≤ i only: causal self-attention
(local: keys i − window … i), the forward recurrence alone (half the work of both).

The head is a Dense layer on every position ("per_position": [B, L, num_outputs]) or on
the last one ("last": [B, num_outputs]); the last position of a recurrent model, or of
causal blocks, has read the whole sequence, and every position of the non-causal blocks
sees every other. Matrix products
run in `dtype` (e.g. bfloat16) with float32 parameters; the outputs are float32.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.models.kinds import KINDS, RECURRENT
from research.models.positions import sinusoidal_positions
from research.models.recurrent_mixer import block_mixer
from research.models.self_attention import self_attention
from research.models.transformer_block import TransformerBlock

Array = jax.Array
HEADS = ("per_position", "last")
ATTENTIONS = ("full", "local")   # the patterns of self_attention.ATTENTIONS that need no length


class SequenceModel(nn.Module):
  """inputs [B, L] int tokens (vocab_size given) or [B, L, D] floats -> outputs.

  Returns [B, L, num_outputs] with head "per_position", [B, num_outputs] with "last".
  """
  kind: str                      # one of KINDS: "rnn", "lstm", "gru", "transformer", "lru", "s5"
  hidden_size: int               # recurrent state / transformer features F
  num_layers: int                # recurrent layers / transformer blocks
  num_outputs: int               # classes, or 1 for a scalar
  head: str = "per_position"     # "per_position" or "last"
  vocab_size: int | None = None  # token inputs; None: float inputs [B, L, D]
  num_heads: int = 1             # transformer attention heads, dividing hidden_size
  attention: str = "full"        # transformer attention pattern: "full" or "local"
  implementation: str = "auto"   # research.attention implementation of the attention
  window: int = 0                # half-width of "local" attention
  state_size: int = 64           # lru / s5: complex states N of each block's recurrence
  recurrence: Any = None         # lru / s5: {kind: {option: value}} (recurrent_mixer.OPTIONS)
  causal: bool = False           # blocks: position i reads positions <= i only
  dtype: Any = "float32"         # dtype of the matrix products ("float32", "bfloat16")

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
    if self.head not in HEADS:
      raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
    if self.attention not in ATTENTIONS or (self.attention == "local") != (self.window > 0):
      raise ValueError(f"attention must be one of {ATTENTIONS}, 'local' with a window > 0 and "
                       f"'full' with window 0; got {self.attention!r} and window {self.window}")
    if self.kind in RECURRENT:
      x = inputs if self.vocab_size is None else jax.nn.one_hot(inputs, self.vocab_size)
      x, _ = RECURRENT[self.kind](self.hidden_size, self.num_layers, dtype=self.dtype,
                                  name="recurrent")(x)
    else:
      x = self.encode(inputs)
    if self.head == "last":
      x = x[:, -1]
    return nn.Dense(self.num_outputs, dtype=self.dtype, name="head")(x).astype(jnp.float32)

  def encode(self, inputs: Array) -> Array:
    """The transformer encoder: inputs -> [B, L, hidden_size]."""
    if self.vocab_size is None:
      x = nn.Dense(self.hidden_size, dtype=self.dtype, name="embed")(inputs)
    else:
      x = nn.Embed(self.vocab_size, self.hidden_size, dtype=self.dtype, name="embed")(inputs)
    x = x + sinusoidal_positions(x.shape[1], self.hidden_size).astype(x.dtype)
    mixer = block_mixer(self.kind, functools.partial(self_attention,
        self.attention, num_heads=self.num_heads, features=self.hidden_size,
        window=self.window, implementation=self.implementation, dtype=self.dtype),
                        state_size=self.state_size, dtype=self.dtype,
                        recurrence=self.recurrence)
    for layer in range(self.num_layers):
      x = TransformerBlock(mixer, 4 * self.hidden_size, is_causal=self.causal,
                           dtype=self.dtype, name=f"block{layer}")(x)
    return nn.LayerNorm(name="final_norm")(x)
