"""Exact attention in O(n) memory: query/key blocks with a running max and log-sum-exp.

The [q_len, kv_len] weights are never materialised (a custom VJP recomputes them block by
block in the backward pass), and only the key blocks some query of a block can see are
visited; `chunked_attention` gives the equations.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from research.attention.dense import group_broadcast
from research.attention.masks import Visibility, visit_lists

Array = jax.Array
F32 = jnp.float32


class _Static(NamedTuple):
  scale: float
  q_block: int
  k_block: int
  q_len: int      # before padding
  kv_len: int     # before padding
  pattern: Visibility   # without key lengths: hashable, static

  def visibility(self, kv_lengths) -> Visibility:
    return self.pattern._replace(kv_lengths=kv_lengths)

  def visits(self, padded: tuple[int, int], transpose: bool) -> tuple[Array, Array]:
    """The blocks to visit per query block (per key block when `transpose`) and their
    counts (partial, all), from the static pattern (`masks.visit_lists`)."""
    visits, counts = visit_lists(self.pattern, (self.q_len, self.kv_len), padded,
                                 (self.q_block, self.k_block), transpose)
    return jnp.asarray(visits), jnp.asarray(counts)


def _pad_to(x: Array | None, axis: int, multiple: int) -> Array | None:
  if x is None or x.shape[axis] % multiple == 0:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, -x.shape[axis] % multiple)
  return jnp.pad(x, pad)


def _pad_blocks(x: Array | None, q_block: int, k_block: int) -> Array | None:
  """Pads a [.., q|1, k|1] mask or bias to whole blocks, leaving broadcast axes alone."""
  if x is not None and x.shape[-2] != 1:
    x = _pad_to(x, x.ndim - 2, q_block)
  if x is not None and x.shape[-1] != 1:
    x = _pad_to(x, x.ndim - 1, k_block)
  return x


def _block(x: Array, start, size: int, axis: int) -> Array:
  return lax.dynamic_slice_in_dim(x, start, size, axis)


def _block_2d(x: Array | None, q_start, k_start, s: _Static) -> Array | None:
  """The [.., bq, bk] block of a mask or bias laid out [.., q, k] (broadcast axes kept)."""
  if x is None:
    return None
  x = x if x.shape[-2] == 1 else _block(x, q_start, s.q_block, x.ndim - 2)
  return x if x.shape[-1] == 1 else _block(x, k_start, s.k_block, x.ndim - 1)


def _visible(s: _Static, mask, kv_lengths, q_start, k_start, masked: bool) -> Array | None:
  """bool [b|1, 1|H_kv, 1|G, bq, bk] for one block, or None for a fully visible block."""
  if not masked:
    return None
  vis = s.visibility(kv_lengths)
  keys_padded = s.kv_len % s.k_block != 0
  if vis.sees_everything and not keys_padded:
    visible = None
  else:
    visible = vis.dense(s.q_block, s.k_block, q_start, k_start)
    if keys_padded:
      visible &= (k_start + jnp.arange(s.k_block) < s.kv_len)[None, None, :]
    visible = visible[:, None, None]
  block_mask = _block_2d(mask, q_start, k_start, s)
  if block_mask is None:
    return visible
  return block_mask if visible is None else visible & block_mask


def _logits(s: _Static, q_i, k_j, bias, q_start, k_start) -> Array:
  logits = jnp.einsum("bhgqd,bhkd->bhgqk", q_i, k_j, preferred_element_type=F32) * s.scale
  bias_block = _block_2d(bias, q_start, k_start, s)
  return logits if bias_block is None else logits + bias_block.astype(F32)


def _visit(visits, counts, row, dynamic_mask: bool, body, carry):
  """body(block, carry, masked) over the blocks listed for `row`: masked=True on the
  partially visible ones (all of them when a mask or key lengths apply), False on the
  wholly visible ones."""
  partial, every = counts[row, 0], counts[row, 1]
  if dynamic_mask:
    partial = every
  step = lambda masked: lambda t, c: body(visits[row, t], c, masked)
  carry = lax.fori_loop(0, partial, step(True), carry)
  return lax.fori_loop(partial, every, step(False), carry)


def _forward(s: _Static, q, k, v, bias, mask, kv_lengths):
  """q [b, H_kv, G, Lq, d], k/v [b, H_kv, Lk, d] (padded) -> out, lse."""
  num_q_blocks = q.shape[3] // s.q_block
  visits, counts = s.visits((q.shape[3], k.shape[2]), transpose=False)
  dynamic_mask = mask is not None or kv_lengths is not None

  def query_block(i):
    q_start = i * s.q_block
    q_i = _block(q, q_start, s.q_block, 3)

    def key_block(j, carry, masked):
      m, l, acc = carry
      k_start = j * s.k_block
      k_j, v_j = _block(k, k_start, s.k_block, 2), _block(v, k_start, s.k_block, 2)
      logits = _logits(s, q_i, k_j, bias, q_start, k_start)
      visible = _visible(s, mask, kv_lengths, q_start, k_start, masked)
      masked = logits if visible is None else jnp.where(visible, logits, -jnp.inf)
      m_new = jnp.maximum(m, masked.max(-1))
      shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      p = jnp.exp(masked - shift[..., None])
      correction = jnp.exp(m - shift)
      l = l * correction + p.sum(-1)
      acc = acc * correction[..., None] + jnp.einsum(
          "bhgqk,bhkd->bhgqd", p.astype(v.dtype), v_j, preferred_element_type=F32)
      return m_new, l, acc

    shape = q_i.shape[:-1]
    init = (jnp.full(shape, -jnp.inf, F32), jnp.zeros(shape, F32),
            jnp.zeros(shape + v.shape[-1:], F32))
    m, l, acc = _visit(visits, counts, i, dynamic_mask, key_block, init)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), jnp.inf)
    return out, lse

  out, lse = lax.map(query_block, jnp.arange(num_q_blocks))
  # [nq, b, h, g, bq, ...] -> [b, h, g, nq * bq, ...]
  out = jnp.moveaxis(out, 0, 3).reshape(q.shape[:3] + (-1, v.shape[-1]))
  lse = jnp.moveaxis(lse, 0, 3).reshape(q.shape[:3] + (-1,))
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(s, q, k, v, bias, mask, kv_lengths):
  out, _ = _forward(s, q, k, v, bias, mask, kv_lengths)
  return out.astype(q.dtype)


def _attention_fwd(s, q, k, v, bias, mask, kv_lengths):
  out, lse = _forward(s, q, k, v, bias, mask, kv_lengths)
  out = out.astype(q.dtype)
  return out, (q, k, v, bias, mask, kv_lengths, out, lse)


def _attention_bwd(s, residuals, d_out):
  """Works on transposed blocks sᵀ = k qᵀ [.., bk, bq] so that dv = pᵀ dout and
  dk = dsᵀ q are plain products; only dq = ds k needs a transpose."""
  q, k, v, bias, mask, kv_lengths, out, lse = residuals
  visits, counts = s.visits((q.shape[3], k.shape[2]), transpose=True)
  dynamic_mask = mask is not None or kv_lengths is not None
  delta = jnp.sum(d_out.astype(F32) * out.astype(F32), axis=-1)     # [b, h, g, Lq]
  num_k_blocks = k.shape[2] // s.k_block
  transpose = lambda x: None if x is None else jnp.swapaxes(x, -1, -2)

  def key_block(j, carry):
    d_q, d_k, d_v, d_bias = carry
    k_start = j * s.k_block
    k_j, v_j = _block(k, k_start, s.k_block, 2), _block(v, k_start, s.k_block, 2)

    def query_block(i, carry, masked):
      d_k_j, d_v_j, d_q, d_bias = carry
      q_start = i * s.q_block
      q_i, d_out_i = _block(q, q_start, s.q_block, 3), _block(d_out, q_start, s.q_block, 3)
      logits_t = jnp.einsum("bhkd,bhgqd->bhgkq", k_j, q_i, preferred_element_type=F32) * s.scale
      bias_block = _block_2d(bias, q_start, k_start, s)
      if bias_block is not None:
        logits_t = logits_t + transpose(bias_block).astype(F32)
      visible_t = transpose(_visible(s, mask, kv_lengths, q_start, k_start, masked))
      if visible_t is not None:
        logits_t = jnp.where(visible_t, logits_t, -jnp.inf)
      p_t = jnp.exp(logits_t - _block(lse, q_start, s.q_block, 3)[..., None, :])
      d_v_j += jnp.einsum("bhgkq,bhgqd->bhkd", p_t.astype(d_out.dtype), d_out_i,
                          preferred_element_type=F32)
      d_p_t = jnp.einsum("bhkd,bhgqd->bhgkq", v_j, d_out_i, preferred_element_type=F32)
      d_s_t = p_t * (d_p_t - _block(delta, q_start, s.q_block, 3)[..., None, :])
      d_k_j += jnp.einsum("bhgkq,bhgqd->bhkd", d_s_t.astype(q.dtype), q_i,
                          preferred_element_type=F32) * s.scale
      d_q_i = jnp.einsum("bhgkq,bhkd->bhgqd", d_s_t.astype(k.dtype), k_j,
                         preferred_element_type=F32) * s.scale
      d_q = lax.dynamic_update_slice_in_dim(
          d_q, _block(d_q, q_start, s.q_block, 3) + d_q_i, q_start, 3)
      if d_bias is not None:
        d_bias = _accumulate_bias_grad(d_bias, transpose(d_s_t), q_start, k_start)
      return d_k_j, d_v_j, d_q, d_bias

    init = (jnp.zeros(k_j.shape, F32), jnp.zeros(v_j.shape, F32), d_q, d_bias)
    d_k_j, d_v_j, d_q, d_bias = _visit(visits, counts, j, dynamic_mask, query_block, init)
    d_k = lax.dynamic_update_slice_in_dim(d_k, d_k_j, k_start, 2)
    d_v = lax.dynamic_update_slice_in_dim(d_v, d_v_j, k_start, 2)
    return d_q, d_k, d_v, d_bias

  init = (jnp.zeros(q.shape, F32), jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32),
          None if bias is None else jnp.zeros(bias.shape, F32))
  d_q, d_k, d_v, d_bias = lax.fori_loop(0, num_k_blocks, key_block, init)
  return (d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype),
          None if bias is None else d_bias.astype(bias.dtype), None, None)


def _accumulate_bias_grad(d_bias, d_s, q_start, k_start):
  """Adds one block's d logits into d_bias [b|1, H_kv|1, G|1, q|1, k|1] (summing broadcasts)."""
  axes = tuple(a for a in range(5) if d_bias.shape[a] == 1 and d_s.shape[a] != 1)
  block = d_s.sum(axis=axes, keepdims=True)
  starts = [0, 0, 0, q_start if d_bias.shape[3] != 1 else 0, k_start if d_bias.shape[4] != 1 else 0]
  current = lax.dynamic_slice(d_bias, starts, block.shape)
  return lax.dynamic_update_slice(d_bias, current + block, starts)


