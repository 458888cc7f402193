"""Synthesizer attention (Tay et al. 2021, "Synthesizer: Rethinking self-attention for
transformer models"): the weights are synthesised without query-key dot products.

Dense: each token's row of logits from the token alone, by a two-layer MLP; Random: a
learned matrix independent of the input (or a low-rank one). The weights are n × n, as in
full attention, or made a block of queries at a time for memory O(block · n).
"""

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.attention.dense import masked_softmax, weighted_values
from research.attention.heads import (
  HeadsSelfAttention,
  key_validity,
)
from research.errors import check_choice, check_positive

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


def synthesizer_attention(logits: Array, v: Array, *, is_causal: bool = False,
                          key_value_seq_lengths: Array | None = None, q_start=0,
                          return_weights: bool = False):
  """softmax(logits, over the visible keys) v, per head.

  Args:
    logits: [b|1, H, q_len, kv_len] synthesised logits (`dense_synthesizer_logits`, or
      R_h[:q_len, :kv_len] of the random synthesizer).
    v: [b, kv_len, H, d_v].
    is_causal: query i sees keys j ≤ q_start + i.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.
    q_start: position of the first query (an int or a traced scalar).
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
    visible = visible & (jnp.arange(kv_len) <= q_start + jnp.arange(q_len)[:, None])
  weights = masked_softmax(jnp.broadcast_to(logits, (b, h, q_len, kv_len)), visible)
  out = weighted_values(weights, v).astype(v.dtype)
  return (out, weights) if return_weights else out


def synthesizer_attention_in_blocks(rows: Array, to_logits: Callable[[Array], Array], v: Array,
                                    *, block_size: int, is_causal: bool = False,
                                    key_value_seq_lengths: Array | None = None) -> Array:
  """`synthesizer_attention` a block of queries at a time, memory O(block_size · kv_len).

  Args:
    rows: what the logits are made of, its axis 1 running over the q_len queries (q
      [b, q_len, H, d] of the dense synthesizer, R [H, q_len, kv_len] of the random one).
    to_logits: a block of rows (block_size along axis 1) -> its logits
      [b|1, H, block_size, kv_len]; recomputed in the backward pass.
    v: [b, kv_len, H, d_v].
    block_size: queries per block (q_len need not be a multiple).
    is_causal, key_value_seq_lengths: as in `synthesizer_attention`.

  Returns:
    [b, q_len, H, d_v] in v's dtype.
  """
  check_positive("block_size", block_size)
  q_len = rows.shape[1]
  rows = jnp.pad(rows, [(0, 0), (0, -q_len % block_size)] + [(0, 0)] * (rows.ndim - 2))

  @jax.checkpoint
  def block(start):
    logits = to_logits(lax.dynamic_slice_in_dim(rows, start, block_size, axis=1))
    return synthesizer_attention(logits, v, is_causal=is_causal, q_start=start,
                                 key_value_seq_lengths=key_value_seq_lengths)

  out = lax.map(block, jnp.arange(0, rows.shape[1], block_size))    # [blocks, b, c, H, d_v]
  b, _, h, d_v = v.shape
  return jnp.moveaxis(out, 0, 1).reshape(b, -1, h, d_v)[:, :q_len]


class SynthesizerSelfAttention(HeadsSelfAttention):
  """Multi-head Dense or Random Synthesizer self-attention.

    Dense    B_h[i, :] = relu(x_i W_1^h + b_1^h) W_2^h + b_2^h     (each token its own row;
             x_i W_1^h + b_1^h is head h's query projection q_i^h [d], W_2^h [d, ℓ])
    Random   B_h = R_h [ℓ, ℓ], a learned matrix independent of the input, or R_h = A_h C_hᵀ
             with A_h, C_h [ℓ, k] (factorised random)

    out_h = softmax(B_h[:n, :n], over the visible keys) v_h

  with ℓ the longest length (max_len): an input of length n uses the first n rows and
  columns. Causal attention and padding keys mask the synthesised logits as they would
  q·k logits; a query with no visible key returns zeros.

  Parameters: value / out as in `MultiHeadAttention`, and
    dense:  query (the first layer W_1, b_1: [D, H, d], [H, d]), synthesizer_kernel
            W_2 [H, d, max_len], synthesizer_bias b_2 [H, max_len];
    random: random R [H, max_len, max_len], or with rank k random_left A and
            random_right C [H, max_len, k] (R = A Cᵀ).
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D], n ≤ max_len. With query_block=None the weights [b, H, n, n] are
  materialised and sown as intermediates/attention_weights; with query_block=c they are
  made c queries at a time (`synthesizer_attention_in_blocks`), memory O(c·n).
  train changes nothing.
  """
  num_heads: int                   # H
  max_len: int                     # ℓ: longest input
  mode: str = "dense"              # "dense" or "random"
  rank: int | None = None          # random mode: k of the factorised R = A Cᵀ (None: full R)
  query_block: int | None = None   # queries per block (None: all at once, weights sown)

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train  # deterministic
    check_choice("mode", self.mode, MODES)
    check_positive("max_len", self.max_len)
    for name in ("rank", "query_block"):
      if getattr(self, name) is not None:
        check_positive(name, getattr(self, name))
    n = x.shape[1]
    if n > self.max_len:
      raise ValueError(f"input length {n} exceeds max_len ({self.max_len}) of the synthesizer")
    init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    # rows: what a query's logits are made of (axis 1); to_logits: rows -> [b|1, H, rows, n]
    if self.mode == "dense":
      rows, v = self.project(x, ("query", "value"))
      kernel = self.param("synthesizer_kernel", init,
                          (self.num_heads, rows.shape[-1], self.max_len), self.param_dtype)
      bias = self.param("synthesizer_bias", nn.initializers.zeros_init(),
                        (self.num_heads, self.max_len), self.param_dtype)
      to_logits = lambda rows: dense_synthesizer_logits(rows, kernel, bias, n)
    else:
      (v,) = self.project(x, ("value",))
      if self.rank is None:
        rows = self.param("random", init, (self.num_heads, self.max_len, self.max_len),
                          self.param_dtype)[:, :n, :n]
        to_logits = lambda rows: rows[None].astype(jnp.float32)
      else:
        shape = (self.num_heads, self.max_len, self.rank)
        rows, right = (self.param(name, init, shape, self.param_dtype)[:, :n]
                       for name in ("random_left", "random_right"))
        to_logits = lambda rows: jnp.einsum("hik,hjk->hij", rows, right,
                                            preferred_element_type=jnp.float32)[None]
    pattern = dict(is_causal=is_causal, key_value_seq_lengths=key_value_seq_lengths)
    if self.query_block is None:
      out, weights = synthesizer_attention(to_logits(rows), v, return_weights=True, **pattern)
      self.sow("intermediates", "attention_weights", weights)
    else:
      out = synthesizer_attention_in_blocks(rows, to_logits, v, block_size=self.query_block,
                                            **pattern)
    return self.merge(out, x.shape[-1])
