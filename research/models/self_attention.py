"""The self-attention of a transformer block, chosen by name (`model.attention`): the rows
of Long Range Arena's Table 1, and memory-compressed attention beside them.

`self_attention(name, ...)` builds any of SELF_ATTENTIONS with one interface, so every
block model (sequence_tasks, listops, char_lm) takes each of them; its docstring says what
each name is and which options it reads.
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn

from research.attention import (
  BigBird,
  LinearSelfAttention,
  LinformerSelfAttention,
  LSHSelfAttention,
  MemoryCompressedAttention,
  MultiHeadAttention,
  PerformerSelfAttention,
  SinkhornSelfAttention,
  SparseFixed,
  SynthesizerSelfAttention,
)
from research.errors import check_choice

SELF_ATTENTIONS = ("full", "local", "longformer", "sparse", "bigbird", "linformer",
                   "memory_compressed", "linear", "performer", "synthesizer", "sinkhorn",
                   "reformer")
NOT_CAUSAL = ("linformer", "memory_compressed")   # a key position mixes later positions
CAUSAL_ATTENTIONS = tuple(name for name in SELF_ATTENTIONS if name not in NOT_CAUSAL)
WINDOWED = ("local", "longformer")                # the attentions that read `window`
NEEDS_MAX_LENGTH = ("linformer", "synthesizer", "sinkhorn")
SYNTHESIZER_QUERY_BLOCK = 256   # queries per block of a longer Synthesizer (O(256·n) memory)


def check_attention(name: str, *, window: int, causal: bool = False) -> None:
  """ValueError unless `name` is one of SELF_ATTENTIONS (CAUSAL_ATTENTIONS when causal)
  that runs with `window` (> 0 for the WINDOWED ones), before a model is built. Every
  variant but linformer and memory_compressed can be causal (query i sees keys j ≤ i): a
  projected or compressed key position mixes several positions, later ones among them
  (research/attention/compressed.py refuses is_causal)."""
  check_choice("attention", name, SELF_ATTENTIONS)
  if causal and name not in CAUSAL_ATTENTIONS:
    raise ValueError(f"attention {name!r} cannot be causal (a key position mixes later "
                     f"positions); a causal model takes one of {', '.join(CAUSAL_ATTENTIONS)}")
  if name in WINDOWED and window < 1:
    raise ValueError(f"attention {name!r} needs a window > 0 (its half-width), got {window}")


def self_attention(name: str, *, num_heads: int, features: int, window: int = 0,
                   max_length: int | None = None, proj_len: int = 256, compression: int = 4,
                   block_size: int = 64, num_features: int = 256, num_hashes: int = 2,
                   layer: int = 0, implementation: str = "auto",
                   dtype: Any = None) -> Callable[..., nn.Module]:
  """The constructor of the self-attention called `name` (one of SELF_ATTENTIONS):

    full               MultiHeadAttention: every key (causal: every earlier one), the
                       implementation "auto" picks per platform (cuDNN / Pallas / chunked …)
    local              sliding window: query i sees keys i − window … i + window (causal:
                       i − window … i)
    longformer         the same window plus global tokens (position 0: a CLS token or the
                       first token), which see and are seen by every position
    sparse             Sparse Transformer's fixed pattern (Child et al. 2019): blocks of
                       `block_size`, each query sees its own block and the last
                       max(1, block_size / 8) positions of every block
    bigbird            BigBird (Zaheer et al. 2020): blocks of `block_size`, a window of 3
                       blocks, 2 global blocks, 3 random blocks per row drawn once from the
                       layer's index
    linformer          keys and values projected along the length to `proj_len` (Wang et
                       al. 2020); needs `max_length`
    memory_compressed  keys and values shortened `compression`-fold by a strided
                       convolution (Liu et al. 2018)
    linear             Linear Transformer (Katharopoulos et al. 2020): φ(x) = elu(x) + 1,
                       O(n·d²)
    performer          FAVOR+ (Choromanski et al. 2021): `num_features` positive orthogonal
                       random features per head, drawn once per layer
    synthesizer        Dense Synthesizer (Tay et al. 2021): weights [n, n] from each token
                       alone by a two-layer MLP; needs `max_length`; past 256 tokens made
                       256 queries at a time (memory O(256·n), as LRA's inputs need)
    sinkhorn           Sparse Sinkhorn attention (Tay et al. 2020): blocks of `block_size`
                       sorted by a Sinkhorn-balanced block permutation; needs `max_length`
    reformer           LSH attention (Kitaev et al. 2020): shared query-key, `num_hashes`
                       rounds of random-rotation hashing, sorted chunks of `block_size`

  A block calls the constructor with name="attention" and then as `attention(x [B, L, F],
  is_causal=..., key_value_seq_lengths=lengths [B] or None, train=...)` -> [B, L, F]. Keys
  t ≥ length are padding in every variant; which can be causal: `check_attention`.

  Args:
    num_heads: heads H, dividing `features`.
    features: F, the block's width (queries, keys and values have H · d = F features).
    window: half-width of "local" and "longformer" (> 0 there).
    max_length: longest input (Linformer's projections E, F [proj_len, max_length], the
      Synthesizer's [max_length] weights per token, Sinkhorn's sort network).
    proj_len: Linformer's projected length k.
    compression: memory-compressed attention's stride c.
    block_size: the block of "sparse", "bigbird" and "sinkhorn", the chunk of "reformer".
    num_features: Performer's random features per head m.
    num_hashes: Reformer's hash rounds.
    layer: the layer's index: the seed of BigBird's random blocks, Performer's features
      and Reformer's rotations, so that every layer draws its own.
    implementation: research.attention implementation of the softmax attentions (full,
      local, longformer, sparse, bigbird, and memory_compressed's over compressed keys).
    dtype: dtype of the matrix products.
  """
  check_attention(name, window=window)
  if name in NEEDS_MAX_LENGTH and max_length is None:
    raise ValueError(f"attention {name!r} needs max_length (the longest input)")
  if name == "linformer":
    return functools.partial(LinformerSelfAttention, num_heads, features, proj_len, max_length,
                             dtype=dtype)
  if name == "memory_compressed":
    return functools.partial(MemoryCompressedAttention, num_heads, features, compression,
                             implementation=implementation, dtype=dtype)
  if name == "linear":
    return functools.partial(LinearSelfAttention, num_heads, qkv_features=features, dtype=dtype)
  if name == "performer":
    return functools.partial(PerformerSelfAttention, num_heads, num_features=num_features,
                             seed=layer, qkv_features=features, dtype=dtype)
  if name == "synthesizer":
    return functools.partial(SynthesizerSelfAttention, num_heads, max_length,
                             query_block=SYNTHESIZER_QUERY_BLOCK
                             if max_length > SYNTHESIZER_QUERY_BLOCK else None,
                             qkv_features=features, dtype=dtype)
  if name == "sinkhorn":
    return functools.partial(SinkhornSelfAttention, num_heads, max_length,
                             block_size=block_size, qkv_features=features, dtype=dtype)
  if name == "reformer":
    return functools.partial(LSHSelfAttention, num_heads, chunk_size=block_size,
                             num_hashes=num_hashes, seed=layer, qkv_features=features,
                             dtype=dtype)
  sparsity = {"sparse": SparseFixed(block=block_size, summary=max(1, block_size // 8)),
              "bigbird": BigBird(block=block_size, seed=layer)}.get(name)
  return functools.partial(MultiHeadAttention, num_heads, implementation=implementation,
                           window=window if name in WINDOWED else None,
                           global_tokens=(0,) if name == "longformer" else None,
                           sparsity=sparsity, dtype=dtype)
