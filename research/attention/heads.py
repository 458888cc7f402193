"""What the efficient self-attention modules (linear, performer, synthesizer, sinkhorn,
reformer) share: projections to heads and back, key validity, the length padded to a
multiple of a block, and the fixed key of a module's random draws.
"""

import functools
import zlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention.masks import padding_mask
from research.attention.multi_head import check_heads

Array = jax.Array


class HeadsSelfAttention(nn.Module, kw_only=True):
  """What the efficient self-attention modules are built on: their projections' fields
  (keyword-only, after each module's own) and the projections to heads and back.

  A subclass declares `num_heads: int` (H) and calls `self.project` / `self.merge` from its
  compact `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None,
  train=False) -> [b, n, D]`; the DenseGeneral layers become its children:

    q, k, v = x W_{q,k,v} + b_{q,k,v}   [b, n, H, d]   (DenseGeneral "query", "key", "value")
    y = Σ_h head_h W_o^h + b_o          [b, n, D]      (DenseGeneral "out")

  The parameter names and layouts are those of `MultiHeadAttention`.
  """
  qkv_features: int | None = None  # H · d (default: D)
  dtype: Any = None                # computation dtype of the projections
  param_dtype: Any = jnp.float32   # parameter dtype

  def project(self, x: Array, names: tuple[str, ...]) -> list[Array]:
    """x [b, n, D] -> one [b, n, H, d] per name (d = qkv_features / H, default D / H)."""
    head_dim = check_heads(self.qkv_features or x.shape[-1], self.num_heads)
    dense = functools.partial(nn.DenseGeneral, (self.num_heads, head_dim), dtype=self.dtype,
                              param_dtype=self.param_dtype)
    return [dense(name=name)(x) for name in names]

  def merge(self, heads: Array, features: int) -> Array:
    """[b, n, H, d] -> [b, n, features] through the DenseGeneral "out"."""
    return nn.DenseGeneral(features, axis=(-2, -1), dtype=self.dtype,
                           param_dtype=self.param_dtype, name="out")(heads)


def checked_qkv(q, k, v, *, same_length: bool = False) -> tuple[Array, Array, Array]:
  """(q, k, v) as arrays, once checked: q [b, q_len, H, d], k [b, kv_len, H, d],
  v [b, kv_len, H, d_v], one head count for all (and q_len = kv_len with same_length)."""
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError("q, k, v must be [batch, length, heads, head_dim]; got shapes "
                     f"{q.shape}, {k.shape}, {v.shape}")
  if not (q.shape[0] == k.shape[0] == v.shape[0]) or k.shape[1] != v.shape[1]:
    raise ValueError(f"q, k, v must share the batch, and k, v the length; got {q.shape}, "
                     f"{k.shape}, {v.shape}")
  if not (q.shape[2] == k.shape[2] == v.shape[2]):
    raise ValueError(f"q, k, v must have the same number of heads; got {q.shape[2]}, "
                     f"{k.shape[2]}, {v.shape[2]}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k head_dim differ: {q.shape[-1]} vs {k.shape[-1]}")
  if same_length and q.shape[1] != k.shape[1]:
    raise ValueError(f"q and k must have the same length here; got {q.shape[1]} and {k.shape[1]}")
  return q, k, v


def key_validity(batch: int, kv_len: int, key_value_seq_lengths: Array | None) -> Array:
  """[batch, kv_len] bool: True = a real key (t < length), False = padding."""
  if key_value_seq_lengths is None:
    return jnp.ones((batch, kv_len), bool)
  lengths = jnp.asarray(key_value_seq_lengths)
  if lengths.shape != (batch,):
    raise ValueError(f"key_value_seq_lengths must have shape (batch,) = ({batch},), "
                     f"got {lengths.shape}")
  return padding_mask(lengths, kv_len)


def pad_length(x: Array, key_value_seq_lengths: Array | None, multiple: int
               ) -> tuple[Array, Array]:
  """x [b, n, D] zero-padded at the end to a multiple of `multiple`, and the key lengths
  (n when None) that keep the added positions out of every key set."""
  b, n = x.shape[:2]
  lengths = (jnp.full((b,), n, jnp.int32) if key_value_seq_lengths is None
             else jnp.minimum(jnp.asarray(key_value_seq_lengths), n))
  return jnp.pad(x, ((0, 0), (0, -n % multiple), (0, 0))), lengths


def module_key(seed: int, module: nn.Module) -> Array:
  """A PRNG key fixed by `seed` and the module's path in the model (each layer its own)."""
  path = "/".join(str(name) for name in module.path)
  return jax.random.fold_in(jax.random.key(seed), zlib.crc32(path.encode()))
