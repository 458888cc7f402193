"""Reformer's LSH attention (Kitaev et al. 2020, "Reformer: the efficient transformer").

Queries and keys are shared and hashed into buckets by random rotations (angular LSH);
sorted by bucket and cut into chunks, each query attends only within its chunk and the one
before, in several hash rounds: memory O(R·n·c) per head instead of O(n²). It follows the
authors' trax implementation, as reformer-pytorch and transformers do (`lsh_attention`).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.attention.heads import (
  HeadsSelfAttention,
  checked_qkv,
  key_validity,
  module_key,
  pad_length,
)
from research.errors import check_positive

Array = jax.Array
SELF_LOGIT = -1e5   # the logit of a token for itself (the paper's 10⁵ penalty)
INT32_MAX = 2**31 - 1


def check_lsh_sizes(length: int, chunk_size: int, num_hashes: int,
                    num_buckets: int | None = None) -> None:
  """ValueError unless LSH attention over `length` positions runs: positive sizes, and the
  sort keys (round · (nb + 1) + bucket) · n + t of `lsh_attention` within int32 for the
  length n padded to a multiple of the chunk (of 2 · chunk_size, and nb = n / chunk_size,
  when num_buckets is None: `LSHSelfAttention`)."""
  check_positive("chunk_size", chunk_size)
  check_positive("num_hashes", num_hashes)
  multiple = chunk_size * (2 if num_buckets is None else 1)
  padded = -(-length // multiple) * multiple
  buckets = num_buckets or padded // chunk_size
  per_round = (buckets + 1) * padded
  if per_round > INT32_MAX + 1:
    raise ValueError(f"{length} positions (padded to {padded}, chunk_size={chunk_size}) in "
                     f"{buckets} buckets need sort keys up to (buckets + 1) · length = "
                     f"{per_round:,} in a single round, beyond int32; make them fewer")
  if num_hashes * per_round > INT32_MAX + 1:
    raise ValueError(f"num_hashes={num_hashes} rounds of {buckets} buckets over {padded} "
                     f"positions need sort keys up to num_hashes · (buckets + 1) · length = "
                     f"{num_hashes * per_round:,}, beyond int32; at most "
                     f"{(INT32_MAX + 1) // per_round:,} rounds there")


def lsh_rotations(key: Array, head_dim: int, num_buckets: int, num_hashes: int) -> Array:
  """Random rotations A [num_hashes, head_dim, num_buckets / 2] with N(0, 1) entries."""
  check_positive("num_hashes", num_hashes)
  if not isinstance(num_buckets, int) or num_buckets < 2 or num_buckets % 2:
    raise ValueError(f"num_buckets must be an even int ≥ 2, got {num_buckets!r}")
  return jax.random.normal(key, (num_hashes, head_dim, num_buckets // 2), jnp.float32)


def lsh_buckets(x: Array, rotations: Array) -> Array:
  """h_r(x_t) = argmax([x_t A_r ; −x_t A_r]): x [b, n, H, d] -> int [b, H, R, n]."""
  rotated = jnp.einsum("bnhd,rdk->bhrnk", x.astype(jnp.float32), rotations.astype(jnp.float32))
  return jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1)


def _gather(x: Array, index: Array) -> Array:
  """x [b, H, n, f] at index [b, H, L] -> [b, H, L, f]."""
  return jnp.take_along_axis(x, index[..., None], axis=2)


def lsh_attention(qk: Array, v: Array, rotations: Array, *, chunk_size: int,
                  is_causal: bool = False, key_value_seq_lengths: Array | None = None) -> Array:
  """LSH self-attention with shared queries and keys.

  One projection x W_qk gives q, and the keys are the unit vectors k̂ = q / ‖q‖. Each of R
  hash rounds r draws a random rotation A_r [d, nb/2] and puts a position in bucket

    h_r(x) = argmax([x A_r ; −x A_r])  ∈ {0 … nb − 1}   (angular LSH)

  The R·n pairs (round r, position t) are sorted by (r, h_r(q_t), t) into one sequence,
  cut into chunks of c, and each chunk attends to itself and the chunk before it (the
  first chunk to the last: the sequence wraps around). A query occurrence i sees the
  candidate keys j of those 2c slots with

    logit_ij = q_i · k̂_j / √d,   −10⁵ when j is i itself (a token attends to itself only
    when it has nothing else), excluded when j is padding (or after i, when causal)

  and gives, per round, o_r = Σ_j softmax_j(logit_ij) v_j and z_r = log Σ_j exp(logit_ij).
  The rounds of a query combine with weights softmax_r(z_r):

    out = Σ_r exp(z_r − log Σ_r' exp z_r') o_r

  This is the authors' trax implementation, which reformer-pytorch and transformers
  follow: keys of another bucket inside the 2c slots are attended as well, and a pair met in
  two rounds counts twice. One change: padding positions (t ≥ key_value_seq_lengths) go
  to an extra last bucket nb in every round instead of being hashed, so they never take a
  real token's place in a chunk, and what the padding holds cannot change a real output.
  A query with no candidate in any round returns zeros. Memory is O(R·n·c) per head
  instead of O(n²).

  Causal: a query never attends to a later position, and its output has no gradient to
  later inputs; which earlier keys share its chunk still depends on the buckets of the
  whole sequence (the sort is global), as in the paper.

  Args:
    qk: [b, n, H, d] queries, whose unit vectors are the keys; v: [b, n, H, d_v].
    rotations: A [R, d, nb/2] (`lsh_rotations`): R hash rounds into nb buckets.
    chunk_size: c; n must be a multiple.
    is_causal: query t sees keys ≤ t only.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.

  Returns:
    [b, n, H, d_v] in qk's dtype.
  """
  qk, _, v = checked_qkv(qk, qk, v, same_length=True)
  check_positive("chunk_size", chunk_size)
  b, n, h, d = qk.shape
  rotations = jnp.asarray(rotations)
  if rotations.ndim != 3 or rotations.shape[1] != d:
    raise ValueError(f"rotations must be [num_hashes, head_dim = {d}, num_buckets / 2], "
                     f"got {rotations.shape}")
  if n % chunk_size:
    raise ValueError(f"length {n} must be a multiple of chunk_size ({chunk_size})")
  rounds, num_buckets = rotations.shape[0], 2 * rotations.shape[2]
  check_lsh_sizes(n, chunk_size, rounds, num_buckets)
  valid = key_validity(b, n, key_value_seq_lengths)                          # [b, n]

  # Sort the R·n occurrences by (round, bucket, position), padding in a last bucket nb
  buckets = jnp.where(valid[:, None, None, :], lsh_buckets(qk, rotations), num_buckets)
  rank = ((jnp.arange(rounds)[:, None] * (num_buckets + 1) + buckets) * n + jnp.arange(n))
  order = jnp.argsort(rank.reshape(b, h, rounds * n), axis=-1)               # [b, H, L]
  position = order % n
  q = jnp.moveaxis(qk, 1, 2).astype(jnp.float32)                             # [b, H, n, d]
  # k̂ = q / ‖q‖, and 0 for q = 0 (a padded position's), with a finite gradient there
  keys = q * lax.rsqrt(jnp.maximum(jnp.sum(q * q, axis=-1, keepdims=True), 1e-24))
  values = jnp.moveaxis(v, 1, 2).astype(jnp.float32)

  # Chunks of c occurrences; each sees itself and the chunk before (cyclically)
  chunks = rounds * n // chunk_size

  def chunked(x):                                                            # [b, H, L, ...]
    return x.reshape(b, h, chunks, chunk_size, *x.shape[3:])

  def with_previous(x):                                                      # slots: 2c
    return jnp.concatenate([x, jnp.roll(x, 1, axis=2)], axis=3) if chunks > 1 else x

  q_pos = chunked(position)
  k_pos = with_previous(q_pos)
  logits = jnp.einsum("bhcid,bhcjd->bhcij", chunked(_gather(q, position)),
                      with_previous(chunked(_gather(keys, position)))) / math.sqrt(d)
  visible = jnp.take_along_axis(jnp.broadcast_to(valid[:, None], (b, h, n)),
                                k_pos.reshape(b, h, -1), axis=-1).reshape(k_pos.shape)
  visible = visible[:, :, :, None, :]                                        # [b, H, C, 1, 2c]
  if is_causal:
    visible = visible & (k_pos[:, :, :, None, :] <= q_pos[..., None])
  logits = jnp.where(q_pos[..., None] == k_pos[:, :, :, None, :], SELF_LOGIT, logits)
  logits = jnp.where(visible, logits, jnp.finfo(jnp.float32).min)
  # Normalised by the sum itself: near −10⁵ (the self logit) float32 is only good to 8·10⁻³
  top = jnp.max(logits, axis=-1, keepdims=True)
  weights = jnp.exp(logits - top)
  total = jnp.sum(weights, axis=-1)                                          # [b, H, C, c]
  out = jnp.einsum("bhcij,bhcje->bhcie", weights / total[..., None],
                   with_previous(chunked(_gather(values, position))))
  lse = top[..., 0] + jnp.log(total)
  seen = jnp.any(jnp.broadcast_to(visible, logits.shape), axis=-1)             # [b, H, C, c]

  # Back to (round, position) order; combine the rounds by softmax_r(z_r)
  undo = jnp.argsort(order, axis=-1)
  out = _gather(out.reshape(b, h, rounds * n, -1), undo).reshape(b, h, rounds, n, -1)
  lse, seen = (_gather(x.reshape(b, h, rounds * n, 1), undo).reshape(b, h, rounds, n)
               for x in (lse, seen))
  weights = jax.nn.softmax(jnp.where(seen, lse, jnp.finfo(jnp.float32).min), axis=2)
  out = jnp.einsum("bhrn,bhrne->bnhe", weights, out)
  return jnp.where(jnp.any(seen, axis=2).transpose(0, 2, 1)[..., None], out, 0.0).astype(qk.dtype)


class LSHSelfAttention(HeadsSelfAttention):
  """Multi-head Reformer self-attention: `lsh_attention` in each head.

  Parameters: query (shared with the keys) / value / out as in `MultiHeadAttention`. The
  rotations are no parameter: drawn from a key fixed by `seed` and the module's path (each
  layer its own, the same at every call), or, with redraw=True and train=True, afresh at
  each call from the PRNG stream "attention". An input whose length is no multiple of the
  chunk (2·chunk_size with num_buckets=None) is padded at the end (padding keys, never
  attended) and cut back.
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D].
  """
  num_heads: int                   # H
  chunk_size: int = 64             # c, occurrences per chunk
  num_buckets: int | None = None   # nb, even (None: padded length / chunk_size)
  num_hashes: int = 2              # R, hash rounds
  redraw: bool = False             # new rotations at each training call (stream "attention")
  seed: int = 0                    # seed of the fixed rotations

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    n = x.shape[1]
    check_lsh_sizes(n, self.chunk_size, self.num_hashes, self.num_buckets)
    multiple = self.chunk_size * (2 if self.num_buckets is None else 1)
    padded, lengths = pad_length(x, key_value_seq_lengths, multiple)
    qk, v = self.project(padded, ("query", "value"))
    key = (self.make_rng("attention") if self.redraw and train
           else module_key(self.seed, self))
    rotations = lsh_rotations(key, qk.shape[-1],
                              self.num_buckets or padded.shape[1] // self.chunk_size,
                              self.num_hashes)
    out = lsh_attention(qk, v, rotations, chunk_size=self.chunk_size, is_causal=is_causal,
                        key_value_seq_lengths=lengths)
    return self.merge(out[:, :n], x.shape[-1])
