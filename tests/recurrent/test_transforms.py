"""The layers under jax.jit (against torch), jax.vmap (against separate calls), jax.grad
(against autodiff of flax.linen.RNN's scan over our cells), retracing, and bfloat16."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiers import long_cases
from torch_reference import (
  LENGTHS,
  B,
  D,
  H,
  P,
  T,
  check_against_torch,
  make_torch,
  our_param,
  torch_run,
)

from research.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, SimpleRNNCell, from_torch

pytestmark = [
    pytest.mark.filterwarnings("ignore:LSTM with projections is not supported"),
    pytest.mark.usefixtures("highest_precision"),  # float32 parity: no TF32 products
]

# ----------------------------------------------------------------------------------------
# jit: the compiled program (what users run) against torch, forward and gradients.


@pytest.mark.slow
@pytest.mark.parametrize("cell,proj_size,bidirectional,batch_first,use_lengths", [
    ("lstm", P, True, False, True),
    ("gru", 0, True, True, True),
    ("rnn_relu", 0, False, True, False),
], ids=["lstm_proj-bi-time_major-packed", "gru-bi-batch_first-packed", "rnn_relu-uni-batch_first-full"])
def test_jit_matches_torch(cell, proj_size, bidirectional, batch_first, use_lengths):
  check_against_torch(cell, proj_size, num_layers=2, bidirectional=bidirectional,
                      batch_first=batch_first, init_state=True,
                      lengths=LENGTHS if use_lengths else None, jit=True)


# ----------------------------------------------------------------------------------------
# vmap over an extra leading axis: equal to separate calls.


@pytest.mark.slow
@pytest.mark.long
def test_vmap_over_extra_batch_axis_forward_and_per_example_gradients():
  """jit(vmap(value_and_grad)) over x [N, B, T, D], h0, c0 and lengths == N separate calls."""
  n = 2
  module = make_torch("lstm", D, H, num_layers=1, bidirectional=True, proj_size=P)
  layer, variables = from_torch(module)
  params = variables["params"]
  rng = np.random.default_rng(0)
  randn = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  x, h0, c0 = randn(n, B, T, D), randn(n, 2, B, P), randn(n, 2, B, H)
  lengths = jnp.array([[2, 3, 1], [3, 1, 3]])

  def loss(params, x, h0, c0, lengths):
    out, (h_n, c_n) = layer.apply({"params": params}, x, initial_state=(h0, c0), seq_lengths=lengths)
    return jnp.sum(jnp.sin(out)) + jnp.sum(h_n ** 2) + jnp.sum(c_n * h_n[..., :1]), (out, h_n, c_n)

  fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
  (_, batched), grads = jax.jit(jax.vmap(fn, in_axes=(None, 0, 0, 0, 0)))(params, x, h0, c0, lengths)
  with jax.disable_jit():  # the separate calls op by op (see test_torch_parity.py)
    for i in range(n):
      (_, single), single_grads = fn(params, x[i], h0[i], c0[i], lengths[i])
      for a, b in zip(batched, single):
        np.testing.assert_allclose(a[i], b, rtol=0, atol=1e-5)
      for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(single_grads)):
        np.testing.assert_allclose(a[i], b, rtol=0, atol=1e-5 * max(1.0, np.abs(b).max()))
  assert not np.allclose(batched[0][0], batched[0][1])  # the two examples really differ


# ----------------------------------------------------------------------------------------
# grad: the fused layer's hand-written backward against autodiff of flax.linen.RNN's scan
# over the same cells (an independent gradient path), bidirectional, packed, with h0 (c0).


CELL_LAYERS = {
    "rnn_relu": (lambda: SimpleRNNCell(features=H, nonlinearity="relu"),
                 lambda **kw: RNN(hidden_size=H, nonlinearity="relu", **kw)),
    "lstm_proj": (lambda: LSTMCell(features=H, proj_size=P),
                  lambda **kw: LSTM(hidden_size=H, proj_size=P, **kw)),
    "gru": (lambda: GRUCell(features=H), lambda **kw: GRU(hidden_size=H, **kw)),
}


def flax_scan_stack(make_cell, params, x, h0, c0, lengths, num_layers):
  """Bidirectional stack of nn.RNN(cell) (flax's scan), time-major layout like torch's
  default; h0 [K, B, P], c0 [K, B, H]. Outputs past each length are set to zero."""
  x = jnp.swapaxes(x, 0, 1)  # nn.RNN is batch-major here
  valid = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
  h_n, c_n = [], []
  for k in range(num_layers):
    outputs = []
    for direction, suffix in enumerate(("", "_reverse")):
      i = 2 * k + direction
      carry = h0[i] if c0 is None else (c0[i], h0[i])
      rnn = nn.RNN(make_cell(), return_carry=True, reverse=direction == 1, keep_order=True)
      carry, ys = rnn.apply({"params": {"cell": params[f"l{k}{suffix}"]}}, x,
                            initial_carry=carry, seq_lengths=lengths)
      outputs.append(jnp.where(valid, ys, 0.0))
      h_n.append(carry if c0 is None else carry[1])
      c_n.append(None if c0 is None else carry[0])
    x = jnp.concatenate(outputs, axis=-1)
  return jnp.swapaxes(x, 0, 1), jnp.stack(h_n), None if c0 is None else jnp.stack(c_n)


@pytest.mark.slow
@pytest.mark.parametrize("name", long_cases(list(CELL_LAYERS), ("rnn_relu", "gru")))
def test_grad_matches_autodiff_of_flax_scan(name):
  make_cell, make_layer = CELL_LAYERS[name]
  num_layers, is_lstm = 1, name.startswith("lstm")
  out_size = P if name == "lstm_proj" else H
  layer = make_layer(num_layers=num_layers, bidirectional=True, batch_first=False)
  rng = np.random.default_rng(1)
  randn = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  x = randn(T, B, D)
  h0 = randn(2 * num_layers, B, out_size)
  c0 = randn(2 * num_layers, B, H) if is_lstm else None
  g_out, g_h = randn(T, B, 2 * out_size), randn(2 * num_layers, B, out_size)
  g_c = randn(2 * num_layers, B, H) if is_lstm else None
  lengths = jnp.array(LENGTHS)
  torch_name = {"lstm_proj": "lstm"}.get(name, name)
  params = from_torch(make_torch(torch_name, D, H, num_layers=num_layers, bidirectional=True,
                                 proj_size=P if name == "lstm_proj" else 0))[1]["params"]

  def loss(out, h_n, c_n):
    value = jnp.sum(out * g_out) + jnp.sum(h_n * g_h)
    return value + jnp.sum(c_n * g_c) if is_lstm else value

  def ours(params, x, h0, c0):
    out, hidden = layer.apply({"params": params}, x, initial_state=(h0, c0) if is_lstm else h0,
                              seq_lengths=lengths)
    return loss(out, *(hidden if is_lstm else (hidden, None)))

  def reference(params, x, h0, c0):
    return loss(*flax_scan_stack(make_cell, params, x, h0, c0, lengths, num_layers))

  argnums = (0, 1, 2, 3) if is_lstm else (0, 1, 2)
  with jax.disable_jit():  # op by op: the grid's shapes, already compiled
    value, grads = jax.value_and_grad(ours, argnums)(params, x, h0, c0)
    ref_value, ref_grads = jax.value_and_grad(reference, argnums)(params, x, h0, c0)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  ref_leaves, treedef = jax.tree.flatten(ref_grads)
  assert jax.tree.structure(grads) == treedef
  for ours_grad, ref_grad in zip(jax.tree.leaves(grads), ref_leaves):
    np.testing.assert_allclose(ours_grad, ref_grad, rtol=0, atol=1e-4 * max(1.0, np.abs(ref_grad).max()))


# ----------------------------------------------------------------------------------------
# No retracing on a second call with new arrays of the same shapes.


def test_jit_does_not_retrace_for_same_shapes():
  layer, params = from_torch(make_torch("gru", D, H, bidirectional=True))

  def loss(params, x, lengths):
    out, h_n = layer.apply(params, x, seq_lengths=lengths)
    return jnp.sum(out ** 2) + jnp.sum(h_n)

  chex.clear_trace_counter()
  step = jax.jit(jax.value_and_grad(chex.assert_max_traces(loss, n=1)))
  rng = np.random.default_rng(0)
  first = step(params, jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32), jnp.array([1, 3, 2]))
  second = step(params, jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32), jnp.array([3, 2, 3]))
  assert not np.allclose(first[0], second[0])  # really new inputs
  # the counter is live: a new shape needs a new trace, which it refuses
  with pytest.raises(AssertionError, match="traced"):
    step(params, jnp.zeros((B, T + 1, D)), jnp.array([1, 1, 1]))


# ----------------------------------------------------------------------------------------
# bfloat16 computation with float32 parameters.


def test_bfloat16_compute_float32_params():
  """dtype=bfloat16: float32 parameters, bfloat16 results within 2e-2 of torch's float32
  ones (outputs, states and gradients), and not merely float32 results cast at the end."""
  module = make_torch("lstm", D, H, num_layers=2, bidirectional=True, batch_first=True)
  layer32, variables = from_torch(module)
  layer16 = LSTM(hidden_size=H, num_layers=2, bidirectional=True, dtype=jnp.bfloat16)
  rng = np.random.default_rng(3)
  x = rng.standard_normal((B, T, D)).astype(np.float32)
  lengths = jnp.array(LENGTHS)

  params16 = jax.eval_shape(layer16.init, jax.random.key(0), jnp.asarray(x))["params"]
  assert jax.tree.structure(params16) == jax.tree.structure(variables["params"])
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params16))

  def loss(params, layer):
    out, (h_n, c_n) = layer.apply({"params": params}, jnp.asarray(x), seq_lengths=lengths)
    return jnp.sum(out.astype(jnp.float32)), (out, h_n, c_n)

  (_, (out16, h16, c16)), grads16 = jax.jit(jax.value_and_grad(loss, has_aux=True),
                                            static_argnums=1)(variables["params"], layer16)
  assert out16.dtype == h16.dtype == c16.dtype == jnp.bfloat16
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads16))
  g_out = np.ones(out16.shape, np.float32)
  ref = torch_run(module, x, lengths=LENGTHS, g_out=g_out, g_h=np.zeros(h16.shape, np.float32),
                  g_c=np.zeros(c16.shape, np.float32))
  for ours, name in ((out16, "out"), (h16, "h_n"), (c16, "c_n")):
    np.testing.assert_allclose(np.asarray(ours, np.float32), ref[name], rtol=0, atol=2e-2)
  for name, expected in ref["d_params"].items():
    scale = max(1.0, np.abs(expected).max())
    np.testing.assert_allclose(our_param(grads16, name), expected, rtol=0, atol=2e-2 * scale,
                               err_msg=name)
  # a genuinely lower-precision computation, not float32 results cast at the end
  with jax.disable_jit():
    out32 = layer32.apply(variables, jnp.asarray(x), seq_lengths=lengths)[0]
  assert not np.array_equal(np.asarray(out16, np.float32),
                            np.asarray(out32.astype(jnp.bfloat16), np.float32))
