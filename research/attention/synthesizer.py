"""Synthesizer attention (Tay et al. 2021, "Synthesizer: Rethinking self-attention for
transformer models"): the weights are synthesised without query-key dot products.

  Dense    B_h[i, :] = relu(x_i W_1^h + b_1^h) W_2^h + b_2^h     (each token its own row;
           x_i W_1^h + b_1^h is head h's query projection q_i^h [d], W_2^h [d, ℓ])
  Random   B_h = R_h [ℓ, ℓ], a learned matrix independent of the input, or R_h = A_h C_hᵀ
           with A_h, C_h [ℓ, k] (factorised random)

  out_h = softmax(B_h[:n, :n], over the visible keys) v_h

with ℓ the longest length (max_len): an input of length n uses the first n rows and
columns. Causal attention and padding keys mask the synthesised logits as they would
q·k logits; a query with no visible key returns zeros.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention.dense import masked_softmax, weighted_values
from research.attention.masks import causal_mask
from research.attention.self_attention import (
  check_positive,
  key_validity,
  merge_heads,
  project_heads,
)

Array = jax.Array
MODES = ("dense", "random")


def dense_synthesizer_logits(q: Array, kernel: Array, bias: Array, kv_len: int | None = None
                             ) -> Array:
  """B[b, h, i, j] = Σ_e relu(q[b, i, h, e]) kernel[h, e, j] + bias[h, j], j < kv_len.

  q: [b, n, H, d] (the first layer, x W_1 + b_1); kernel: [H, d, ℓ]; bias: [H, ℓ];
  kv_len ≤ ℓ (default n). Returns float32 [b, H, n, kv_len].
  """
  kv_len = q.shape[1] if kv_len is None else kv_len
  if (kernel.ndim != 3 or kernel.shape[:2] != q.shape[2:]
      or bias.shape != (q.shape[2], kernel.shape[2])):
    raise ValueError(f"kernel must be [H, d, max_len] = [{q.shape[2]}, {q.shape[3]}, ℓ] and bias "
                     f"[H, ℓ]; got {kernel.shape} and {bias.shape}")
  if kv_len > kernel.shape[2]:
    raise ValueError(f"length {kv_len} exceeds max_len ({kernel.shape[2]}) of the synthesizer")
  logits = jnp.einsum("bihe,hej->bhij", jax.nn.relu(q).astype(jnp.float32),
                      kernel[:, :, :kv_len].astype(jnp.float32))
  return logits + bias[None, :, None, :kv_len].astype(jnp.float32)


def random_synthesizer_logits(r: Array, q_len: int, kv_len: int | None = None) -> Array:
  """B = r[:, :q_len, :kv_len] as float32 [1, H, q_len, kv_len]; r: [H, ℓ, ℓ]."""
  kv_len = q_len if kv_len is None else kv_len
  if r.ndim != 3 or r.shape[1] != r.shape[2]:
    raise ValueError(f"r must be [H, max_len, max_len], got {r.shape}")
  if max(q_len, kv_len) > r.shape[1]:
    raise ValueError(f"length {max(q_len, kv_len)} exceeds max_len ({r.shape[1]}) of the "
                     "synthesizer")
  return r[None, :, :q_len, :kv_len].astype(jnp.float32)


def synthesizer_attention(logits: Array, v: Array, *, is_causal: bool = False,
                          key_value_seq_lengths: Array | None = None,
                          return_weights: bool = False):
  """softmax(logits, over the visible keys) v, per head.

  Args:
    logits: [b|1, H, q_len, kv_len] synthesised logits (`dense_synthesizer_logits`,
      `random_synthesizer_logits`).
    v: [b, kv_len, H, d_v].
    is_causal: query i sees keys j ≤ i.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.
    return_weights: also return the weights [b, H, q_len, kv_len].

  Returns:
    out [b, q_len, H, d_v] in v's dtype, or (out, weights) with return_weights.
  """
  b, kv_len, h, _ = v.shape
  if (logits.ndim != 4 or logits.shape[0] not in (1, b) or logits.shape[1] != h
      or logits.shape[3] != kv_len):
    raise ValueError(f"logits must be [batch|1, H, q_len, kv_len] = [{b}|1, {h}, q_len, {kv_len}], "
                     f"got {logits.shape}")
  q_len = logits.shape[2]
  visible = key_validity(b, kv_len, key_value_seq_lengths)[:, None, None, :]
  if is_causal:
    visible = visible & causal_mask(q_len, kv_len)
  weights = masked_softmax(jnp.broadcast_to(logits, (b, h, q_len, kv_len)), visible)
  out = weighted_values(weights, v).astype(v.dtype)
  return (out, weights) if return_weights else out


class SynthesizerSelfAttention(nn.Module):
  """Multi-head Dense or Random Synthesizer self-attention.

  Parameters: value / out as in `MultiHeadAttention`, and
    dense:  query (the first layer W_1, b_1: [D, H, d], [H, d]), synthesizer_kernel
            W_2 [H, d, max_len], synthesizer_bias b_2 [H, max_len];
    random: random R [H, max_len, max_len], or with rank k random_left A and
            random_right C [H, max_len, k] (R = A Cᵀ).
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D], n ≤ max_len; the weights [b, H, n, n] are sown as
  intermediates/attention_weights. train changes nothing.
  """
  num_heads: int                   # H
  max_len: int                     # ℓ: longest input
  mode: str = "dense"              # "dense" or "random"
  rank: int | None = None          # random mode: k of the factorised R = A Cᵀ (None: full R)
  qkv_features: int | None = None  # H · d (default: D)
  dtype: Any = None                # computation dtype of the projections
  param_dtype: Any = jnp.float32   # parameter dtype

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train  # deterministic
    if self.mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
    check_positive("max_len", self.max_len)
    if self.rank is not None:
      check_positive("rank", self.rank)
    n = x.shape[1]
    if n > self.max_len:
      raise ValueError(f"input length {n} exceeds max_len ({self.max_len}) of the synthesizer")
    init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    if self.mode == "dense":
      q, v = project_heads(x, ("query", "value"), self.num_heads, self.qkv_features, self.dtype,
                           self.param_dtype)
      head_dim = q.shape[-1]
      kernel = self.param("synthesizer_kernel", init, (self.num_heads, head_dim, self.max_len),
                          self.param_dtype)
      bias = self.param("synthesizer_bias", nn.initializers.zeros_init(),
                        (self.num_heads, self.max_len), self.param_dtype)
      logits = dense_synthesizer_logits(q, kernel, bias)
    else:
      (v,) = project_heads(x, ("value",), self.num_heads, self.qkv_features, self.dtype,
                           self.param_dtype)
      if self.rank is None:
        r = self.param("random", init, (self.num_heads, self.max_len, self.max_len),
                       self.param_dtype)[:, :n, :n]
      else:
        shape = (self.num_heads, self.max_len, self.rank)
        left, right = (self.param(name, init, shape, self.param_dtype)[:, :n]
                       for name in ("random_left", "random_right"))
        r = jnp.einsum("hik,hjk->hij", left, right)
      logits = random_synthesizer_logits(r, n)
    out, weights = synthesizer_attention(logits, v, is_causal=is_causal,
                                         key_value_seq_lengths=key_value_seq_lengths,
                                         return_weights=True)
    self.sow("intermediates", "attention_weights", weights)
    return merge_heads(out, x.shape[-1], self.dtype, self.param_dtype)
