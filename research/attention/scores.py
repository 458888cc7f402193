"""Score functions: how well a query matches each key.

Every score maps queries q [..., q_len, d_q] and keys k [..., kv_len, d_k] to logits
[..., q_len, kv_len], accumulated in at least float32 whatever the input dtype. Each is a
pure function of its parameters and a `flax.linen` module that owns them
(`SCORE_FUNCTIONS`); `attend` turns logits into weights and a context vector.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype

from research.attention.dense import masked_softmax
from research.errors import check_choice

Array = jax.Array


def accumulation_dtype(*arrays: Array) -> jnp.dtype:
  """The dtype logits are accumulated in: float32, or float64 for float64 inputs."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def _check_same_size(q: Array, k: Array, score: str):
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"the {score} score needs queries and keys of one size; got d_q = "
                     f"{q.shape[-1]}, d_k = {k.shape[-1]}")


def dot_score(q: Array, k: Array) -> Array:
  """qᵀ k.  q: [..., q_len, d]; k: [..., kv_len, d] -> [..., q_len, kv_len]."""
  _check_same_size(q, k, "dot")
  return jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=accumulation_dtype(q, k))


def scaled_dot_score(q: Array, k: Array) -> Array:
  """qᵀ k / √d.  q: [..., q_len, d]; k: [..., kv_len, d] -> [..., q_len, kv_len]."""
  return dot_score(q, k) / math.sqrt(q.shape[-1])


def general_score(q: Array, k: Array, w: Array) -> Array:
  """qᵀ W k.  q: [..., q_len, d_q]; k: [..., kv_len, d_k]; W: [d_q, d_k]."""
  acc = accumulation_dtype(q, k, w)
  k_projected = jnp.einsum("...ke,de->...kd", k, w, preferred_element_type=acc)
  return jnp.einsum("...qd,...kd->...qk", q.astype(acc), k_projected)


def additive_score(q: Array, k: Array, w_q: Array, w_k: Array, v: Array) -> Array:
  """vᵀ tanh(W_q q + W_k k), Bahdanau et al. 2015.

  q: [..., q_len, d_q]; k: [..., kv_len, d_k]; W_q: [d_q, a]; W_k: [d_k, a]; v: [a].
  The projections are computed once per query and per key, then broadcast-added to
  [..., q_len, kv_len, a].
  """
  acc = accumulation_dtype(q, k, w_q, w_k, v)
  q_projected = jnp.einsum("...qd,da->...qa", q, w_q, preferred_element_type=acc)
  k_projected = jnp.einsum("...kd,da->...ka", k, w_k, preferred_element_type=acc)
  hidden = jnp.tanh(q_projected[..., :, None, :] + k_projected[..., None, :, :])
  return jnp.einsum("...qka,a->...qk", hidden, v.astype(acc))


def concat_score(q: Array, k: Array, w: Array, v: Array) -> Array:
  """vᵀ tanh(W [q; k]), Luong et al. 2015: additive with W = [W_q; W_k] stacked by rows.

  q: [..., q_len, d_q]; k: [..., kv_len, d_k]; W: [d_q + d_k, a]; v: [a].
  """
  d_q, d_k = q.shape[-1], k.shape[-1]
  if w.shape[0] != d_q + d_k:
    raise ValueError(f"concat score: W must have d_q + d_k = {d_q + d_k} rows, got {w.shape}")
  return additive_score(q, k, w[:d_q], w[d_q:], v)


def location_score(q: Array, w_a: Array, kv_len: int) -> Array:
  """W_a h_t over a fixed source length S, kept for the first kv_len positions.

  q: [..., q_len, d_q]; W_a: [d_q, S] with S ≥ kv_len -> [..., q_len, kv_len].
  """
  source_length = w_a.shape[-1]
  if kv_len > source_length:
    raise ValueError(f"location score: kv_len = {kv_len} exceeds the source_length = "
                     f"{source_length} it was built for; allowed kv_len ≤ {source_length}")
  logits = jnp.einsum("...qd,ds->...qs", q, w_a, preferred_element_type=accumulation_dtype(q, w_a))
  return logits[..., :kv_len]


def weighted_sum(weights: Array, values: Array) -> Array:
  """Σ_s weights[s] values[s].  weights: [..., q_len, kv_len]; values: [..., kv_len, d_v]."""
  return jnp.einsum("...qk,...kd->...qd", weights.astype(values.dtype), values,
                    preferred_element_type=accumulation_dtype(values)).astype(values.dtype)


def attend(logits: Array, values: Array, mask: Array | None = None) -> tuple[Array, Array]:
  """Soft attention: weights = softmax over the visible keys, context = weights · values.

  Args:
    logits: [..., q_len, kv_len] from a score function.
    values: [..., kv_len, d_v].
    mask: bool broadcastable to [..., q_len, kv_len] (True = visible), or None.

  Returns:
    context [..., q_len, d_v] in values' dtype and float32 weights [..., q_len, kv_len];
    a query with no visible key gets zero weights and a zero context.
  """
  if mask is not None and jnp.asarray(mask).dtype != jnp.bool_:
    raise ValueError(f"mask must be boolean (True = visible), got dtype {jnp.asarray(mask).dtype}")
  weights = masked_softmax(logits.astype(accumulation_dtype(logits)), mask)
  return weighted_sum(weights, values), weights


