"""Dense attention: materialise the [q_len, kv_len] weights (returned for heatmaps).

The softmax runs in float32 whatever the input dtype, and a query with no visible key gets
all-zero weights (not NaN, in the forward pass or the gradient); `dense_attention` gives
the equations and the grouped heads' layout.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def masked_softmax(logits: Array, visible: Array | None) -> Array:
  """Softmax over the last axis restricted to `visible`; rows with nothing visible -> 0.

  logits: float32 [..., kv_len]; visible: bool broadcastable to logits, or None.
  Masked logits become the most negative float, so exp gives exactly 0 beside any
  visible key, and jax.nn.softmax's custom JVP keeps only the output for the backward
  pass; a row with nothing visible is uniform there and then zeroed, with finite grads.
  """
  if visible is None:
    return jax.nn.softmax(logits, axis=-1)
  weights = jax.nn.softmax(jnp.where(visible, logits, jnp.finfo(logits.dtype).min), axis=-1)
  return jnp.where(visible, weights, 0.0)


def split_heads(q: Array, num_kv_heads: int) -> Array:
  """[b, t, H, d] -> [b, t, H_kv, G, d] for grouped-query attention."""
  b, t, h, d = q.shape
  return q.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def group_broadcast(x: Array | None, num_kv_heads: int) -> Array | None:
  """A mask or bias [b|1, H|1, ...] -> [b|1, H_kv|1, G|1, ...] matching split heads."""
  if x is None:
    return None
  if x.shape[1] == 1:
    return x[:, :, None]
  return x.reshape(x.shape[:1] + (num_kv_heads, x.shape[1] // num_kv_heads) + x.shape[2:])


def attention_logits(q: Array, k: Array, scale: float) -> Array:
  """q [b, q, H_kv, G, d], k [b, k, H_kv, d] -> float32 logits [b, H_kv, G, q, k]."""
  return jnp.einsum("bqhgd,bkhd->bhgqk", q, k, preferred_element_type=jnp.float32) * scale


def weighted_values(weights: Array, v: Array) -> Array:
  """Σ_k weights[b, h, q, k] v[b, k, ⌊h / G⌋, :]: weights [b, H, q, k], v [b, k, H_kv, d_v].

  Returns [b, q, H, d_v] in float32.
  """
  b, h, q_len, kv_len = weights.shape
  num_kv_heads = v.shape[2]
  grouped = weights.reshape(b, num_kv_heads, h // num_kv_heads, q_len, kv_len)
  out = jnp.einsum("bhgqk,bkhd->bqhgd", grouped.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(b, q_len, h, v.shape[-1])


def dense_attention(q: Array, k: Array, v: Array, *, scale: float, bias: Array | None,
                    visible: Array | None) -> tuple[Array, Array]:
  """Attention with explicit weights.

    logits = q kᵀ · scale + bias,   weights = softmax over the visible keys,   out = weights v

  Grouped heads: q has H heads, k and v have H_kv heads with H = H_kv · G; query head
  h_kv · G + g reads key/value head h_kv (the layout of `jax.nn.dot_product_attention`).

  Args:
    q: [batch, q_len, H, d]; k, v: [batch, kv_len, H_kv, d] (H_kv divides H).
    scale: multiplies q kᵀ.
    bias: [batch|1, H|1, q_len, kv_len] added to the logits, or None.
    visible: bool [batch|1, H|1, q_len, kv_len], or None (all visible).

  Returns:
    out [batch, q_len, H, d_v] in q's dtype, weights float32 [batch, H, q_len, kv_len].
  """
  num_kv_heads = k.shape[2]
  qg = split_heads(q, num_kv_heads)
  logits = attention_logits(qg, k, scale)
  if bias is not None:
    logits = logits + group_broadcast(bias, num_kv_heads).astype(jnp.float32)
  weights = masked_softmax(logits, group_broadcast(visible, num_kv_heads))
  b, q_len, h, _ = q.shape
  weights = weights.reshape(b, h, q_len, -1)
  return weighted_values(weights, v).astype(q.dtype), weights
