"""The self-attention of a transformer block, chosen by name (`model.attention`).

  full               MultiHeadAttention: every key (causal: every earlier one), the
                     implementation "auto" picks per platform (cuDNN / Pallas / chunked …)
  local              sliding window: query i sees keys i − window … i + window (causal:
                     i − window … i)
  longformer         the same window plus global tokens (position 0: a CLS token or the
                     first token), which see and are seen by every position
  linformer          keys and values projected along the length to `proj_len` (Wang et al.
                     2020); needs `max_length`
  memory_compressed  keys and values shortened `compression`-fold by a strided convolution
                     (Liu et al. 2018)

`self_attention(name, ...)` returns the module's constructor; a block calls it with
name="attention" and then as `attention(x [B, L, F], is_causal=..., key_value_seq_lengths=
lengths [B] or None, train=...)` -> [B, L, F]. Keys t ≥ length are padding in every variant.
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn

from research.attention import LinformerSelfAttention, MemoryCompressedAttention, MultiHeadAttention

ATTENTIONS = ("full", "local", "longformer", "linformer", "memory_compressed")


def self_attention(name: str, *, num_heads: int, features: int, window: int = 0,
                   max_length: int | None = None, proj_len: int = 256, compression: int = 4,
                   implementation: str = "auto", dtype: Any = None) -> Callable[..., nn.Module]:
  """The constructor of the self-attention called `name` (one of ATTENTIONS).

  Args:
    num_heads: heads H, dividing `features`.
    features: F, the block's width (queries, keys and values have H · d = F features).
    window: half-width of "local" and "longformer" (> 0 there).
    max_length: longest input (Linformer's projections E, F [proj_len, max_length]).
    proj_len: Linformer's projected length k.
    compression: memory-compressed attention's stride c.
    implementation: research.attention implementation of "full", "local", "longformer".
    dtype: dtype of the matrix products.
  """
  if name not in ATTENTIONS:
    raise ValueError(f"attention must be one of {ATTENTIONS}, got {name!r}")
  if name in ("local", "longformer") and window < 1:
    raise ValueError(f"attention {name!r} needs a window > 0, got {window}")
  if name == "linformer":
    if max_length is None:
      raise ValueError("attention 'linformer' needs max_length (the longest input)")
    return functools.partial(LinformerSelfAttention, num_heads, features, proj_len, max_length,
                             dtype=dtype)
  if name == "memory_compressed":
    return functools.partial(MemoryCompressedAttention, num_heads, features, compression,
                             dtype=dtype)
  return functools.partial(MultiHeadAttention, num_heads, implementation=implementation,
                           window=None if name == "full" else window,
                           global_tokens=(0,) if name == "longformer" else None, dtype=dtype)
