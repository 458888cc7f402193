"""`dot_product_attention`: one entry point, implementations chosen from a registry.

The layout and semantics of `jax.nn.dot_product_attention`, with more patterns (windows,
global tokens, block-sparse) and a choice of implementation: "auto", the fastest exact one
that can do the call on each platform it is lowered for (`registry.py`), or one by name.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from research.attention import block_sparse, implementations, kernels, platforms, registry  # noqa: F401 (registration)
from research.attention.masks import Visibility
from research.errors import check_positive

Array = jax.Array


def _as_4d(x, name: str, full_shape: tuple[int, int, int, int]) -> Array | None:
  """Left-pads a mask / bias to 4 axes and checks it broadcasts to [b, H, q, k]."""
  if x is None:
    return None
  x = jnp.asarray(x)
  if x.ndim > 4:
    raise ValueError(f"{name} must have at most 4 axes [batch, heads, q_len, kv_len], got {x.shape}")
  x = x.reshape((1,) * (4 - x.ndim) + x.shape)
  if any(s not in (1, f) for s, f in zip(x.shape, full_shape)):
    raise ValueError(f"{name} of shape {x.shape} does not broadcast to [batch, heads, q_len, "
                     f"kv_len] = {list(full_shape)}")
  return x


def _check_shapes(q, k, v):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError("q, k, v must be [batch, length, heads, head_dim]; got shapes "
                     f"{q.shape}, {k.shape}, {v.shape}")
  if not (q.shape[0] == k.shape[0] == v.shape[0]):
    raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
  if k.shape[1:3] != v.shape[1:3]:
    raise ValueError(f"k and v must share [kv_len, heads]; got {k.shape} and {v.shape}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k head_dim differ: {q.shape[-1]} vs {k.shape[-1]}")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"key/value heads ({k.shape[2]}) must divide query heads ({q.shape[2]})")


def _global_positions(global_tokens, length: int) -> tuple[int, ...]:
  """Static global-token positions -> a sorted tuple of distinct ints in [0, length)."""
  if global_tokens is None:
    return ()
  if isinstance(global_tokens, jax.core.Tracer):
    raise ValueError("global_tokens must be static positions (a list of ints or a NumPy "
                     "array), not a traced array: they decide which blocks a kernel visits")
  positions = np.asarray(global_tokens)
  if positions.ndim != 1 or not (positions.size == 0 or np.issubdtype(positions.dtype, np.integer)):
    raise ValueError(f"global_tokens must be a 1-D sequence of int positions, got {global_tokens!r}")
  if positions.size and (positions.min() < 0 or positions.max() >= length):
    raise ValueError(f"global_tokens must lie in [0, {length}), got {global_tokens!r}")
  return tuple(int(p) for p in np.unique(positions))


def dot_product_attention(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                          bias: Array | None = None, is_causal: bool = False, window=None,
                          global_tokens=None, sparsity=None, implementation: str = "auto",
                          return_weights: bool = False,
                          scale: float | None = None,
                          key_value_seq_lengths: Array | None = None,
                          block_size: int | None = None):
  """softmax(q kᵀ · scale + bias, over visible keys) v.

  Same layout and semantics as `jax.nn.dot_product_attention` (its
  `local_window_size=(l, r)` is our `window=(l, r)`), except that a query with no visible
  key returns zeros instead of an average of all values. The implementation is chosen per
  lowering platform (`platforms.per_platform`), so a call traced on a CPU machine and
  lowered for a TPU runs splash's kernel there. A request the implementation can do on no
  platform fails when traced, naming what is missing and the implementations that can; one
  it can do elsewhere fails when lowered for a platform it cannot run on. Named and lowered
  for a CPU, the Pallas kernels run in Pallas interpret mode (for tests); lowered for their
  own platform they are the real kernels.

  Args:
    q: [batch, q_len, H, d]; k: [batch, kv_len, H_kv, d]; v: [batch, kv_len, H_kv, d_v].
    mask: bool, broadcastable to [batch, H, q_len, kv_len]; True = may attend.
    bias: added to the logits, broadcastable like mask (e.g. a prior or position bias).
    is_causal: query i sees keys j ≤ i.
    window: None, w (keys i−w … i+w) or (left, right); with is_causal right is 0.
    global_tokens: static positions (ints) of Longformer's global tokens: each sees every
      key and is seen by every query, within causality and key lengths (see
      `masks.Visibility`); usually with a window.
    sparsity: a static block-sparse pattern (`block_sparse`): `SparseFixed(block, summary)`
      or `SparseStrided(stride)` (Sparse Transformer), `BigBird(block, window,
      global_blocks, random_blocks, seed)`; with is_causal within causality. It replaces
      window and global_tokens (pass neither). Every implementation visits only the blocks
      it leaves visible, or refuses it (cuDNN).
    implementation: "auto" or a registered name (`implementations.names()`): "dense",
      "chunked", "banded", "cudnn", "pallas_gpu", "pallas_tpu", or one of the user's.
    return_weights: also return the weights [batch, H, q_len, kv_len] (dense only).
    scale: logit scale, default 1/√d.
    key_value_seq_lengths: [batch] ints; keys at t ≥ length are padding.
    block_size: block length of the chunked / banded strategies (default 256 / 64), and of
      a Pallas kernel named explicitly (under "auto" the kernels choose their own).

  Returns:
    out [batch, q_len, H, d_v] in q's dtype, or (out, weights) with return_weights.
  """
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  _check_shapes(q, k, v)
  registry.check_name(implementation)  # an unknown name fails first, listing the names
  if block_size is not None:
    check_positive("block_size", block_size)
  b, q_len, h, d = q.shape
  full = (b, h, q_len, k.shape[1])
  mask, bias = _as_4d(mask, "mask", full), _as_4d(bias, "bias", full)
  if mask is not None and mask.dtype != jnp.bool_:
    raise ValueError(f"mask must be boolean, got dtype {mask.dtype}")
  if key_value_seq_lengths is not None:
    key_value_seq_lengths = jnp.asarray(key_value_seq_lengths)
    if key_value_seq_lengths.shape != (b,):
      raise ValueError(f"key_value_seq_lengths must have shape (batch,) = ({b},), "
                       f"got {key_value_seq_lengths.shape}")
  positions = _global_positions(global_tokens, max(q_len, k.shape[1]))
  if block_sparse.check(sparsity) is not None:
    sparsity = sparsity.bind(q_len, k.shape[1], is_causal)
  visibility = Visibility.make(is_causal, window, key_value_seq_lengths, positions, sparsity)
  request = registry.Request.of(q, k, v, mask=mask, bias=bias, is_causal=is_causal,
                                window=window, global_tokens=positions, sparsity=sparsity,
                                key_value_seq_lengths=key_value_seq_lengths,
                                return_weights=return_weights)
  choices = registry.plan(implementation, request, platforms.host())
  call = functools.partial(_call, scale=1.0 / math.sqrt(d) if scale is None else scale,
                           visibility=visibility, block_size=block_size,
                           return_weights=bool(return_weights))
  out_shape = jax.ShapeDtypeStruct((b, q_len, h, v.shape[-1]), q.dtype)
  if return_weights:
    out_shape = (out_shape, jax.ShapeDtypeStruct(full, jnp.float32))
  branches, made = {}, {}
  for lowering, platform in platforms.LOWERING.items():
    chosen, interpret, refusal = choices[platform]
    if chosen is None:
      branches[lowering] = platforms.refusal(refusal, out_shape)
      continue
    native = chosen.platforms is not None and not interpret   # a kernel of this platform
    key = (chosen.name, interpret, lowering if native else None)
    if key not in made:
      # under "auto" a platform's kernel picks its own tiles: block_size is the strategies'
      tiles = dict(block_size=None) if native and implementation == registry.AUTO else {}
      branch = functools.partial(call, chosen, interpret, **tiles)
      made[key] = (platforms.over_the_batch(platforms.only_on(lowering, branch)) if native
                   else branch)
    branches[lowering] = made[key]
  return platforms.per_platform(branches, (q, k, v, bias), (mask, visibility.kv_lengths))


def _call(implementation, interpret, diff, rest, *, scale, visibility, block_size,
          return_weights):
  """implementation's function on (q, k, v, bias), (mask, key lengths)."""
  (q, k, v, bias), (mask, kv_lengths) = diff, rest
  extra = dict(interpret=interpret) if implementation.interpreted else {}
  return implementation.function(q, k, v, scale=scale, bias=bias, mask=mask,
                                 visibility=visibility._replace(kv_lengths=kv_lengths),
                                 block_size=block_size, return_weights=return_weights,
                                 **extra)
