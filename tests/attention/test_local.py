"""Luong local attention (local-m, local-p) against the paper's formula written out in
NumPy, gradients through p_t against central finite differences in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.attention.local import LocalAttention, local_attention_weights
from research.attention.scores import DotScore

# Compared with the NumPy formula within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

local_weights = jax.jit(local_attention_weights, static_argnums=2)


def reference_weights(logits, positions, half_window, lengths):
  """a_t(s) = align(h_t, h̄_s) · exp(−(s − p_t)² / (2σ²)), σ = D/2, one (b, t, s) at a time.

  logits [B, Q, K]; positions [B, Q]; lengths [B]. align: softmax over the window
  members s (|s − p_t| ≤ D, s < length); 0 outside.
  """
  sigma = half_window / 2
  weights = np.zeros(logits.shape)
  for b, t in np.ndindex(logits.shape[:2]):
    p = float(positions[b, t])
    window = [s for s in range(int(lengths[b])) if abs(s - p) <= half_window]
    if not window:
      continue
    align = np.exp(logits[b, t, window] - logits[b, t, window].max())
    align /= align.sum()
    for s, a in zip(window, align, strict=True):
      weights[b, t, s] = a * np.exp(-(s - p) ** 2 / (2 * sigma ** 2))
  return weights


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 2), q_len=st.integers(1, 4), kv_len=st.integers(1, 8),
       half_window=st.integers(1, 5), integer_positions=st.booleans(), use_lengths=st.booleans(),
       seed=st.integers(0, 2**16))
def test_weights_match_formula(batch, q_len, kv_len, half_window, integer_positions, use_lengths,
                               seed):
  rng = np.random.default_rng(seed)
  logits = (2 * rng.standard_normal((batch, q_len, kv_len))).astype(np.float32)
  if integer_positions:  # local-m
    positions = rng.integers(0, kv_len, (batch, q_len)).astype(np.float32)
  else:  # local-p: anywhere in (0, S)
    positions = (kv_len * rng.random((batch, q_len))).astype(np.float32)
  lengths = rng.integers(0, kv_len + 1, batch) if use_lengths else np.full(batch, kv_len)
  weights = local_weights(logits, positions, half_window, lengths if use_lengths else None)
  expected = reference_weights(logits, positions, half_window, lengths)
  np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
  # The window never leaves the sequence: nothing past its length or beyond D of p_t.
  s = np.arange(kv_len)
  outside = ((np.abs(s - positions[..., None]) > half_window)
             | (s >= lengths[:, None, None]))
  assert np.all(np.asarray(weights)[outside] == 0)
  assert np.all(np.sum(weights, -1) <= 1 + 1e-6)


def test_half_window_wider_than_sequence_is_global_attention_times_gaussian():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((2, 3, 5)).astype(np.float32)
  positions = np.array([[0.5, 2.0, 4.9], [1.0, 3.3, 0.0]], np.float32)
  weights = local_weights(logits, positions, 50, None)
  gaussian = np.exp(-(np.arange(5) - positions[..., None]) ** 2 / (2 * 25.0 ** 2))
  np.testing.assert_allclose(weights, jax.nn.softmax(logits) * gaussian, rtol=1e-5)


def numpy_sigmoid(x):
  return 1 / (1 + np.exp(-x))


B, Q, K, D_MODEL, F = 2, 4, 7, 3, 5
LENGTHS = np.array([7, 4])


def random_inputs(seed: int, dtype=np.float32):
  rng = np.random.default_rng(seed)
  h = rng.standard_normal((B, Q, D_MODEL)).astype(dtype)
  keys = rng.standard_normal((B, K, D_MODEL)).astype(dtype)
  values = rng.standard_normal((B, K, 2)).astype(dtype)
  params = {"w_p": rng.standard_normal((D_MODEL, F)).astype(dtype),
            "v_p": rng.standard_normal(F).astype(dtype)}
  return h, keys, values, params


def test_predictive_parameters_have_the_paper_shapes():
  h, keys, values, _ = random_inputs(0)
  module = LocalAttention(DotScore(), mode="predictive", half_window=2, features=F)
  shapes = jax.eval_shape(module.init, jax.random.key(0), h, keys, values)["params"]
  assert {n: p.shape for n, p in shapes.items()} == {"w_p": (D_MODEL, F), "v_p": (F,)}


@pytest.mark.parametrize("use_lengths", [False, True])
def test_local_m_matches_formula(use_lengths):
  h, keys, values, _ = random_inputs(1)
  lengths = LENGTHS if use_lengths else np.full(B, K)
  module = LocalAttention("dot", mode="monotonic", half_window=2)
  (context, weights), state = module.apply(
      {}, h, keys, values, kv_lengths=lengths if use_lengths else None,
      mutable="intermediates")
  positions = np.minimum(np.arange(Q)[None, :], lengths[:, None] - 1)  # p_t = t, clipped
  expected = reference_weights(h @ keys.swapaxes(1, 2), positions, 2, lengths)
  np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(context, expected @ values, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(state["intermediates"]["attention_weights"][0], weights)


def test_local_m_given_decoder_steps_are_clipped_to_the_source():
  h, keys, values, _ = random_inputs(2)
  steps = np.array([[9, 0, 3, 5], [1, 6, 2, 8]])
  module = LocalAttention(DotScore(), mode="monotonic", half_window=1)
  _, weights = module.apply({}, h, keys, values, query_positions=steps, kv_lengths=LENGTHS)
  positions = np.minimum(steps, LENGTHS[:, None] - 1)
  expected = reference_weights(h @ keys.swapaxes(1, 2), positions, 1, LENGTHS)
  np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)


def predicted_positions(h, params, lengths):
  """p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)), S each sequence's length."""
  return lengths[:, None] * numpy_sigmoid(np.tanh(h @ params["w_p"]) @ params["v_p"])


