"""Hard attention: REINFORCE against the exactly enumerated gradient of the expected
reward, the straight-through Gumbel-softmax against jax.nn.softmax, and argmax / sample
choices against NumPy and the softmax probabilities."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention.hard import (
  HardAttention,
  baseline_loss,
  gumbel_softmax,
  hard_attention,
  reinforce_surrogate,
  update_moving_average_baseline,
)
from research.attention.scores import GeneralScore

# Compared with jax.nn / NumPy log-probabilities within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

# 99.99% quantile of the chi-square distribution with 3 degrees of freedom.
CHI2_3DOF_P9999 = 21.11
N_SAMPLES = 20_000


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
  expected = counts.sum() * probabilities
  return float(np.sum((counts - expected) ** 2 / expected))


def numpy_masked_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
  z = np.where(mask, np.exp(logits - logits[mask].max()), 0.0)
  return z / z.sum()


class TestReinforce:
  """One query, four keys, reward R(s) fixed per chosen key s."""
  q = np.array([[0.3, -1.0, 0.8]], np.float32)                  # [q_len = 1, d]
  keys = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
  values = np.eye(4, dtype=np.float32)                            # context = one_hot(s)
  reward_per_key = np.array([6.0, 8.0, 3.0, 5.5], np.float32)     # R(s)
  params = {"score": {"w": 0.7 * np.random.default_rng(1).standard_normal((3, 3), np.float32)}}
  module = HardAttention(GeneralScore(), mode="sample")

  def expected_reward(self, params):
    """E[R] = Σ_s p(s) R(s), p = softmax(qᵀ W k), enumerated."""
    p = jax.nn.softmax(self.q @ params["score"]["w"] @ self.keys.T)
    return jnp.sum(p * self.reward_per_key)

  def sampled_reward(self, params, rng):
    context, _, log_prob = self.module.apply({"params": params}, self.q, self.keys, self.values,
                                             train=True, rngs={"attention": rng})
    return context @ self.reward_per_key, log_prob              # R(s) [1], log p(s) [1]

  def surrogate_gradient(self, rng, baseline):
    """∇_W of the REINFORCE surrogate for the sample drawn with rng: [9]."""
    def surrogate(params):
      reward, log_prob = self.sampled_reward(params, rng)
      return reinforce_surrogate(log_prob, reward, baseline)
    return jax.grad(surrogate)(self.params)["score"]["w"].ravel()

  @functools.partial(jax.jit, static_argnums=0)
  def estimates(self, rng):
    """The moving-average baseline after 50 batches of 32 rewards, and for N further
    samples the per-sample gradients without and with it: [N, 2, 9]."""
    baseline_rng, sample_rng = jax.random.split(rng)
    rewards = jax.vmap(lambda r: self.sampled_reward(self.params, r)[0])(
        jax.random.split(baseline_rng, 50 * 32)).reshape(50, 32)
    baseline, _ = jax.lax.scan(
        lambda b, batch: (update_moving_average_baseline(b, batch, decay=0.9), None),
        jnp.float32(0), rewards)
    both_baselines = jax.vmap(self.surrogate_gradient, in_axes=(None, 0))
    gradients = jax.vmap(both_baselines, in_axes=(0, None))(
        jax.random.split(sample_rng, N_SAMPLES), jnp.stack([0.0, baseline]))
    return baseline, gradients

  @pytest.mark.slow
  def test_unbiased_with_and_without_baseline_and_baseline_reduces_variance(self):
    exact = np.asarray(jax.grad(self.expected_reward)(self.params)["score"]["w"]).ravel()
    assert np.all(np.abs(exact) > 1e-3)
    baseline, gradients = self.estimates(jax.random.key(2))
    assert abs(baseline - self.expected_reward(self.params)) < 0.5
    gradients = np.asarray(gradients, np.float64)
    for grads in (gradients[:, 0], gradients[:, 1]):  # b = 0, b = moving average
      standard_error = grads.std(axis=0) / np.sqrt(N_SAMPLES)
      np.testing.assert_array_less(np.abs(grads.mean(axis=0) - exact), 5 * standard_error + 1e-6)
    variance_without, variance_with = gradients.var(axis=0).sum(axis=-1)
    assert variance_with < 0.5 * variance_without


def test_baseline_helpers_follow_their_formulas():
  rewards = np.array([1.0, 2.0, 4.5], np.float32)
  np.testing.assert_allclose(update_moving_average_baseline(2.0, rewards, decay=0.8),
                             0.8 * 2.0 + 0.2 * rewards.mean(), rtol=1e-6)
  predicted = np.array([0.5, 2.5, 3.0], np.float32)
  grad_predicted, grad_reward = jax.grad(baseline_loss, argnums=(0, 1))(predicted, rewards)
  np.testing.assert_allclose(baseline_loss(predicted, rewards), np.mean((predicted - rewards) ** 2))
  np.testing.assert_allclose(grad_predicted, 2 * (predicted - rewards) / 3, rtol=1e-6)
  np.testing.assert_array_equal(grad_reward, 0.0)  # the reward is a target
  log_prob = np.log(np.array([0.2, 0.5, 0.9], np.float32))
  grads = jax.grad(reinforce_surrogate, argnums=(0, 1, 2))(log_prob, rewards, predicted)
  np.testing.assert_allclose(grads[0], (rewards - predicted) / 3, rtol=1e-6)
  np.testing.assert_array_equal(grads[1], 0.0)
  np.testing.assert_array_equal(grads[2], 0.0)
  with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
    update_moving_average_baseline(0.0, rewards, decay=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_straight_through_is_one_hot_forward_with_soft_gradient(temperature):
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
  cotangent = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
  mask = np.ones((6, 5), bool)
  mask[2, 1:] = False
  mask[4, :3] = False
  key = jax.random.key(5)
  gumbel = jax.random.gumbel(key, logits.shape)

  reference_soft = lambda x: jax.nn.softmax((x + gumbel) / temperature, where=mask)

  @jax.jit
  def samples_and_gradients(logits):
    hard, hard_vjp = jax.vjp(
        lambda x: gumbel_softmax(x, key, temperature=temperature, mask=mask), logits)
    soft = gumbel_softmax(logits, key, temperature=temperature, hard=False, mask=mask)
    _, reference_vjp = jax.vjp(reference_soft, logits)
    return hard, soft, hard_vjp(cotangent)[0], reference_vjp(cotangent)[0]

  hard, soft, grad_straight_through, grad_soft = samples_and_gradients(logits)
  choice = np.argmax(np.where(mask, logits + gumbel, -np.inf), axis=-1)
  np.testing.assert_array_equal(hard, np.eye(5)[choice])  # exactly one-hot
  np.testing.assert_allclose(soft, reference_soft(logits), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad_straight_through, grad_soft, rtol=1e-5, atol=1e-6)
  assert np.any(np.asarray(grad_straight_through) != 0)


def test_argmax_picks_the_largest_visible_logit_and_never_a_masked_key():
  rng = np.random.default_rng(6)
  logits = rng.standard_normal((2, 3, 5)).astype(np.float32)
  values = rng.standard_normal((2, 5, 4)).astype(np.float32)
  mask = rng.random((2, 3, 5)) < 0.6
  mask[..., 0] = True
  logits[~mask] += 10.0  # masked keys have the largest logits
  mask[1, 2] = False     # a query that sees nothing
  context, weights, index = hard_attention(jnp.asarray(logits), jnp.asarray(values),
                                           mask=jnp.asarray(mask))
  expected = np.argmax(np.where(mask, logits, -np.inf), axis=-1)
  expected[1, 2] = -1
  np.testing.assert_array_equal(index, expected)
  np.testing.assert_array_equal(weights[1, 2], 0.0)
  np.testing.assert_array_equal(context[1, 2], 0.0)
  for b, t in [(0, 0), (0, 2), (1, 1)]:
    np.testing.assert_array_equal(context[b, t], values[b, expected[b, t]])
    np.testing.assert_array_equal(weights[b, t], np.eye(5)[expected[b, t]])


@pytest.mark.parametrize("sampler", ["categorical", "gumbel"])
def test_sample_frequencies_match_the_softmax(sampler):
  logits = np.array([0.2, 1.5, 3.0, -0.5, 0.9], np.float32)
  mask = np.array([True, True, False, True, True])
  tiled, key = jnp.broadcast_to(logits, (N_SAMPLES, 5)), jax.random.key(7)
  if sampler == "categorical":
    sample = lambda x: hard_attention(x, jnp.eye(5), key=key, mode="sample", mask=mask)[1]
  else:
    sample = lambda x: gumbel_softmax(x, key, mask=mask)
  weights = jax.jit(sample)(tiled)
  counts = np.asarray(weights).sum(axis=0)
  assert counts.sum() == N_SAMPLES and counts[2] == 0
  p = numpy_masked_softmax(logits, mask)
  assert chi_square(counts[mask], p[mask]) < CHI2_3DOF_P9999


def test_module_evaluates_by_argmax_and_reports_log_probability():
  rng = np.random.default_rng(8)
  q = rng.standard_normal((2, 3, 4)).astype(np.float32)
  k = rng.standard_normal((2, 6, 4)).astype(np.float32)
  v = rng.standard_normal((2, 6, 2)).astype(np.float32)
  mask = rng.random((2, 3, 6)) < 0.7
  mask[..., 5] = True
  logits = q @ k.swapaxes(1, 2)
  for mode in ("argmax", "sample", "gumbel"):
    (context, weights, log_prob), state = jax.jit(functools.partial(
        HardAttention("dot", mode=mode).apply, mutable="intermediates"))({}, q, k, v, mask=mask)
    index = np.argmax(np.where(mask, logits, -np.inf), axis=-1)
    np.testing.assert_allclose(context, np.take_along_axis(v, index[..., None], axis=1),
                               rtol=1e-6)
    log_softmax = jax.nn.log_softmax(logits, where=mask)
    np.testing.assert_allclose(log_prob, np.take_along_axis(log_softmax, index[..., None], -1)[..., 0],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state["intermediates"]["attention_weights"][0], weights)


def test_module_samples_from_the_attention_stream_and_rejects_unknown_modes():
  q, k, v = jnp.zeros((1, 2)), jnp.zeros((8, 2)), jnp.eye(8)
  module = HardAttention("dot", mode="sample")
  weights = jax.jit(lambda rng: module.apply({}, q, k, v, train=True, rngs={"attention": rng})[1])
  picks = [int(jnp.argmax(weights(jax.random.key(i)))) for i in range(6)]
  assert len(set(picks)) > 1  # uniform over 8 keys: six equal draws has probability 8⁻⁵
  with pytest.raises(ValueError, match="mode must be one of .*'argmax', 'sample', 'gumbel'"):
    HardAttention("dot", mode="soft").apply({}, q, k, v)
  with pytest.raises(ValueError, match="needs a PRNG key"):
    hard_attention(jnp.zeros((1, 3)), jnp.eye(3), mode="sample")
