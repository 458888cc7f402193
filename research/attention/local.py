"""Local attention of Luong et al. 2015: local-m and local-p.

Decoder step t attends only to a window of 2D + 1 source positions around an aligned
position p_t, monotonic (p_t = t) or predicted from the decoder state, with a Gaussian
around p_t multiplying the softmax's weights (`LocalAttention` gives the equations).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype

from research.attention.dense import masked_softmax
from research.attention.scores import (
  accumulation_dtype,
  as_score,
  lecun_normal_vector,
  weighted_sum,
)
from research.errors import check_choice

Array = jax.Array
MODES = ("monotonic", "predictive")


def _check_half_window(half_window):
  if not isinstance(half_window, int) or isinstance(half_window, bool) or half_window < 1:
    raise ValueError(f"half_window must be an int D ≥ 1 (σ = D/2 must be positive), "
                     f"got {half_window!r}")


def local_attention_weights(logits: Array, positions: Array, half_window: int,
                            kv_lengths: Array | None = None) -> Array:
  """a_t(s) = softmax over the window of the logits · exp(−(s − p_t)² / (2σ²)), σ = D/2.

  Args:
    logits: [..., q_len, kv_len] scores of every query against every key.
    positions: p_t, [..., q_len] (ints for local-m, reals for local-p), broadcastable
      to logits.shape[:-1].
    half_window: D ≥ 1; query t sees keys s with |s − p_t| ≤ D.
    kv_lengths: [...] source lengths (keys s ≥ length are padding), or None.

  Returns:
    weights [..., q_len, kv_len] (float32, float64 for float64 logits); zero outside
    the window and the sequence, and on rows that see no key.
  """
  _check_half_window(half_window)
  acc = accumulation_dtype(logits)
  source = jnp.arange(logits.shape[-1], dtype=acc)
  offset = source - jnp.asarray(positions, acc)[..., None]         # s − p_t: [..., q_len, kv_len]
  visible = jnp.abs(offset) <= half_window
  if kv_lengths is not None:
    visible &= source < jnp.asarray(kv_lengths)[..., None, None]
  align = masked_softmax(logits.astype(acc), visible)
  sigma = half_window / 2
  return align * jnp.exp(-jnp.square(offset) / (2 * sigma**2))


class LocalAttention(nn.Module):
  """Local-m or local-p attention of decoder states h_t over source states h̄_s.

  Decoder step t attends to the source window [p_t − D, p_t + D] around an aligned
  position p_t:

    local-m (monotonic)   p_t = t, clipped to the last source position S − 1
    local-p (predictive)  p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))

    a_t(s) = align(h_t, h̄_s) · exp(−(s − p_t)² / (2σ²)),   σ = D / 2,

  where align is the softmax of the scores over the keys inside the window
  (|s − p_t| ≤ D) and inside the sequence (s < its length S), and a_t(s) = 0 elsewhere.
  The Gaussian multiplies the weights after the softmax, without renormalising (as in
  the paper), so a row sums to at most 1. In local-p, p_t is real; the window edges are
  piecewise constant in p_t while the Gaussian is smooth, so the gradient reaches W_p and
  v_p through the Gaussian factor.

  Parameters (local-p only): "w_p" [d, f] (the paper's W_p transposed) and "v_p" [f];
  the score's own under "score".
  """
  score: nn.Module | str          # a score module, or a name in SCORE_FUNCTIONS
  mode: str = "predictive"        # "monotonic" (local-m) or "predictive" (local-p)
  half_window: int = 10           # D, the paper's value
  features: int | None = None     # f, width of W_p (None: the query size d)
  dtype: Any = None               # computation dtype (None: promote inputs and parameters)
  param_dtype: Any = jnp.float32  # parameter dtype
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # for W_p
  vector_init: nn.initializers.Initializer = lecun_normal_vector             # for v_p

  def predicted_fraction(self, h_t: Array) -> Array:
    """sigmoid(v_pᵀ tanh(W_p h_t)): h_t [..., q_len, d] -> [..., q_len] in (0, 1)."""
    features = self.features or h_t.shape[-1]
    w_p = self.param("w_p", self.kernel_init, (h_t.shape[-1], features), self.param_dtype)
    v_p = self.param("v_p", self.vector_init, (features,), self.param_dtype)
    h_t, w_p, v_p = promote_dtype(h_t, w_p, v_p, dtype=self.dtype)
    acc = accumulation_dtype(h_t, w_p)
    hidden = jnp.tanh(jnp.einsum("...qd,df->...qf", h_t, w_p, preferred_element_type=acc))
    return jax.nn.sigmoid(jnp.einsum("...qf,f->...q", hidden, v_p.astype(acc)))

  @nn.compact
  def __call__(self, h_t: Array, keys: Array, values: Array, *,
               query_positions: Array | None = None,
               kv_lengths: Array | None = None) -> tuple[Array, Array]:
    """Context vectors c_t = Σ_s a_t(s) v_s and the weights a_t(s).

    Args:
      h_t: [..., q_len, d] decoder states (queries).
      keys: [..., kv_len, d_k] source states h̄_s; values: [..., kv_len, d_v].
      query_positions: local-m only: the decoder step t of each query, [..., q_len] or
        [q_len]; default arange(q_len).
      kv_lengths: [...] source lengths S (keys s ≥ S are padding); default kv_len.

    Returns:
      context [..., q_len, d_v] in values' dtype and weights [..., q_len, kv_len], also
      sown as intermediates "attention_weights".
    """
    check_choice("mode", self.mode, MODES)
    _check_half_window(self.half_window)
    score = as_score(self.score, dtype=self.dtype, param_dtype=self.param_dtype)
    logits = score(h_t, keys)
    source_length = keys.shape[-2] if kv_lengths is None else jnp.asarray(kv_lengths)[..., None]
    if self.mode == "monotonic":
      steps = jnp.arange(h_t.shape[-2]) if query_positions is None else jnp.asarray(query_positions)
      positions = jnp.clip(steps, 0, source_length - 1)
    else:
      if query_positions is not None:
        raise ValueError("query_positions is for mode='monotonic'; local-p predicts p_t")
      positions = source_length * self.predicted_fraction(h_t)
    weights = local_attention_weights(logits, positions, self.half_window, kv_lengths)
    self.sow("intermediates", "attention_weights", weights)
    return weighted_sum(weights, values), weights
