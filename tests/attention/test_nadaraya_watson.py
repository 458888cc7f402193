"""`nadaraya_watson` / `NadarayaWatson` against the formula written here in NumPy.

  u_ij = ‖q_i − k_j‖ / h,  K ∈ {exp(−u²/2), 1[u ≤ 1], max(0, 1 − u)},
  α_ij = K_ij / Σ_l K_il  (0 when the sum is 0),  out_i = Σ_j α_ij v_j
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.attention.nadaraya_watson import NadarayaWatson, nadaraya_watson

# Compared with the NumPy formula within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

SMOOTHING_KERNELS = ["gaussian", "box", "triangle"]


def numpy_nadaraya_watson(q, k, v, kernel, h):
  u = np.sqrt(np.sum((q[..., :, None, :] - k[..., None, :, :]) ** 2, axis=-1)) / h
  u_min = u.min(axis=-1, keepdims=True)  # Gaussian: exp(u_min²/2) cancels in α, avoids underflow
  kernel_values = {"gaussian": np.exp(-(u**2 - u_min**2) / 2), "box": (u <= 1).astype(np.float64),
                   "triangle": np.maximum(0, 1 - u)}[kernel]
  total = kernel_values.sum(-1, keepdims=True)
  weights = np.divide(kernel_values, total, out=np.zeros_like(kernel_values), where=total > 0)
  return weights @ v, weights


@pytest.mark.parametrize("kernel", SMOOTHING_KERNELS)
def test_matches_numpy_formula(kernel):
  rng = np.random.default_rng(0)
  q, k, v = rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 7, 2)), rng.normal(size=(3, 7, 4))
  q[0, 0] = 50.0                                  # outside every support but the Gaussian's
  out, weights = nadaraya_watson(q, k, v, kernel=kernel, bandwidth=1.3, return_weights=True)
  expected, expected_weights = numpy_nadaraya_watson(q, k, v, kernel, 1.3)
  np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
  np.testing.assert_allclose(out, expected, atol=1e-5)
  if kernel != "gaussian":
    assert 0 < np.count_nonzero(expected_weights[1:]) < expected_weights[1:].size  # support matters


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["box", "triangle"])
def test_query_outside_the_support_returns_zeros_with_finite_gradients(kernel):
  keys = jnp.linspace(0.0, 1.0, 6)[:, None]
  values = jnp.sin(keys)
  queries = jnp.array([[10.0], [0.4]])            # far from every key; exactly on a key

  def loss(queries, keys, values, bandwidth):
    return jnp.sum(nadaraya_watson(queries, keys, values, kernel=kernel, bandwidth=bandwidth) ** 2)

  out = nadaraya_watson(queries, keys, values, kernel=kernel, bandwidth=0.3)
  np.testing.assert_array_equal(out[0], 0.0)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(queries, keys, values, 0.3)
  for grad in grads:
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("kernel", ["gaussian", "triangle"])
def test_learned_bandwidth_gradient_matches_finite_differences(kernel):
  rng = np.random.default_rng(1)
  q, k, v = rng.normal(size=(4, 1)), rng.normal(size=(9, 1)), rng.normal(size=(9, 1))
  module = NadarayaWatson(kernel=kernel, init_bandwidth=1.5)
  params = module.init(jax.random.key(0), q, k, v)["params"]
  loss = lambda log_h: float(np.sum(numpy_nadaraya_watson(q, k, v, kernel, np.exp(log_h))[0] ** 2))
  grad = jax.jit(jax.grad(lambda p: jnp.sum(module.apply({"params": p}, q, k, v) ** 2)))(params)
  log_h, eps = float(params["log_bandwidth"]), 1e-4
  numeric = (loss(log_h + eps) - loss(log_h - eps)) / (2 * eps)
  assert abs(numeric) > 1e-3
  np.testing.assert_allclose(grad["log_bandwidth"], numeric, rtol=1e-2)


def test_module_sows_weights_and_fixed_bandwidth_has_no_parameter():
  rng = np.random.default_rng(2)
  q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(5, 2)), rng.normal(size=(5, 1))
  module = NadarayaWatson(kernel="triangle", learn_bandwidth=False, init_bandwidth=2.0)
  assert module.init(jax.random.key(0), q, k, v) == {}
  out, state = module.apply({}, q, k, v, mutable=["intermediates"])
  expected, expected_weights = numpy_nadaraya_watson(q, k, v, "triangle", 2.0)
  np.testing.assert_allclose(out, expected, atol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0], expected_weights,
                             atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel="epanechnikov", bandwidth=1.0), r"kernel must be one of \('gaussian', 'box', 'triangle'\)"),
    (dict(kernel="box", bandwidth=0.0), "bandwidth must be > 0"),
    (dict(kernel="gaussian", bandwidth=-1.0), "bandwidth must be > 0"),
])
def test_invalid_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    nadaraya_watson(jnp.zeros((2, 1)), jnp.zeros((3, 1)), jnp.zeros((3, 1)), **kwargs)


@pytest.mark.slow
def test_learning_the_bandwidth_lowers_the_error():
  """y = 2 sin x + x^0.8 + noise: leave-one-out training of h from an oversmoothed start."""
  rng = np.random.default_rng(0)
  n, truth = 50, lambda x: 2 * np.sin(x) + x**0.8
  x = np.sort(rng.uniform(0, 5, n)).astype(np.float32)
  y = (truth(x) + rng.normal(0, 0.5, n)).astype(np.float32)
  others = ~np.eye(n, dtype=bool)                 # query i sees every training point but i
  keys = np.broadcast_to(x, (n, n))[others].reshape(n, n - 1, 1)
  values = np.broadcast_to(y, (n, n))[others].reshape(n, n - 1, 1)
  queries = x[:, None, None]

  model = NadarayaWatson(kernel="gaussian", init_bandwidth=3.0)
  params = model.init(jax.random.key(0), queries, keys, values)
  optimizer = optax.adam(0.05)

  @jax.jit
  def train(params):
    def step(carry, _):
      params, opt_state = carry
      loss = lambda p: jnp.mean((model.apply(p, queries, keys, values)[:, 0, 0] - y) ** 2)
      updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state)
      return (optax.apply_updates(params, updates), opt_state), None
    return jax.lax.scan(step, (params, optimizer.init(params)), length=300)[0][0]

  x_test = np.arange(0, 5, 0.1, dtype=np.float32)[:, None]
  test_mse = lambda p: np.mean((model.apply(p, x_test, x[:, None], y[:, None])[:, 0]
                                - truth(x_test[:, 0])) ** 2)
  learned = train(params)
  assert float(jnp.exp(learned["params"]["log_bandwidth"])) < 1.0
  assert test_mse(learned) < 0.5 * test_mse(params)