@pytest.mark.parametrize("use_lengths", [False, True])
def test_local_p_matches_formula(use_lengths):
  h, keys, values, params = random_inputs(3)
  lengths = LENGTHS if use_lengths else np.full(B, K)
  module = LocalAttention(DotScore(), mode="predictive", half_window=2, features=F)
  context, weights = module.apply({"params": params}, h, keys, values,
                                  kv_lengths=lengths if use_lengths else None)
  positions = predicted_positions(h.astype(np.float64), params, lengths)
  expected = reference_weights(h @ keys.swapaxes(1, 2), positions, 2, lengths)
  np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(context, expected @ values, rtol=1e-4, atol=1e-6)


def test_local_p_gradient_reaches_w_p_and_v_p_and_matches_finite_differences():
  with jax.enable_x64(True):
    h, keys, values, params = random_inputs(4, np.float64)
    cotangent = np.random.default_rng(5).standard_normal((B, Q, 2))
    module = LocalAttention(DotScore(), mode="predictive", half_window=2, features=F)

    @jax.jit
    def loss(params):
      context, _ = module.apply({"params": params}, h, keys, values, kv_lengths=LENGTHS)
      return jnp.sum(context * cotangent)

    grads = jax.grad(loss)(params)
    eps = 1e-6
    for name, value in params.items():
      assert grads[name].dtype == np.float64
      assert np.all(np.abs(grads[name]) > 0), name
      numeric = np.zeros_like(value)
      for i in np.ndindex(value.shape):
        step = np.zeros_like(value)
        step[i] = eps
        numeric[i] = (loss({**params, name: value + step})
                      - loss({**params, name: value - step})) / (2 * eps)
      np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_invalid_arguments_name_the_allowed_values():
  h, keys, values, params = random_inputs(6)
  with pytest.raises(ValueError, match="mode must be one of .*'monotonic', 'predictive'"):
    LocalAttention("dot", mode="local").apply({}, h, keys, values)
  with pytest.raises(ValueError, match="half_window must be an int D ≥ 1"):
    local_attention_weights(jnp.zeros((2, 3)), jnp.zeros(2), 0)
  with pytest.raises(ValueError, match="query_positions is for mode='monotonic'"):
    LocalAttention("dot", mode="predictive", features=F).apply(
        {"params": params}, h, keys, values, query_positions=np.arange(Q))
