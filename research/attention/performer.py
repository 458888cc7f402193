"""Performer attention: FAVOR+ (Choromanski et al. 2021, "Rethinking attention with
Performers").

Softmax's kernel exp(q·k / √d) is estimated without bias by positive orthogonal random
features, and the attention is then linear attention with these features
(`linear.kernelized_attention`, causal or not): O(n) in the length.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention.heads import (
  HeadsSelfAttention,
  checked_qkv,
  key_validity,
  module_key,
)
from research.attention.linear import check_causal_form, kernelized_attention
from research.errors import check_positive

Array = jax.Array


def gram_schmidt(g: Array) -> Array:
  """Q [d, d] with orthonormal columns and g = Q R, R upper triangular with a positive
  diagonal (the QR factor that makes Q Haar-distributed for Gaussian g): modified
  Gram–Schmidt, each column orthogonalised twice for float32 accuracy. Plain jnp operations,
  no LAPACK call (a training step holding LAPACK's QR hung twice on the 2-core CPU, jax
  0.10.2, every XLA thread idle), so any device compiles it, compile-only ones included."""
  def column(j, q):
    g_j = g[:, j]
    for _ in range(2):                                   # columns ≥ j of q are still zero
      g_j = g_j - q @ (q.T @ g_j)
    return q.at[:, j].set(g_j / jnp.linalg.norm(g_j))
  return jax.lax.fori_loop(0, g.shape[-1], column, jnp.zeros_like(g))


def orthogonal_random_features(key: Array, num_features: int, head_dim: int) -> Array:
  """W [num_features, head_dim]: blocks of head_dim orthonormal rows, row f scaled to ‖g_f‖
  with g_f ~ N(0, I) drawn independently (the last block keeps its first rows).

  FAVOR+'s estimate is unbiased for rows w_f ~ N(0, I_d); drawn orthogonal ("positive
  orthogonal random features": Gram–Schmidt on a Gaussian matrix, each row rescaled to the
  norm of an independent N(0, I_d) vector) each row is still N(0, I_d) distributed and the
  estimate's variance falls."""
  check_positive("num_features", num_features)
  check_positive("head_dim", head_dim)
  blocks = -(-num_features // head_dim)
  block_key, norm_key = jax.random.split(key)

  def orthonormal_rows(k):
    return gram_schmidt(jax.random.normal(k, (head_dim, head_dim), jnp.float32)).T

  rows = jax.vmap(orthonormal_rows)(jax.random.split(block_key, blocks))
  rows = rows.reshape(blocks * head_dim, head_dim)[:num_features]
  norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, head_dim)), axis=-1)
  return norms[:, None] * rows


def favor_features(x: Array, projection: Array, *, is_query: bool,
                   valid: Array | None = None) -> Array:
  """φ(x) = exp(W x̂ − ‖x̂‖²/2 − c) / √m with x̂ = x / d^{1/4}: [b, n, H, d] -> [b, n, H, m].

  c: per query, its maximum exponent; for keys, the maximum over the real keys
  (valid [b, n], True = real) and features of each (batch, head). c has no gradient: both
  shifts cancel in attention's ratio (as constants), so the features are exact and the
  causal form stays causal.
  """
  x = x.astype(jnp.float32) * x.shape[-1] ** -0.25
  exponent = (jnp.einsum("bnhd,md->bnhm", x, projection.astype(jnp.float32))
              - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True))
  if is_query:
    shift = jnp.max(exponent, axis=-1, keepdims=True)
  else:
    real = exponent if valid is None else jnp.where(valid[:, :, None, None], exponent, -jnp.inf)
    shift = jnp.max(real, axis=(1, 3), keepdims=True)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)     # a row with no real key
  return jnp.exp(exponent - jax.lax.stop_gradient(shift)) / math.sqrt(projection.shape[0])


def favor_attention(q: Array, k: Array, v: Array, projection: Array, *, is_causal: bool = False,
                    causal_form: str = "chunked", chunk_size: int = 64,
                    key_value_seq_lengths: Array | None = None) -> Array:
  """FAVOR+ attention, an unbiased estimate of softmax(q kᵀ / √d) v: the linear attention
  of `linear.kernelized_attention` with positive random features (`favor_features`),

    φ(x) = exp(W x̂ − ‖x̂‖²/2) / √m,  x̂ = x / d^{1/4}:   E[φ(q)·φ(k)] = exp(q·k / √d)

  Args:
    q: [b, q_len, H, d]; k: [b, kv_len, H, d]; v: [b, kv_len, H, d_v].
    projection: W [m, d], e.g. `orthogonal_random_features(key, m, d)`.
    is_causal: query i sees keys j ≤ i (q_len = kv_len).
    causal_form: "scan" or "chunked" running sums (`linear.kernelized_attention`).
    chunk_size: C of the chunked form.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.

  Returns:
    [b, q_len, H, d_v] in q's dtype.
  """
  q, k, v = checked_qkv(q, k, v, same_length=is_causal)
  projection = jnp.asarray(projection)
  if projection.ndim != 2 or projection.shape[1] != q.shape[-1]:
    raise ValueError(f"projection must be [num_features, head_dim = {q.shape[-1]}], "
                     f"got {projection.shape}")
  valid = key_validity(k.shape[0], k.shape[1], key_value_seq_lengths)
  out = kernelized_attention(favor_features(q, projection, is_query=True),
                             favor_features(k, projection, is_query=False, valid=valid), v,
                             is_causal=is_causal, causal_form=causal_form,
                             chunk_size=chunk_size, key_valid=valid)
  return out.astype(q.dtype)


class PerformerSelfAttention(HeadsSelfAttention):
  """Multi-head self-attention with FAVOR+ (`favor_attention`) in each head.

  Parameters: query / key / value / out as in `MultiHeadAttention`; the projection W
  [num_features, d] is no parameter. It is drawn from a key fixed by `seed` and the
  module's path (each layer its own, the same at every call), or, with redraw=True and
  train=True, afresh at each call from the PRNG stream "attention". Either is computed
  inside the step (`gram_schmidt`, d steps of d × d products per block of d rows).
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D].
  """
  num_heads: int                   # H
  num_features: int = 256          # m, random features per head
  redraw: bool = False             # draw W anew at each training call (stream "attention")
  seed: int = 0                    # seed of the fixed W
  causal_form: str = "chunked"     # causal running sums: "scan" or "chunked"
  chunk_size: int = 64             # C of the chunked form

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    check_positive("num_features", self.num_features)
    check_causal_form(self.causal_form, self.chunk_size)
    q, k, v = self.project(x, ("query", "key", "value"))
    if self.redraw and train:
      projection = orthogonal_random_features(self.make_rng("attention"), self.num_features,
                                              q.shape[-1])
    else:
      projection = orthogonal_random_features(module_key(self.seed, self), self.num_features,
                                              q.shape[-1])
    out = favor_attention(q, k, v, projection, is_causal=is_causal,
                          causal_form=self.causal_form, chunk_size=self.chunk_size,
                          key_value_seq_lengths=key_value_seq_lengths)
    return self.merge(out, x.shape[-1])
