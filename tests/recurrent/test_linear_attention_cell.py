"""LinearAttentionCell: retention from the PyPI package yet-another-retnet as the reference
(its parallel form with the decay mask, and its recurrent form's state), causal linear
attention written here in its quadratic attention form (Katharopoulos et al. 2020, eq. 9,
with a decay mask as RetNet's), and the forms, padding and causality against each other;
the LinearAttention layer (the cell over sequences, both directions) against that form."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from linear_checks import (
  FORWARD_TOL,
  assert_causal,
  assert_gradients_agree,
  assert_padding_is_each_sequence_alone,
  assert_parallel_equals_stepwise,
  assert_steps_equal_sequence,
  compiled,
  key,
  randn,
)

from research.recurrent import LinearAttention, LinearAttentionCell, retnet_decay

retention = pytest.importorskip("yet_another_retnet.retention")
pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, D, M = 2, 6, 4, 2       # batch, time, input width, heads (head size D / M = 2)


@compiled
def run(module, variables, x, **kwargs):
  return module.apply(variables, x, method="sequence", **kwargs)


@compiled
def step(module, variables, carry, x_t):
  return module.apply(variables, carry, x_t)


@compiled
def init(module, rng, x):
  return module.init(rng, module.initialize_carry(None, x.shape), x)


def make(**kwargs):
  module = LinearAttentionCell(num_heads=M, chunk_size=4, **kwargs)
  variables = init(module.clone(mode="parallel"), key(0), jnp.zeros((B, D)))
  # non-zero biases, so that a wrong bias would show
  variables = jax.tree.map(lambda p: p + 0.1 * randn(p.size, *p.shape), variables)
  return module, variables


def attention_form(params, x, decay, eps):
  """Causal linear attention as attention: o_t = Σ_{s≤t} γ^{t−s} (φ(q_t)·φ(k_s)) v_s /
  (Σ_{s≤t} γ^{t−s} φ(q_t)·φ(k_s) + ε), φ = elu + 1, then the output projection."""
  p = {name: np.asarray(value, np.float64) for name, value in params.items()}
  x = np.asarray(x, np.float64)
  phi = lambda u: np.where(u > 0, u + 1.0, np.exp(u))
  heads, size = p["qkv_kernel"].shape[2:]
  qkv = [x @ p["qkv_kernel"][:, i].reshape(x.shape[-1], -1) + p["qkv_bias"][i].reshape(-1)
         for i in range(3)]
  q, k, v = (a.reshape(*x.shape[:2], heads, size) for a in qkv)
  t = np.arange(x.shape[1])
  distance = t[:, None] - t[None, :]
  y = np.zeros(x.shape[:2] + (heads, size))
  for m in range(heads):
    mask = np.where(distance >= 0, decay[m] ** np.maximum(distance, 0), 0.0)    # [t, s]
    weights = np.einsum("btd,bsd->bts", phi(q[:, :, m]), phi(k[:, :, m])) * mask
    y[:, :, m] = (weights @ v[:, :, m]) / (weights.sum(-1, keepdims=True) + eps)
  return y.reshape(*x.shape[:2], -1) @ p["out_kernel"].reshape(heads * size, -1) + p["out_bias"]


@pytest.mark.parametrize("decay", [None, (0.9, 0.5)], ids=["katharopoulos", "decay"])
def test_matches_the_attention_form(decay):
  module, variables = make(decay=decay)
  x = randn(0, B, T, D)
  y, _ = run(module, variables, x)
  expected = attention_form(variables["params"], x, decay or (1.0,) * M, module.eps)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_retention_matches_yet_another_retnet():
  """φ = identity, no normaliser, RetNet's decays: retention. q, k, v are the input's
  three parts (identity projections; k scaled by 1/√d as RetNet)."""
  size = 2
  width = 3 * M * size
  gammas = retention._build_decay_gammas(M).tolist()
  module = LinearAttentionCell(num_heads=M, qkv_features=M * size, out_features=M * size,
                               decay=tuple(gammas), feature_map="identity", normalize=False,
                               use_bias=False)
  scale = np.array([1.0, 1.0 / math.sqrt(size), 1.0])[:, None, None]
  params = {"qkv_kernel": np.eye(width, dtype=np.float32).reshape(width, 3, M, size) * scale,
            "out_kernel": np.eye(M * size, dtype=np.float32).reshape(M, size, M * size)}
  x = randn(0, B, T, width)
  y, carry = run(module, {"params": params}, x)

  q, k, v = (torch.tensor(x.reshape(B, T, 3, M, size)[:, :, i]).transpose(1, 2) for i in range(3))
  expected, _ = retention.retention_parallel(q, k, v)           # [B, M, T, size]
  np.testing.assert_allclose(y, expected.transpose(1, 2).reshape(B, T, -1).numpy(),
                             rtol=FORWARD_TOL, atol=FORWARD_TOL)
  state = None
  for t in range(T):
    _, state = retention.retention_recurrent(q[:, :, t], k[:, :, t], v[:, :, t], state)
  np.testing.assert_allclose(carry[..., :-1], state.numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
  assert gammas == pytest.approx(retnet_decay(M), abs=0.02)   # ours: 1 − 2^(−5−m)


def test_parallel_equals_stepwise_with_lengths_and_initial_state():
  module, variables = make(decay=(0.9, 0.5))
  carry = np.abs(randn(5, B, M, D // M, D // M + 1))      # z > 0, as any reached carry
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, D),
                                  seq_lengths=jnp.array([T, 3]), initial_state=carry)


def test_gradients_of_the_two_forms_agree():
  module, variables = make(decay=(0.9, 0.5))
  assert_gradients_agree(run, module, variables, randn(0, B, T, D))


def test_steps_equal_the_sequence():
  """__call__, one step with a carry (the flax.linen.RNNCellBase contract), T times."""
  module, variables = make(decay=(0.9, 0.5))
  carry = np.abs(randn(5, B, M, D // M, D // M + 1))
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, D), carry)


def test_padding_equals_each_sequence_alone():
  module, variables = make()
  assert_padding_is_each_sequence_alone(run, module, variables, randn(0, B, T, D), [T, 2])


def test_causal():
  module, variables = make()
  assert_causal(run, module, variables, randn(0, B, T, D), t0=3)


def test_bfloat16_computation():
  module, variables = make()
  x = randn(0, B, T, D)
  y, carry = run(module.clone(dtype=jnp.bfloat16), variables, x)
  y32, _ = run(module, variables, x)
  assert y.dtype == jnp.bfloat16 and carry.dtype == jnp.float32
  np.testing.assert_allclose(y.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=3), "num_heads must be a positive int dividing qkv_features=4"),
    (dict(decay=(0.9,)), "decay must be None or num_heads=2 values in"),
    (dict(decay=(0.9, 1.5)), "decay must be None or num_heads=2 values in"),
    (dict(feature_map="softmax"), r"feature_map must be one of \('elu_plus_one', 'identity'\)"),
    (dict(mode="serial"), "mode must be one of"),
])
def test_bad_config_is_refused(kwargs, message):
  module = LinearAttentionCell(**{"num_heads": M, **kwargs})
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((B, T, D)),
                                       method="sequence"))


def test_wrong_initial_state_is_refused():
  module, variables = make()
  with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 2, 3\)"):
    jax.eval_shape(lambda: run(module, variables, jnp.zeros((B, T, D)),
                               initial_state=jnp.zeros((B, M, 2, 2))))


@pytest.mark.parametrize("decay", ["none", "retnet"])
def test_the_bidirectional_layer_adds_a_cell_reading_each_sequence_from_its_end(decay):
  """LinearAttention(bidirectional): the attention form over each sequence's valid steps,
  plus the reverse cell's attention form over them in reverse order; zeros past a length."""
  layer = LinearAttention(state_size=D // M, decay=decay, bidirectional=True, chunk_size=4)
  x, lengths = randn(0, B, T, D), np.array([T, 4])
  variables = layer.init(key(0), x)
  variables = jax.tree.map(lambda p: p + 0.1 * randn(p.size, *p.shape), variables)
  y, state = layer.apply(variables, x, seq_lengths=jnp.asarray(lengths))
  params = variables["params"]
  decays = retnet_decay(M) if decay == "retnet" else (1.0,) * M
  eps = LinearAttentionCell.eps
  for b, n in enumerate(lengths):
    valid = x[b:b + 1, :n]
    forward = attention_form(params["cell"], valid, decays, eps)
    backward = attention_form(params["reverse"], valid[:, ::-1], decays, eps)[:, ::-1]
    np.testing.assert_allclose(y[b, :n], (forward + backward)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y[b, n:], 0.0)
  assert state.shape == (2, B, M, D // M, D // M + 1)


def test_the_layer_refuses_a_head_size_that_does_not_divide_the_width():
  with pytest.raises(ValueError, match="state_size=3 \\(the heads' size\\) must divide the width, 4"):
    LinearAttention(state_size=3).init(key(0), randn(0, B, T, D))
