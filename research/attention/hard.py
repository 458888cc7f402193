"""Hard (stochastic) attention of Xu et al. 2015: each query reads one key.

A query chooses one visible key, the most likely or a sample from the softmax of the
logits, and reads its value. The choice is not differentiable; two ways to train through
it are here: REINFORCE with a baseline (a moving average or a learned prediction of the
reward) and the straight-through Gumbel-softmax.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention.dense import masked_softmax
from research.attention.scores import accumulation_dtype, as_score, weighted_sum
from research.errors import check_choice

Array = jax.Array
CHOICE_MODES = ("argmax", "sample")
MODES = ("argmax", "sample", "gumbel")


def _visible_logits(logits: Array, mask: Array | None) -> tuple[Array, Array]:
  """Logits with −inf at hidden keys (all 0 on rows with no visible key, to stay finite),
  and whether each row [...] has a visible key."""
  if mask is None:
    return logits, jnp.ones(logits.shape[:-1], bool)
  visible = jnp.broadcast_to(mask, logits.shape)
  has_visible = jnp.any(visible, axis=-1)
  hidden_as_minus_inf = jnp.where(visible, logits, -jnp.inf)
  return jnp.where(has_visible[..., None], hidden_as_minus_inf, 0.0), has_visible


def choose_key(logits: Array, *, mask: Array | None = None, key: Array | None = None) -> Array:
  """Index [..., q_len] of the chosen key, −1 where no key is visible.

  logits: [..., q_len, kv_len]; mask: bool broadcastable to logits (True = visible).
  Without a PRNG key: argmax of the visible logits; with one: a sample from their softmax.
  """
  visible_logits, has_visible = _visible_logits(logits, mask)
  if key is None:
    index = jnp.argmax(visible_logits, axis=-1)
  else:
    index = jax.random.categorical(key, visible_logits, axis=-1)
  return jnp.where(has_visible, index, -1)


def hard_attention(logits: Array, values: Array, *, key: Array | None = None,
                   mode: str = "argmax", mask: Array | None = None) -> tuple[Array, Array, Array]:
  """Each query reads the value of one key: the argmax or a sample from softmax(logits).

  Args:
    logits: [..., q_len, kv_len]; values: [..., kv_len, d_v].
    key: PRNG key, needed by mode "sample".
    mode: "argmax" or "sample".
    mask: bool broadcastable to logits (True = visible), or None.

  Returns:
    context [..., q_len, d_v] = values[index], one-hot weights [..., q_len, kv_len]
    (float32) and index [..., q_len] (−1 and zeros where no key is visible).
  """
  check_choice("mode", mode, CHOICE_MODES)
  if mode == "sample" and key is None:
    raise ValueError("mode='sample' needs a PRNG key (key=...)")
  index = choose_key(logits, mask=mask, key=key if mode == "sample" else None)
  weights = jax.nn.one_hot(index, logits.shape[-1], dtype=accumulation_dtype(logits))
  return weighted_sum(weights, values), weights, index


def choice_log_prob(logits: Array, weights: Array, mask: Array | None = None) -> Array:
  """log p(s) of the key each one-hot row of weights chooses (0 for an all-zero row).

  log p = log_softmax over the visible keys; logits, weights: [..., q_len, kv_len];
  returns [..., q_len]. No gradient flows into the weights.
  """
  acc = accumulation_dtype(logits)
  visible_logits, _ = _visible_logits(logits.astype(acc), mask)
  log_p = jax.nn.log_softmax(visible_logits, axis=-1)
  if mask is not None:
    log_p = jnp.where(mask, log_p, 0.0)
  return jnp.sum(jax.lax.stop_gradient(weights).astype(acc) * log_p, axis=-1)


def gumbel_softmax(logits: Array, key: Array, *, temperature: float = 1.0, hard: bool = True,
                   mask: Array | None = None) -> Array:
  """A Gumbel-softmax sample [..., kv_len] over the last axis of logits.

  Jang et al. 2017; Maddison et al. 2017.
  y_soft = softmax((logits + g) / τ) over the visible keys, g ~ Gumbel(0, 1) drawn with
  `jax.random.gumbel(key, logits.shape)`. With hard=True the value is exactly
  y_hard = one_hot(argmax(logits + g)) and the gradient is that of y_soft
  (straight-through: y_hard + y_soft − stop_gradient(y_soft)).
  """
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")
  acc = accumulation_dtype(logits)
  perturbed = logits.astype(acc) + jax.random.gumbel(key, logits.shape, acc)
  y_soft = masked_softmax(perturbed / temperature, mask)
  if not hard:
    return y_soft
  y_hard = jax.nn.one_hot(choose_key(perturbed, mask=mask), logits.shape[-1], dtype=acc)
  # y_soft − stop_gradient(y_soft) is exactly 0 forward: the value stays one-hot.
  return y_hard + (y_soft - jax.lax.stop_gradient(y_soft))


def reinforce_surrogate(log_prob: Array, reward: Array, baseline: Array | float = 0.0) -> Array:
  """mean(stop_gradient(R − b) · log p(s)): its gradient is the REINFORCE estimate of ∇ E[R].

    ∇ E_s[R(s)] = E_s[(R(s) − b) ∇ log p(s)]

  Ascend it (or descend its negative) to increase the expected reward.

  Args:
    log_prob: [...] log-probability of each sampled choice; for a sample made of several
      choices, the sum of their log-probabilities.
    reward: R, broadcastable with log_prob.
    baseline: b, broadcastable with log_prob (a moving average or a learned prediction).
  """
  advantage = jax.lax.stop_gradient(reward - baseline)
  return jnp.mean(advantage * log_prob)


def update_moving_average_baseline(baseline: Array | float, reward: Array,
                                   decay: float = 0.9) -> Array:
  """b ← decay · b + (1 − decay) · mean(R), Xu et al.'s running average (decay 0.9)."""
  if isinstance(decay, (int, float)) and not 0 <= decay < 1:
    raise ValueError(f"decay must be in [0, 1), got {decay!r}")
  return decay * baseline + (1 - decay) * jnp.mean(jax.lax.stop_gradient(reward))