class Score(nn.Module, kw_only=True):
  """Base of the score modules: `__call__(q [..., q_len, d_q], k [..., kv_len, d_k])`
  returns logits [..., q_len, kv_len] (float32, float64 for float64 inputs)."""
  dtype: Any = None               # computation dtype (None: promote inputs and parameters)
  param_dtype: Any = jnp.float32  # parameter dtype


class DotScore(Score):
  """qᵀ k."""

  def __call__(self, q: Array, k: Array) -> Array:
    return dot_score(*promote_dtype(q, k, dtype=self.dtype))


class ScaledDotScore(Score):
  """qᵀ k / √d."""

  def __call__(self, q: Array, k: Array) -> Array:
    return scaled_dot_score(*promote_dtype(q, k, dtype=self.dtype))


class GeneralScore(Score):
  """qᵀ W k with W [d_q, d_k] (parameter "w")."""
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # for W

  @nn.compact
  def __call__(self, q: Array, k: Array) -> Array:
    w = self.param("w", self.kernel_init, (q.shape[-1], k.shape[-1]), self.param_dtype)
    return general_score(*promote_dtype(q, k, w, dtype=self.dtype))


# v maps a features to one logit: lecun_normal with fan-in a.
lecun_normal_vector = nn.initializers.lecun_normal(in_axis=-1, out_axis=())


class AdditiveScore(Score):
  """vᵀ tanh(W_q q + W_k k) (parameters "w_q" [d_q, a], "w_k" [d_k, a], "v" [a])."""
  features: int                                                              # a
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # for W_q, W_k
  vector_init: nn.initializers.Initializer = lecun_normal_vector             # for v

  @nn.compact
  def __call__(self, q: Array, k: Array) -> Array:
    w_q = self.param("w_q", self.kernel_init, (q.shape[-1], self.features), self.param_dtype)
    w_k = self.param("w_k", self.kernel_init, (k.shape[-1], self.features), self.param_dtype)
    v = self.param("v", self.vector_init, (self.features,), self.param_dtype)
    return additive_score(*promote_dtype(q, k, w_q, w_k, v, dtype=self.dtype))


class ConcatScore(Score):
  """vᵀ tanh(W [q; k]) (parameters "w" [d_q + d_k, a], "v" [a])."""
  features: int                                                              # a
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # for W
  vector_init: nn.initializers.Initializer = lecun_normal_vector             # for v

  @nn.compact
  def __call__(self, q: Array, k: Array) -> Array:
    w = self.param("w", self.kernel_init, (q.shape[-1] + k.shape[-1], self.features),
                   self.param_dtype)
    v = self.param("v", self.vector_init, (self.features,), self.param_dtype)
    return concat_score(*promote_dtype(q, k, w, v, dtype=self.dtype))


class LocationScore(Score):
  """W_a h_t over a fixed source length S (parameter "w_a" [d_q, S]); reads only kv_len
  from the keys and raises ValueError when kv_len > S."""
  source_length: int                                                         # S
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()  # for W_a

  @nn.compact
  def __call__(self, q: Array, k: Array) -> Array:
    w_a = self.param("w_a", self.kernel_init, (q.shape[-1], self.source_length), self.param_dtype)
    return location_score(*promote_dtype(q, w_a, dtype=self.dtype), kv_len=k.shape[-2])


# name        logits                    parameters
# dot         qᵀ k
# scaled_dot  qᵀ k / √d
# general     qᵀ W k                    W [d_q, d_k]                      (Luong, bilinear)
# additive    vᵀ tanh(W_q q + W_k k)    W_q [d_q, a], W_k [d_k, a], v [a]  (Bahdanau)
# concat      vᵀ tanh(W [q; k])         W [d_q + d_k, a], v [a]           (Luong)
# location    (W_a q)[s]                W_a [d_q, S], independent of k    (Luong)
SCORE_FUNCTIONS: dict[str, type[Score]] = {
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "general": GeneralScore,
    "additive": AdditiveScore,
    "concat": ConcatScore,
    "location": LocationScore,
}


def make_score(name: str, /, **kwargs) -> Score:
  """The score module called `name` (a key of SCORE_FUNCTIONS), built with kwargs
  (module attributes, and flax's `name` for the instance)."""
  check_choice("score", name, sorted(SCORE_FUNCTIONS))
  return SCORE_FUNCTIONS[name](**kwargs)


def as_score(score: nn.Module | str, **kwargs) -> nn.Module:
  """A score module as given, or built by name with kwargs as submodule "score".

  Call inside a compact method of a module whose attribute `score` holds the argument,
  so that both forms give the same parameter tree {"score": ...}.
  """
  return make_score(score, name="score", **kwargs) if isinstance(score, str) else score
