"""Sparse Sinkhorn attention (Tay et al. 2020): blocks of keys softly sorted by a learned
Sinkhorn-normalised permutation, then attended locally.

Each query attends to its own block of keys and to one block of sorted keys, a soft
permutation of the blocks that a sorting network and Sinkhorn balancing make: memory
O(n·b + N²) per head for N blocks of b positions (`sinkhorn_attention`).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.attention.dense import masked_softmax
from research.attention.heads import (
  HeadsSelfAttention,
  checked_qkv,
  key_validity,
  pad_length,
)
from research.errors import check_positive

Array = jax.Array
_MASKED = -1e9  # log-weight of a forbidden (i, j): exp gives exactly 0


def sinkhorn_normalize(log_alpha: Array, allowed: Array, *, iterations: int,
                       is_causal: bool = False) -> Array:
  """Soft permutation P [..., N, N] from log-scores [..., N, N] by Sinkhorn balancing.

  allowed: bool broadcastable to log_alpha; P is 0 elsewhere, and rows / columns with no
  allowed entry stay 0. Each iteration normalises the rows, then the columns (causal:
  entry (i, j) over the rows i' ≤ i only). Computed in float32.
  """
  check_positive("iterations", iterations)

  def iteration(_, x):
    x = jnp.where(allowed, x - jax.nn.logsumexp(x, axis=-1, keepdims=True), _MASKED)
    columns = (lax.cumlogsumexp(x, axis=x.ndim - 2) if is_causal
               else jax.nn.logsumexp(x, axis=-2, keepdims=True))
    return jnp.where(allowed, x - columns, _MASKED)

  x = lax.fori_loop(0, iterations, iteration,
                    jnp.where(allowed, log_alpha.astype(jnp.float32), _MASKED))
  return jnp.where(allowed, jnp.exp(x), 0.0)


def check_sinkhorn_sizes(max_len: int, block_size: int) -> None:
  """ValueError unless blocks of `block_size` fit inputs of up to `max_len` positions: a
  longer block would only pad every input to it (`SinkhornSelfAttention`)."""
  check_positive("max_len", max_len)
  check_positive("block_size", block_size)
  if block_size > max_len:
    raise ValueError(f"block_size={block_size} must be at most the longest input, "
                     f"max_len={max_len} (a longer block is all padding)")


def _blocks(x: Array, block_size: int) -> Array:
  """[b, n, ...] -> [b, n / block_size, block_size, ...]."""
  return x.reshape(x.shape[0], x.shape[1] // block_size, block_size, *x.shape[2:])


def sinkhorn_attention(q: Array, k: Array, v: Array, sort_kernel: Array, sort_bias: Array, *,
                       block_size: int, is_causal: bool = False, iterations: int = 5,
                       temperature: float = 0.75, key_value_seq_lengths: Array | None = None,
                       rng: Array | None = None, return_permutation: bool = False):
  """Sparse Sinkhorn attention.

  The length n is cut into N = n / b blocks of b positions. Per head, a sorting network
  scores every block j for each block i from a summary of block i's keys,

    s_i = Σ_{t ∈ block i} k_t   (causal: s_i = k_{i·b}, the block's first key)
    R_ij = s_i · w_j + c_j      (w [d, N_max], c [N_max]: the SortNet; N ≤ N_max)

  and Sinkhorn balancing turns R into a soft permutation P: from L = (R + g) / τ (g Gumbel
  noise when a PRNG key is given, else 0), `iterations` times

    L_ij ← L_ij − log Σ_j' exp L_ij'   (rows),   L_ij ← L_ij − log Σ_i' exp L_i'j   (columns)

  and P = exp L. The sorted keys and values of block i are K̃_i = Σ_j P_ij K_j and
  Ṽ_i = Σ_j P_ij V_j [b, d]; a query t of block i attends, in one softmax, to its own
  block's b keys and to the b sorted ones:

    out_t = softmax([q_t K_iᵀ, q_t K̃_iᵀ] / √d, over the visible ones) [V_i; Ṽ_i]

  Causal: P_ij is kept to blocks j < i only, wholly in the past (block 0 gets no sorted
  keys); rows normalise over those j and columns over the rows i' ≤ i only (causal Sinkhorn
  balancing: L_ij ← L_ij − log Σ_{i' ≤ i} exp L_i'j), and own-block keys are seen up to t.
  Padding keys (key_value_seq_lengths) are left out of the summaries, zero in K̃ and Ṽ, and
  never attended; a block with no real key gets P_ij = 0, and a sorted key is visible when
  some real key went into it. Memory O(n·b + N²) per head.

  Args:
    q, k: [b, n, H, d]; v: [b, n, H, d_v]; n a multiple of block_size.
    sort_kernel: w [H, d, N_max]; sort_bias: c [H, N_max], with N = n / block_size ≤ N_max.
    block_size: b, positions per block.
    is_causal: query t sees keys ≤ t only.
    iterations: Sinkhorn iterations (row and column normalisation each).
    temperature: τ > 0 dividing the sort logits.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.
    rng: a PRNG key for Gumbel noise on the sort logits (Gumbel-Sinkhorn); None: none.
    return_permutation: also return P [b, H, N, N].

  Returns:
    out [b, n, H, d_v] in q's dtype, or (out, P) with return_permutation.
  """
  q, k, v = checked_qkv(q, k, v, same_length=True)
  check_positive("block_size", block_size)
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")
  b, n, h, d = q.shape
  if n % block_size:
    raise ValueError(f"length {n} must be a multiple of block_size ({block_size})")
  blocks = n // block_size
  if (sort_kernel.ndim != 3 or sort_kernel.shape[:2] != (h, d)
      or sort_bias.shape != (h, sort_kernel.shape[2])):
    raise ValueError(f"sort_kernel must be [H, d, N_max] = [{h}, {d}, N_max] and sort_bias "
                     f"[H, N_max]; got {sort_kernel.shape} and {sort_bias.shape}")
  if blocks > sort_kernel.shape[2]:
    raise ValueError(f"{blocks} blocks of {block_size} exceed the sort network's N_max "
                     f"({sort_kernel.shape[2]})")
  valid = _blocks(key_validity(b, n, key_value_seq_lengths), block_size)     # [b, N, c]
  qb, kb, vb = (_blocks(x.astype(jnp.float32), block_size) for x in (q, k, v))
  kb, vb = (jnp.where(valid[..., None, None], x, 0.0) for x in (kb, vb))

  # Sort network and Sinkhorn balancing: P [b, H, N, N]
  summary = kb[:, :, 0] if is_causal else jnp.sum(kb, axis=2)               # [b, N, H, d]
  logits = (jnp.einsum("bihd,hdj->bhij", summary, sort_kernel[:, :, :blocks].astype(jnp.float32))
            + sort_bias[None, :, None, :blocks].astype(jnp.float32))
  if rng is not None:
    logits = logits + jax.random.gumbel(rng, logits.shape, jnp.float32)
  allowed = jnp.any(valid, axis=-1)[:, None, None, :]                          # [b, 1, 1, N]
  if is_causal:
    allowed = allowed & jnp.tri(blocks, k=-1, dtype=bool)
  permutation = sinkhorn_normalize(logits / temperature, allowed, iterations=iterations,
                                   is_causal=is_causal)

  # Own block and sorted block, one softmax over their 2b keys
  sorted_k = jnp.einsum("bhij,bjshd->bishd", permutation, kb)
  sorted_v = jnp.einsum("bhij,bjshd->bishd", permutation, vb)
  sorted_valid = jnp.einsum("bhij,bjs->bhis", permutation, valid.astype(jnp.float32)) > 0
  scale = 1.0 / math.sqrt(d)
  own = jnp.einsum("bithd,bishd->bhits", qb, kb) * scale                       # [b, H, N, c, c]
  own_visible = valid[:, None, :, None, :]
  if is_causal:
    own_visible = own_visible & jnp.tri(block_size, dtype=bool)
  weights = masked_softmax(
      jnp.concatenate([own, jnp.einsum("bithd,bishd->bhits", qb, sorted_k) * scale], axis=-1),
      jnp.concatenate([jnp.broadcast_to(own_visible, own.shape),
                       jnp.broadcast_to(sorted_valid[:, :, :, None, :], own.shape)], axis=-1))
  out = (jnp.einsum("bhits,bishd->bithd", weights[..., :block_size], vb)
         + jnp.einsum("bhits,bishd->bithd", weights[..., block_size:], sorted_v))
  out = out.reshape(b, n, h, v.shape[-1]).astype(q.dtype)
  return (out, permutation) if return_permutation else out


class SinkhornSelfAttention(HeadsSelfAttention):
  """Multi-head self-attention with `sinkhorn_attention` in each head.

  Parameters: query / key / value / out as in `MultiHeadAttention`, and the sort network
  sort_kernel [H, d, N_max], sort_bias [H, N_max] with N_max = ⌈max_len / block_size⌉.
  An input whose length is no multiple of block_size is padded at the end (padding keys,
  never attended) and cut back. With gumbel_noise and train=True the sort logits get
  Gumbel noise from the PRNG stream "attention".
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D], n ≤ max_len; P [b, H, N, N] is sown as intermediates/sinkhorn_permutation.
  """
  num_heads: int                   # H
  max_len: int                     # longest input (sets the sort network's N_max)
  block_size: int = 64             # b, positions per block
  iterations: int = 5              # Sinkhorn iterations
  temperature: float = 0.75        # τ dividing the sort logits
  gumbel_noise: bool = False       # Gumbel-Sinkhorn noise in training (stream "attention")

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    check_sinkhorn_sizes(self.max_len, self.block_size)
    n = x.shape[1]
    if n > self.max_len:
      raise ValueError(f"input length {n} exceeds max_len ({self.max_len}) of the sort network")
    padded, lengths = pad_length(x, key_value_seq_lengths, self.block_size)
    q, k, v = self.project(padded, ("query", "key", "value"))
    max_blocks = -(-self.max_len // self.block_size)
    kernel = self.param("sort_kernel", nn.initializers.lecun_normal(in_axis=-2, out_axis=-1,
                                                                    batch_axis=(0,)),
                        (self.num_heads, q.shape[-1], max_blocks), self.param_dtype)
    bias = self.param("sort_bias", nn.initializers.zeros_init(), (self.num_heads, max_blocks),
                      self.param_dtype)
    rng = self.make_rng("attention") if self.gumbel_noise and train else None
    out, permutation = sinkhorn_attention(
        q, k, v, kernel, bias, block_size=self.block_size, is_causal=is_causal,
        iterations=self.iterations, temperature=self.temperature, key_value_seq_lengths=lengths,
        rng=rng, return_permutation=True)
    self.sow("intermediates", "sinkhorn_permutation", permutation)
    return self.merge(out[:, :n], x.shape[-1])
