"""A transformer encoder classifier for long inputs (Long Range Arena's text tasks).

  tokens [B, L] (0 = padding), lengths [B]
    -> embedding (+ a learned CLS vector at position 0 with "cls" pooling)
    -> + positions: learned [max_length, F] or sinusoidal (Vaswani et al.)
    -> dropout -> num_layers blocks -> pooling (the CLS position, or the mean over real
       positions) -> Dense(num_classes): logits [B, num_classes] in float32

Each block is a `TransformerBlock` (pre- or post-norm, dropout on both branches and on
the MLP's hidden units) whose self-attention is one of `self_attention.ATTENTIONS`, every
variant masking the padding (keys t ≥ length); with kind "lru" or "s5" a bidirectional
linear recurrence takes the self-attention's place (recurrent_mixer.py).

Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.models.positions import sinusoidal_positions
from research.models.recurrent_mixer import LINEAR_RECURRENT, block_mixer
from research.models.self_attention import ATTENTIONS, self_attention
from research.models.transformer_block import NORMS, TransformerBlock

Array = jax.Array
POSITIONS = ("learned", "sinusoidal")
POOLINGS = ("cls", "mean")
CLASSIFIER_KINDS = ("transformer", *LINEAR_RECURRENT)


class EncoderClassifier(nn.Module):
  """tokens [B, L] int, lengths [B] -> logits [B, num_classes] (see the module docstring)."""
  vocab_size: int
  num_classes: int
  max_length: int                   # longest token sequence (without the CLS token)
  num_layers: int = 6
  hidden_size: int = 512            # F
  num_heads: int = 8
  mlp_size: int = 2048
  kind: str = "transformer"         # the blocks' mixer: "transformer" (self-attention), "lru", "s5"
  attention: str = "full"           # kind "transformer": one of ATTENTIONS
  state_size: int = 64              # kinds "lru" / "s5": complex states N per block
  recurrence: Any = None            # kinds "lru" / "s5": {kind: {option: value}}
                                    # (recurrent_mixer.OPTIONS; None: the layers' defaults)
  window: int = 64                  # local / longformer half-width
  proj_len: int = 256               # linformer's projected length k
  compression: int = 4              # memory_compressed's c
  block_size: int = 64              # sparse / bigbird / sinkhorn block, reformer's chunk
  num_features: int = 256           # performer's random features per head
  num_hashes: int = 2               # reformer's hash rounds
  positions: str = "learned"        # "learned" or "sinusoidal"
  norm: str = "post"                # "post" (LRA) or "pre"
  pooling: str = "cls"              # "cls" or "mean"
  dropout_rate: float = 0.1
  implementation: str = "auto"      # research.attention implementation of full / local /
                                    # longformer / sparse / bigbird
  dtype: Any = "float32"            # dtype of the matrix products

  def check(self):
    for name, allowed in (("kind", CLASSIFIER_KINDS), ("attention", ATTENTIONS),
                          ("positions", POSITIONS), ("norm", NORMS),
                          ("pooling", POOLINGS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

  @nn.compact
  def __call__(self, tokens: Array, lengths: Array, *, train: bool = False) -> Array:
    self.check()
    dtype = jnp.dtype(self.dtype)
    x = nn.Embed(self.vocab_size, self.hidden_size, dtype=dtype, name="embed")(tokens)
    if self.pooling == "cls":
      cls = self.param("cls", nn.initializers.normal(0.02), (self.hidden_size,))
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), x[:, :1].shape), x], axis=1)
      lengths = lengths + 1
    max_length = self.max_length + (self.pooling == "cls")
    if self.positions == "learned":
      table = self.param("positions", nn.initializers.normal(0.02), (max_length, self.hidden_size))
    else:
      table = sinusoidal_positions(max_length, self.hidden_size)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(
        x + table[:x.shape[1]].astype(x.dtype))
    for layer in range(self.num_layers):
      mixer = block_mixer(self.kind, functools.partial(self_attention,
          self.attention, num_heads=self.num_heads, features=self.hidden_size,
          window=self.window, max_length=max_length, proj_len=self.proj_len,
          compression=self.compression, block_size=self.block_size,
          num_features=self.num_features, num_hashes=self.num_hashes, layer=layer,
          implementation=self.implementation, dtype=dtype),
                          state_size=self.state_size, dtype=dtype, recurrence=self.recurrence)
      x = TransformerBlock(mixer, self.mlp_size, norm=self.norm,
                           dropout_rate=self.dropout_rate,
                           activation_dropout_rate=self.dropout_rate, dtype=dtype,
                           name=f"layer{layer}")(x, lengths, train=train)
    if self.norm == "pre":
      x = nn.LayerNorm(name="final_norm")(x)
    if self.pooling == "cls":
      pooled = x[:, 0]
    else:
      real = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
      pooled = (x * real).sum(1) / jnp.maximum(lengths, 1)[:, None].astype(x.dtype)
    return nn.Dense(self.num_classes, dtype=dtype, name="head")(pooled).astype(jnp.float32)
