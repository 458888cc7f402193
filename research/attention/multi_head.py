"""Multi-head attention ("Attention is all you need"), grouped / multi-query heads, KV cache.

`MultiHeadAttention` has the parameter names and layout of
`flax.linen.MultiHeadDotProductAttention`, attends through `dot_product_attention` (any
implementation, window, global tokens or block-sparse pattern) and decodes token by token
with a cache that reproduces the causal pass over the whole sequence.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.attention import block_sparse, registry
from research.attention.dense import weighted_values
from research.attention.functional import dot_product_attention
from research.attention.masks import Visibility
from research.errors import check_positive

Array = jax.Array


def check_heads(qkv_features: int, num_heads: int, num_kv_heads: int | None = None) -> int:
  """Validates a head configuration and returns the head size d = qkv_features / num_heads."""
  check_positive("num_heads", num_heads)
  if qkv_features % num_heads:
    raise ValueError(f"qkv_features ({qkv_features}) must be divisible by num_heads ({num_heads})")
  if num_kv_heads is not None and (not isinstance(num_kv_heads, int) or num_kv_heads < 1
                                   or num_heads % num_kv_heads):
    raise ValueError(f"num_kv_heads ({num_kv_heads!r}) must be a positive divisor of num_heads "
                     f"({num_heads}): 1 (multi-query) … {num_heads} (multi-head)")
  return qkv_features // num_heads


class MultiHeadAttention(nn.Module):
  """Multi-head (or grouped / multi-query) attention over query and key/value inputs.

  With H query heads, H_kv key/value heads (H_kv divides H; G = H / H_kv) and
  d = qkv_features / H:

    q_h = x_q W_q^h + b_q^h,   k_g = x_k W_k^g + b_k^g,   v_g = x_v W_v^g + b_v^g
    head_h = softmax(q_h k_gᵀ / √d + bias, over the visible keys) v_g   with g = ⌊h / G⌋
    out = Σ_h head_h W_o^h + b_o

  H_kv = H is multi-head attention, H_kv = 1 multi-query attention (Shazeer 2019), anything
  in between grouped-query attention (Ainslie et al. 2023). `window` / `global_tokens`
  (Longformer) or `sparsity` (Sparse Transformer's fixed / strided, BigBird: see
  `block_sparse`) restrict which keys each query sees. Parameters, with D_q, D_k, D_v
  the feature sizes of the query, key and value inputs (the names and layout of
  `flax.linen.MultiHeadDotProductAttention`):

    query/kernel [D_q, H, d]      query/bias [H, d]
    key/kernel   [D_k, H_kv, d]   key/bias   [H_kv, d]
    value/kernel [D_v, H_kv, d]   value/bias [H_kv, d]
    out/kernel   [H, d, out_features]   out/bias [out_features]

  Incremental decoding (decode=True) keeps a "cache" collection, like flax's module:
  cached_key / cached_value [batch, max_len, H_kv, d] and cache_index. `init` with a
  full-length input [batch, max_len, features] allocates it (and attends normally); each
  later call with n new tokens writes their keys and values at cache_index, lets them see
  the cached positions < cache_index plus the new ones causally, and advances the index
  by n. Decoding token by token therefore reproduces the causal pass over the whole
  sequence. The index is traced, so writing past max_len cannot be caught: it is the
  caller's job to stop at max_len.

  `__call__(inputs_q [b, q_len, D_q], inputs_kv [b, kv_len, D_k] = inputs_q, ...)`
  returns [b, q_len, out_features]. When the weights are computed (implementation="dense",
  or dropout on the weights in training, which "auto" then runs as "dense" on every
  platform) the attention weights [b, H, q_len, kv_len] (before dropout) are sown as
  intermediates/attention_weights; otherwise "auto" picks per lowering platform.
  In a decode step kv_len is the cache's max_len: mask, bias and the sown weights cover
  [n new tokens, max_len].
  """
  num_heads: int                          # H, query heads
  qkv_features: int | None = None         # H · d (default: features of inputs_q)
  out_features: int | None = None         # output features (default: features of inputs_q)
  num_kv_heads: int | None = None         # H_kv, dividing H (None: H; 1: multi-query)
  dropout_rate: float = 0.0               # dropout on the weights (train=True; needs "dense")
  implementation: str = "auto"            # "auto" or a registered name: "dense", "chunked", …
  window: Any = None                      # None, w or (left, right): sliding-window attention
  global_tokens: Any = None               # static positions of Longformer global tokens
  sparsity: Any = None                    # a block-sparse pattern: SparseFixed, SparseStrided,
                                          # BigBird (`block_sparse`; one seed per layer)
  block_size: int | None = None           # chunked / banded block length (None: their defaults)
  use_bias: bool = True                   # biases in the four projections
  decode: bool = False                    # incremental decoding with a KV cache (self-attention)
  dtype: Any = None                       # computation dtype (None: from inputs and params)
  param_dtype: Any = jnp.float32          # parameter dtype
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # projection kernels
  bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()      # projection biases

  def _check_config(self, train: bool):
    registry.check_name(self.implementation)  # lists the names if unknown
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
    if (self.dropout_rate > 0 and train and self.implementation != registry.AUTO
        and not registry.get(self.implementation).returns_weights):
      able = " or ".join(f"implementation={impl!r}" for impl in registry.registered()
                         if registry.get(impl).returns_weights)
      able = able or "an implementation that returns them"
      raise ValueError(f"dropout_rate > 0 with train=True drops the attention weights, which "
                       f"implementation={self.implementation!r} does not return; use {able}")

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               inputs_v: Array | None = None, mask: Array | None = None,
               bias: Array | None = None, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    """Attends from inputs_q to inputs_kv.

    Args:
      inputs_q: [b, q_len, D_q].
      inputs_kv: [b, kv_len, D_k], source of keys (and values); None: self-attention.
      inputs_v: [b, kv_len, D_v], source of values when it differs from the keys' (torch's
        `vdim`); None: inputs_kv.
      mask: bool broadcastable to [b, H, q_len, kv_len], True = may attend.
      bias: added to the logits, broadcastable like mask.
      is_causal: query i sees keys j ≤ i (decode steps are always causal).
      key_value_seq_lengths: [b] ints; keys t ≥ length are padding.
      train: enables attention dropout (PRNG stream "dropout").

    Returns:
      [b, q_len, out_features].
    """
    self._check_config(train)
    features = inputs_q.shape[-1]
    qkv_features = self.qkv_features or features
    num_kv_heads = self.num_kv_heads or self.num_heads
    head_dim = check_heads(qkv_features, self.num_heads, num_kv_heads)
    if self.decode and (inputs_kv is not None or inputs_v is not None):
      raise ValueError("decode=True caches self-attention keys: pass inputs_kv=None and "
                       "inputs_v=None (use decode=False for cross-attention)")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    inputs_v = inputs_kv if inputs_v is None else inputs_v

    dense = functools.partial(nn.DenseGeneral, use_bias=self.use_bias, dtype=self.dtype,
                              param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                              bias_init=self.bias_init)
    q = dense((self.num_heads, head_dim), name="query")(inputs_q)
    k = dense((num_kv_heads, head_dim), name="key")(inputs_kv)
    v = dense((num_kv_heads, head_dim), name="value")(inputs_v)

    pattern = dict(is_causal=is_causal, window=self.window, global_tokens=self.global_tokens,
                   sparsity=self.sparsity, key_value_seq_lengths=key_value_seq_lengths)
    implementation = self.implementation
    if self.decode:
      k, v, step_visible = self._cached_keys_values(k, v, key_value_seq_lengths)
      if step_visible is not None:  # a decode step: the pattern is folded into the cache mask
        mask = step_visible if mask is None else jnp.logical_and(mask, step_visible)
        pattern = {}
        # A step's queries sit at cache positions, not at key positions 0 … n−1, so its
        # window is a mask: an implementation that cannot do the step (banded needs a
        # window) gives way to the one "auto" picks.
        step = registry.Request.of(q, k, v, mask=mask, bias=bias)
        if implementation != registry.AUTO and not registry.can_do(implementation, step):
          implementation = registry.AUTO

    dropout = self.dropout_rate > 0 and train
    weights = dropout or registry.gives_weights(implementation)
    attend = functools.partial(dot_product_attention, q, k, v, mask=mask, bias=bias,
                               implementation="dense" if dropout else implementation,
                               block_size=self.block_size, **pattern)
    if weights:
      out, weights = attend(return_weights=True)
      self.sow("intermediates", "attention_weights", weights)
      if dropout:
        dropped = nn.Dropout(self.dropout_rate, deterministic=False)(weights)
        out = weighted_values(dropped, v).astype(q.dtype)
    else:
      out = attend()
    return dense(self.out_features or features, axis=(-2, -1), name="out")(out)

  def _cached_keys_values(self, k: Array, v: Array, key_value_seq_lengths: Array | None
                          ) -> tuple[Array, Array, Array | None]:
    """Writes k, v [b, n, H_kv, d] into the cache; returns the cache and what the step sees.

    Without a cache yet (at `init`), allocates it with k's shape and returns (k, v, None).
    Otherwise returns cached keys, values [b, max_len, H_kv, d] and the step's visibility
    [b|1, 1, n, max_len]: query i (position cache_index + i) sees keys j ≤ cache_index + i,
    within the window (or block-sparse pattern, bound to [max_len, max_len] as the causal
    pass over the whole sequence binds it) and the key lengths.
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return k, v, None
    batch, max_len, *head_shape = cached_key.value.shape
    new = k.shape[1]
    if k.shape[0] != batch or list(k.shape[2:]) != head_shape or new > max_len:
      raise ValueError(f"decode step: keys {k.shape} do not fit the cache {cached_key.value.shape} "
                       "(same batch and heads, at most max_len new tokens)")
    start = cache_index.value
    at = (0, start, 0, 0)
    cached_key.value = lax.dynamic_update_slice(cached_key.value, k.astype(cached_key.value.dtype), at)
    cached_value.value = lax.dynamic_update_slice(cached_value.value,
                                                  v.astype(cached_value.value.dtype), at)
    cache_index.value = start + new
    lengths = None if key_value_seq_lengths is None else jnp.asarray(key_value_seq_lengths)
    positions = () if self.global_tokens is None else tuple(self.global_tokens)
    sparsity = block_sparse.check(self.sparsity)
    sparsity = None if sparsity is None else sparsity.bind(max_len, max_len, True)
    visibility = Visibility.make(True, self.window, lengths, positions, sparsity)
    visible = visibility.dense(new, max_len, q_start=start)[:, None]
    return cached_key.value, cached_value.value, visible