def baseline_loss(predicted_baseline: Array, reward: Array) -> Array:
  """mean((b̂ − stop_gradient(R))²): trains a learned baseline to predict the reward."""
  return jnp.mean(jnp.square(predicted_baseline - jax.lax.stop_gradient(reward)))


class HardAttention(nn.Module):
  """Hard attention over the keys with a score module's logits.

  In training, mode "sample" draws s ~ softmax(logits) (train with REINFORCE on the
  returned log p(s)) and "gumbel" uses the straight-through Gumbel-softmax, both from
  the "attention" PRNG stream; mode "argmax", and every mode at evaluation, picks the
  most likely key.
  """
  score: nn.Module | str          # a score module, or a name in SCORE_FUNCTIONS
  mode: str = "sample"            # "argmax", "sample" or "gumbel"
  temperature: float = 1.0        # τ of the Gumbel-softmax
  dtype: Any = None               # computation dtype of a score built by name
  param_dtype: Any = jnp.float32  # parameter dtype of a score built by name

  @nn.compact
  def __call__(self, queries: Array, keys: Array, values: Array, *,
               mask: Array | None = None, train: bool = False) -> tuple[Array, Array, Array]:
    """queries [..., q_len, d_q], keys [..., kv_len, d_k], values [..., kv_len, d_v];
    mask bool broadcastable to [..., q_len, kv_len] (True = visible).

    Returns context [..., q_len, d_v], one-hot weights [..., q_len, kv_len] (sown as
    intermediates "attention_weights") and log p(choice) [..., q_len].
    """
    check_choice("mode", self.mode, MODES)
    score = as_score(self.score, dtype=self.dtype, param_dtype=self.param_dtype)
    logits = score(queries, keys)
    if train and self.mode == "gumbel":
      weights = gumbel_softmax(logits, self.make_rng("attention"), temperature=self.temperature,
                               mask=mask)
    else:
      key = self.make_rng("attention") if train and self.mode == "sample" else None
      weights = jax.nn.one_hot(choose_key(logits, mask=mask, key=key), logits.shape[-1],
                               dtype=logits.dtype)
    self.sow("intermediates", "attention_weights", weights)
    return weighted_sum(weights, values), weights, choice_log_prob(logits, weights, mask)
