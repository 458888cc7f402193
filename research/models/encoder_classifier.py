"""A transformer encoder classifier for long inputs (Long Range Arena's text tasks).

  tokens [B, L] (0 = padding), lengths [B]
    -> embedding (+ a learned CLS vector at position 0 with "cls" pooling)
    -> + positions: learned [max_length, F] or sinusoidal (Vaswani et al.)
    -> dropout -> num_layers blocks -> pooling (the CLS position, or the mean over real
       positions) -> Dense(num_classes): logits [B, num_classes] in float32

A block, pre-norm (LayerNorm inside each residual branch; a final LayerNorm) or post-norm
(LayerNorm after each residual sum, as in the original Transformer and LRA):

  x ← x + Dropout(Attention(LN(x)));   x ← x + Dropout(W₂ gelu(W₁ LN(x)))       (pre)
  x ← LN(x + Dropout(Attention(x)));   x ← LN(x + Dropout(W₂ gelu(W₁ x)))       (post)

Attention, every variant masking the padding (keys t ≥ length):

  full               MultiHeadAttention, implementation "auto" (cuDNN / Pallas / chunked)
  local              sliding window: query i sees keys i − window … i + window
  longformer         the same window plus global tokens (position 0: the CLS token, or the
                     first token), which see and are seen by every position
  linformer          keys and values projected along the length to `proj_len` (Wang et al.)
  memory_compressed  keys and values shortened `compression`-fold by a strided convolution
                     (Liu et al. 2018)

Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention import LinformerSelfAttention, MemoryCompressedAttention, MultiHeadAttention
from research.models.sequence_model import sinusoidal_positions

Array = jax.Array
ATTENTIONS = ("full", "local", "longformer", "linformer", "memory_compressed")
POSITIONS = ("learned", "sinusoidal")
NORMS = ("pre", "post")
POOLINGS = ("cls", "mean")


class EncoderLayer(nn.Module):
  """One encoder block on x [B, L, F] with key lengths [B] (see the module docstring)."""
  num_heads: int
  mlp_size: int
  attention: str
  norm: str
  dropout_rate: float
  max_length: int               # longest input, CLS included (Linformer's projections)
  window: int
  proj_len: int
  compression: int
  implementation: str
  dtype: Any

  def attend(self, x: Array, lengths: Array) -> Array:
    features = x.shape[-1]
    if self.attention == "linformer":
      return LinformerSelfAttention(self.num_heads, features, self.proj_len, self.max_length,
                                    dtype=self.dtype, name="attention")(
                                        x, key_value_seq_lengths=lengths)
    if self.attention == "memory_compressed":
      return MemoryCompressedAttention(self.num_heads, features, self.compression,
                                       dtype=self.dtype, name="attention")(
                                           x, key_value_seq_lengths=lengths)
    window = None if self.attention == "full" else self.window
    global_tokens = (0,) if self.attention == "longformer" else None
    return MultiHeadAttention(self.num_heads, implementation=self.implementation, window=window,
                              global_tokens=global_tokens, dtype=self.dtype, name="attention")(
                                  x, key_value_seq_lengths=lengths)

  @nn.compact
  def __call__(self, x: Array, lengths: Array, train: bool) -> Array:
    drop = lambda y: nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    pre = self.norm == "pre"
    norm = lambda name: nn.LayerNorm(name=name)

    def mlp(y):
      y = nn.Dense(self.mlp_size, dtype=self.dtype, name="mlp_in")(y)
      return nn.Dense(x.shape[-1], dtype=self.dtype, name="mlp_out")(drop(nn.gelu(y)))

    y = drop(self.attend(norm("attention_norm")(x) if pre else x, lengths))
    x = x + y if pre else norm("attention_norm")(x + y)
    y = drop(mlp(norm("mlp_norm")(x) if pre else x))
    return x + y if pre else norm("mlp_norm")(x + y)


class EncoderClassifier(nn.Module):
  """tokens [B, L] int, lengths [B] -> logits [B, num_classes] (see the module docstring)."""
  vocab_size: int
  num_classes: int
  max_length: int                   # longest token sequence (without the CLS token)
  num_layers: int = 6
  hidden_size: int = 512            # F
  num_heads: int = 8
  mlp_size: int = 2048
  attention: str = "full"           # one of ATTENTIONS
  window: int = 64                  # local / longformer half-width
  proj_len: int = 256               # linformer's projected length k
  compression: int = 4              # memory_compressed's c
  positions: str = "learned"        # "learned" or "sinusoidal"
  norm: str = "post"                # "post" (LRA) or "pre"
  pooling: str = "cls"              # "cls" or "mean"
  dropout_rate: float = 0.1
  implementation: str = "auto"      # research.attention implementation of full / local / longformer
  dtype: Any = "float32"            # dtype of the matrix products

  def check(self):
    for name, allowed in (("attention", ATTENTIONS), ("positions", POSITIONS), ("norm", NORMS),
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
      x = EncoderLayer(self.num_heads, self.mlp_size, self.attention, self.norm,
                       self.dropout_rate, max_length, self.window, self.proj_len,
                       self.compression, self.implementation, dtype, name=f"layer{layer}")(
                           x, lengths, train)
    if self.norm == "pre":
      x = nn.LayerNorm(name="final_norm")(x)
    if self.pooling == "cls":
      pooled = x[:, 0]
    else:
      real = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
      pooled = (x * real).sum(1) / jnp.maximum(lengths, 1)[:, None].astype(x.dtype)
    return nn.Dense(self.num_classes, dtype=dtype, name="head")(pooled).astype(jnp.float32)
