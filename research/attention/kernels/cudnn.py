"""`implementation="cudnn"`: NVIDIA's fused flash attention, through `jax.nn`.

Calls `jax.nn.dot_product_attention(..., implementation="cudnn")` with our pattern in its
terms. What cuDNN cannot do is refused before tracing (`refusals`), so the dispatcher
(`implementation="auto"`) goes on to our Pallas kernel instead.
"""

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo  # check_cudnn_version: no public API

from research.attention import registry
from research.attention.masks import Visibility

Array = jax.Array
MAX_HEAD_DIM = 128
MIN_CAPABILITY = (8, 0)   # Ampere: cuDNN's flash attention (jax.nn checks only a local GPU)


def _rows_seeing_a_key(visibility: Visibility, mask: Array | None, batch: int, q_len: int,
                       kv_len: int) -> Array:
  """bool [batch|1, 1, q_len, 1]: query i sees at least one key."""
  if mask is not None:
    visible = visibility.dense(q_len, kv_len)[:, None] & mask
    return visible.any(-1, keepdims=True)
  lengths = (jnp.full((batch,), kv_len) if visibility.kv_lengths is None
             else jnp.minimum(visibility.kv_lengths, kv_len))
  queries = jnp.arange(q_len)
  first = 0 * queries if visibility.left is None else jnp.maximum(queries - visibility.left, 0)
  return (first[None, :] < lengths[:, None])[:, None, :, None]


def cudnn_attention(q, k, v, *, scale, bias, mask, visibility: Visibility, block_size,
                    return_weights):
  """The uniform implementation signature (see `research.attention.registry`).

  Our pattern in cuDNN's terms: causal → `is_causal`, a causal window (left, 0) →
  `local_window_size=(left, 0)` (cuDNN skips the blocks outside it), key lengths →
  `key_value_seq_lengths`, a mask or bias → cuDNN's bias. A query that sees no key (a
  window beyond the key lengths) returns zeros, as everywhere in `research.attention`;
  cuDNN itself leaves such rows undefined.
  """
  del block_size, return_weights  # cuDNN picks its tiles; it returns no weights
  window = None if visibility.left is None else (visibility.left, 0)
  lengths = visibility.kv_lengths
  out = jax.nn.dot_product_attention(
      q, k, v, bias=bias, mask=mask, scale=scale, is_causal=visibility.causal,
      local_window_size=window, implementation="cudnn",
      key_value_seq_lengths=None if lengths is None else lengths.astype(jnp.int32))
  if mask is None and lengths is None:
    return out  # every query sees at least itself or key 0
  seeing = _rows_seeing_a_key(visibility, mask, q.shape[0], q.shape[1], k.shape[1])
  return jnp.where(jnp.moveaxis(seeing, 1, 2), out, 0).astype(q.dtype)


def missing_here() -> str | None:
  """Why cuDNN attention cannot be traced on this machine (jax.nn asks the library for its
  version when the call is traced), or None."""
  try:
    fused_attention_stablehlo.check_cudnn_version()
  except RuntimeError as error:
    return (f"the cuDNN library, which tracing it needs, is not installed here ({error}; "
            "pip install -e '.[cuda]' on a GPU machine, '.[aot]' to compile for one)")
  return None


def refusals(request: registry.Request) -> list[str]:
  """What of `request` cuDNN's fused kernel cannot do, in words. Beside the registered
  capabilities (bfloat16 / float16 only, no global tokens, no block-sparse pattern):

    a GPU of compute capability 8.0 or newer (not a T4: 7.5; `registry.gpu_capability`);
    head dim a multiple of 8, at most 128 (256 needs Hopper, which cannot be told before
    tracing); no two-sided window, no window with a bias or mask; causal only with
    q_len = kv_len (cuDNN's alignment of a rectangular causal mask is not `jax.nn`'s); with
    more than one query, even lengths (its backward needs them).
  """
  reasons = registry.below_capability(request, MIN_CAPABILITY, "cuDNN's flash attention")
  if request.head_dim % 8 or request.head_dim > MAX_HEAD_DIM:
    reasons.append(f"head dim {request.head_dim} (cuDNN takes multiples of 8 up to "
                   f"{MAX_HEAD_DIM})")
  if request.window is not None and request.window[1] != 0:
    reasons.append(f"a two-sided window {request.window} (cuDNN's window is causal)")
  if request.window is not None and (request.mask or request.bias):
    reasons.append("a window together with a mask or bias")
  if request.causal and request.q_len != request.kv_len:
    reasons.append(f"causal attention with q_len {request.q_len} != kv_len {request.kv_len}")
  if request.q_len > 1 and (request.q_len % 2 or request.kv_len % 2):
    # jax.nn's cuDNN path refuses them when differentiated ("Unsupported sequence length"),
    # which the registry cannot foresee; one query (decoding) is forward only
    reasons.append(f"odd lengths ({request.q_len}, {request.kv_len}): its backward needs "
                   "even ones")
  return reasons


registry.register(registry.Implementation(
    "cudnn", cudnn_attention, mask=True, bias=True, window="optional",
    key_value_seq_lengths=True, gqa=True, dtypes=frozenset({"bfloat16", "float16"}),
    platforms=frozenset({"gpu"}), refuses=refusals, auto_rank=0, missing_here=missing_here))
