"""A two-tower classifier of document pairs (Long Range Arena's Retrieval task).

Both documents go through one stack of blocks (shared weights), and LRA's head classifies
the pair from InferSent's features of the two pooled encodings.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_choice
from research.models.block_stack import MLP_RATIO, BlockStack, StackFields
from research.models.encoder_classifier import POOLINGS, pool

Array = jax.Array


class DualEncoderClassifier(StackFields):
  """tokens [B, 2, L] int, lengths [B, 2] -> logits [B, num_classes]:

    tokens [B, 2, L] (0 = padding), lengths [B, 2]
      -> both documents through one stack (block_stack.py, shared weights: one pass over the
         2B documents), pooled (the CLS position, or the mean over real positions): u, v [B, F]
      -> [u, v, u ⊙ v, u − v] [B, 4F]             (LRA's `classifier_head_dual`, after
      -> Dense(mlp_size) -> ReLU -> Dense(num_classes)   Conneau et al.'s InferSent features)
      -> logits [B, num_classes] in float32

  The stack's fields are StackFields' (block_stack.py), as in EncoderClassifier; the head's
  hidden width is the blocks' MLP width `mlp_size`, as LRA's head takes its `mlp_dim`.
  Matrix products run in `dtype` with float32 parameters.
  """
  vocab_size: int
  num_classes: int
  kind: str = "transformer"         # the blocks' mixer, one of kinds.BLOCK_KINDS
  pooling: str = "cls"              # "cls" or "mean"

  @nn.compact
  def __call__(self, tokens: Array, lengths: Array, *, train: bool = False) -> Array:
    check_choice("pooling", self.pooling, POOLINGS)
    if tokens.ndim != 3 or tokens.shape[1] != 2 or lengths.shape != tokens.shape[:2]:
      raise ValueError(f"tokens [B, 2, L] and lengths [B, 2] expected, got {tokens.shape} "
                       f"and {lengths.shape}")
    batch, _, length = tokens.shape
    documents, document_lengths = tokens.reshape(2 * batch, length), lengths.reshape(-1)
    x = BlockStack(**self.stack_fields(), kind=self.kind, vocab_size=self.vocab_size,
                   cls=self.pooling == "cls", name="stack")(documents, document_lengths,
                                                            train=train)
    u, v = jnp.moveaxis(pool(x, document_lengths, self.pooling).reshape(batch, 2, -1), 1, 0)
    dtype = jnp.dtype(self.dtype)
    hidden = nn.Dense(self.mlp_size or MLP_RATIO * self.hidden_size, dtype=dtype, name="mlp")(
        jnp.concatenate([u, v, u * v, u - v], axis=-1))
    return nn.Dense(self.num_classes, dtype=dtype, name="head")(
        nn.relu(hidden)).astype(jnp.float32)
