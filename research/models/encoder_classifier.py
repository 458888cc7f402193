"""A transformer encoder classifier for long inputs (Long Range Arena's text tasks).

The stack of blocks (any self-attention masking the padding, or a bidirectional linear
recurrence), pooled at a CLS position or over the real positions, then a linear head;
`pool` is shared with the dual encoder of the Retrieval task.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_choice
from research.models.block_stack import BlockStack, StackFields

Array = jax.Array
POOLINGS = ("cls", "mean")


class EncoderClassifier(StackFields):
  """tokens [B, L] int, lengths [B] -> logits [B, num_classes]; the stack's fields are
  StackFields' (block_stack.py).

    tokens [B, L] (0 = padding), lengths [B]
      -> the stack (block_stack.py): embedding (+ a learned CLS vector at position 0 with
         "cls" pooling), positions, dropout, num_layers blocks, the final norm of pre-norm
      -> pooling (the CLS position, or the mean over real positions)
      -> Dense(num_classes): logits [B, num_classes] in float32

  Each block is a `TransformerBlock` whose self-attention is one of
  `self_attention.SELF_ATTENTIONS`, every variant masking the padding (keys t ≥ length);
  with kind "lru" or "s5" a bidirectional linear recurrence takes the self-attention's
  place (recurrent_mixer.py). `max_length` counts the tokens without the CLS token. LRA's
  Transformer-base is post-norm, learned positions, dropout 0.1 (experiments/listops.py).
  Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters.
  """
  vocab_size: int
  num_classes: int
  kind: str = "transformer"         # the blocks' mixer, one of kinds.BLOCK_KINDS:
                                    # "transformer" (self-attention), "lru", "s5"
  pooling: str = "cls"              # "cls" or "mean"

  @nn.compact
  def __call__(self, tokens: Array, lengths: Array, *, train: bool = False) -> Array:
    check_choice("pooling", self.pooling, POOLINGS)
    x = BlockStack(**self.stack_fields(), kind=self.kind, vocab_size=self.vocab_size,
                   cls=self.pooling == "cls", name="stack")(tokens, lengths, train=train)
    return nn.Dense(self.num_classes, dtype=jnp.dtype(self.dtype), name="head")(
        pool(x, lengths, self.pooling)).astype(jnp.float32)


def pool(features: Array, lengths: Array, pooling: str) -> Array:
  """The stack's features [B, L (+ 1), F] -> [B, F]: "cls" the CLS position (0), "mean" the
  mean over the real positions t < length."""
  if pooling == "cls":
    return features[:, 0]
  real = (jnp.arange(features.shape[1])[None, :] < lengths[:, None])[..., None]
  return (features * real).sum(1) / jnp.maximum(lengths, 1)[:, None].astype(features.dtype)
