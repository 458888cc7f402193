"""Sequence models for the synthetic tasks: a recurrent stack or a stack of blocks.

`SequenceModel` reads one-hot tokens or float features with a research.recurrent layer or
the blocks of block_stack.py (any self-attention or linear recurrence, causal or not) and
predicts at every position or at the last one.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_choice
from research.models.block_stack import BlockStack, StackFields
from research.models.kinds import KINDS, RECURRENT

Array = jax.Array
HEADS = ("per_position", "last")


class SequenceModel(StackFields):
  """inputs [B, L] int tokens (vocab_size given) or [B, L, D] floats -> outputs.

    rnn | lstm | gru   inputs (one-hot tokens, or the float features as they are) ->
                       research.recurrent layer (num_layers × hidden_size, dropout_rate
                       between layers) -> head
    transformer        the stack (block_stack.py): token embedding (or Dense for float
    lru | s5           inputs) + positions -> num_layers blocks (pre-norm by default:
                       x += Mixer(LN(x)); x += MLP(LN(x))) mixing positions with the
                       self-attention `attention` (any of SELF_ATTENTIONS; local: query i
                       sees keys i − window … i + window) or a bidirectional linear
                       recurrence (recurrent_mixer.py) -> LayerNorm -> head

  With `causal`, position i of the blocks reads positions ≤ i only: causal self-attention
  (one of CAUSAL_ATTENTIONS; local: keys i − window … i), the forward recurrence alone
  (half the work of both).

  Returns [B, L, num_outputs] with head "per_position", [B, num_outputs] with "last": the
  last position of a recurrent model, or of causal blocks, has read the whole sequence, and
  every position of the non-causal blocks sees every other. The blocks' fields are
  StackFields' (block_stack.py): hidden_size, num_layers, mlp_size, attention, window, …,
  dropout_rate (the recurrent kinds' too). Matrix products run in `dtype` (e.g. bfloat16)
  with float32 parameters; the outputs are float32. With `remat` (remat.py) each block, or
  each layer of the recurrent stack, is recomputed in the backward pass instead of keeping
  its activations.
  """
  kind: str                      # one of KINDS: "rnn", "lstm", "gru", "transformer", "lru", "s5"
  num_outputs: int               # classes, or 1 for a scalar
  head: str = "per_position"     # "per_position" or "last"
  vocab_size: int | None = None  # token inputs; None: float inputs [B, L, D]
  causal: bool = False           # blocks: position i reads positions <= i only

  @nn.compact
  def __call__(self, inputs: Array, *, train: bool = False) -> Array:
    check_choice("kind", self.kind, KINDS)
    check_choice("head", self.head, HEADS)
    self.check_names()
    if self.kind in RECURRENT:
      x = inputs if self.vocab_size is None else jax.nn.one_hot(inputs, self.vocab_size)
      x, _ = RECURRENT[self.kind](self.hidden_size, self.num_layers, dropout=self.dropout_rate,
                                  dtype=self.dtype, remat_layer=self.remat_layer(),
                                  name="recurrent")(x, train=train)
    else:
      x = BlockStack(**self.stack_fields(), kind=self.kind, vocab_size=self.vocab_size,
                     causal=self.causal, name="stack")(inputs, train=train)
    if self.head == "last":
      x = x[:, -1]
    return nn.Dense(self.num_outputs, dtype=self.dtype, name="head")(x).astype(jnp.float32)
