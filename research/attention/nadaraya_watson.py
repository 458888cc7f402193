"""Nadaraya–Watson kernel regression as attention (Nadaraya 1964; Watson 1964).

Each query's output is the average of the values weighted by a smoothing kernel of its
distance to each key over a bandwidth h (Gaussian, box or triangle), with h fixed or
learned; `nadaraya_watson` gives the kernels.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from research.attention.dense import masked_softmax
from research.errors import check_choice

Array = jax.Array
SMOOTHING_KERNELS = ("gaussian", "box", "triangle")


def _check_bandwidth(bandwidth):
  """Rejects non-positive concrete bandwidths; a traced (learned) one cannot be checked."""
  try:
    concrete = np.asarray(bandwidth)
  except jax.errors.TracerArrayConversionError:
    return
  if not np.all(concrete > 0):
    raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")


def _safe_sqrt(x: Array) -> Array:
  """√x with a zero (not NaN) gradient at x = 0, where a query sits on a key."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def nadaraya_watson(queries: Array, keys: Array, values: Array, *, kernel: str, bandwidth,
                    return_weights: bool = False, dtype: Any = jnp.float32):
  """Kernel-weighted average of the values:

    f(q) = Σ_j α(q, k_j) v_j,   α(q, k_j) = K(u_j) / Σ_l K(u_l),   u_j = ‖q − k_j‖ / h

  with bandwidth h > 0 and the kernels

    gaussian  K(u) = exp(−u² / 2)   (normalised in log space: α = softmax_j(−u_j² / 2))
    box       K(u) = 1[u ≤ 1]
    triangle  K(u) = max(0, 1 − u)

  A query with no key inside the support of a compact kernel (box, triangle) gets all-zero
  weights and returns zeros, with finite gradients. The box kernel is piecewise constant, so
  its gradient with respect to h, the queries and the keys is zero. `dtype` is the dtype of
  the matrix product Σ_j α_j v_j (mixed precision: bfloat16 or float16); the distances, the
  kernel and its normalisation stay float32, as attention's softmax does, and so does the
  output.

  Args:
    queries: [..., m, d]; keys: [..., n, d]; values: [..., n, d_v] (leading axes broadcast).
    kernel: "gaussian", "box" or "triangle".
    bandwidth: h > 0, a scalar or an array broadcastable to [..., m, n].
    return_weights: also return the weights α [..., m, n].
    dtype: the dtype of the weighted sum's operands (the weights and the values).

  Returns:
    [..., m, d_v] in float32, or (that, weights) with return_weights (float32).
  """
  check_choice("kernel", kernel, SMOOTHING_KERNELS)
  _check_bandwidth(bandwidth)
  queries, keys = jnp.asarray(queries, jnp.float32), jnp.asarray(keys, jnp.float32)
  values, bandwidth = jnp.asarray(values, jnp.float32), jnp.asarray(bandwidth, jnp.float32)
  difference = queries[..., :, None, :] - keys[..., None, :, :]       # [..., m, n, d]
  u_squared = jnp.sum(difference**2, axis=-1) / bandwidth**2          # [..., m, n]
  if kernel == "gaussian":
    weights = masked_softmax(-u_squared / 2, None)
  else:
    if kernel == "box":
      kernel_values = (u_squared <= 1).astype(jnp.float32)
    else:
      kernel_values = jnp.maximum(0.0, 1.0 - _safe_sqrt(u_squared))
    total = jnp.sum(kernel_values, axis=-1, keepdims=True)
    weights = kernel_values / jnp.where(total > 0, total, 1.0)
  out = jnp.einsum("...mn,...nv->...mv", weights.astype(dtype),
                   values.astype(dtype)).astype(jnp.float32)
  return (out, weights) if return_weights else out


class NadarayaWatson(nn.Module):
  """Nadaraya–Watson regression with a fixed or learned bandwidth.

  The learned bandwidth is h = exp(log_bandwidth), a scalar parameter initialised to
  log(init_bandwidth). The weights [..., m, n] are sown as intermediates/attention_weights.
  """
  kernel: str = "gaussian"          # "gaussian", "box" or "triangle"
  learn_bandwidth: bool = True      # h is a parameter (else fixed at init_bandwidth)
  init_bandwidth: float = 1.0       # initial (or fixed) bandwidth h > 0
  dtype: Any = jnp.float32          # the weighted sum's dtype (the parameter stays float32)

  @nn.compact
  def __call__(self, queries: Array, keys: Array, values: Array) -> Array:
    """queries [..., m, d], keys [..., n, d], values [..., n, d_v] -> [..., m, d_v]."""
    check_choice("kernel", self.kernel, SMOOTHING_KERNELS)
    if not self.init_bandwidth > 0:
      raise ValueError(f"init_bandwidth must be > 0, got {self.init_bandwidth!r}")
    bandwidth = self.init_bandwidth
    if self.learn_bandwidth:
      log_bandwidth = self.param("log_bandwidth", nn.initializers.constant(np.log(bandwidth)), ())
      bandwidth = jnp.exp(log_bandwidth)
    out, weights = nadaraya_watson(queries, keys, values, kernel=self.kernel, bandwidth=bandwidth,
                                   return_weights=True, dtype=self.dtype)
    self.sow("intermediates", "attention_weights", weights)
    return out