_attention.defvjp(_attention_fwd, _attention_bwd)


def chunked_attention(q: Array, k: Array, v: Array, *, scale: float, bias: Array | None,
                      mask: Array | None, visibility: Visibility, q_block: int = 256,
                      k_block: int = 256) -> Array:
  """Exact attention without materialising the [q_len, kv_len] weights.

  Forward (Rabe & Staats 2021; Dao et al. 2022), for each query block i and the key
  blocks j it can see:

    s_ij = q_i k_jᵀ · scale + bias_ij                      [.., bq, bk]
    m_i ← max(m_i, rowmax s_ij);   l_i ← l_i e^{m_old − m_i} + Σ_j e^{s_ij − m_i}
    acc_i ← acc_i e^{m_old − m_i} + e^{s_ij − m_i} v_j;     out_i = acc_i / l_i
    lse_i = m_i + log l_i   (saved for the backward pass; +inf when nothing is visible)

  Backward (custom VJP), for each key block j and the query blocks that can see it,
  recomputing p_ij = exp(s_ij − lse_i) and with δ_i = rowsum(dout_i ⊙ out_i):

    dv_j += p_ijᵀ dout_i;   ds_ij = p_ij ⊙ (dout_i v_jᵀ − δ_i)
    dq_i += ds_ij k_j · scale;   dk_j += ds_ijᵀ q_i · scale;   dbias_ij = ds_ij

  Only the blocks some query of a block sees under the static `Visibility` are visited
  (`masks.visit_lists`: partially visible blocks with the mask, wholly visible ones
  without), so causal attention costs about half of full attention, a window of
  half-width w O(n·w) and a block-sparse pattern its visible blocks. A query with no
  visible key returns zeros.

  Args:
    q: [batch, q_len, H, d]; k, v: [batch, kv_len, H_kv, d] (H_kv divides H).
    scale: multiplies q kᵀ.
    bias: [batch|1, H|1, q_len|1, kv_len|1] or None (a dense bias is O(n²) memory).
    mask: bool, same broadcasting as bias, or None.
    visibility: causal / window / global tokens / block-sparse pattern / key lengths,
      applied block by block.
    q_block, k_block: block sizes (clipped to the sequence lengths).

  Returns:
    [batch, q_len, H, d_v] in q's dtype.
  """
  b, q_len, h, _ = q.shape
  kv_len, num_kv_heads = k.shape[1], k.shape[2]
  q_block, k_block = min(q_block, q_len), min(k_block, kv_len)
  s = _Static(scale, q_block, k_block, q_len, kv_len, visibility._replace(kv_lengths=None))
  # [b, L, H, d] -> [b, H_kv, G, L, d] and [b, L, H_kv, d] -> [b, H_kv, L, d], padded to blocks
  qh = jnp.moveaxis(q.reshape(b, q_len, num_kv_heads, h // num_kv_heads, -1), 1, 3)
  kh, vh = jnp.moveaxis(k, 1, 2), jnp.moveaxis(v, 1, 2)
  qh, kh, vh = _pad_to(qh, 3, q_block), _pad_to(kh, 2, k_block), _pad_to(vh, 2, k_block)
  broadcast = lambda x: _pad_blocks(group_broadcast(x, num_kv_heads), q_block, k_block)
  kv_lengths = None if visibility.kv_lengths is None else jnp.asarray(visibility.kv_lengths)
  out = _attention(s, qh, kh, vh, broadcast(bias), broadcast(mask), kv_lengths)
  out = jnp.moveaxis(out[:, :, :, :q_len], 3, 1)           # [b, Lq, H_kv, G, dv]
  return out.reshape(b, q_len, h, -1)
