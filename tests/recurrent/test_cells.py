"""The single-step cells: torch.nn.*Cell parity inside flax.linen.RNN, agreement with the
fused layers, the equations written out in NumPy, carries and initialisation.

Everything runs op by op (`jax.disable_jit()`) at the shapes of test_torch_parity.py, whose
small operations are then already compiled; test_transforms.py covers compiled code."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_reference import LENGTHS, B, D, H, P, T, make_torch, torch_run

from research.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, SimpleRNNCell

torch.set_num_threads(1)


pytestmark = [
    pytest.mark.filterwarnings("ignore:LSTM with projections is not supported"),
    pytest.mark.usefixtures("highest_precision"),  # float32 parity: no TF32 products
]

CELLS = {  # name: (our cell, fused layer with the same cell as l0)
    "rnn_tanh": (lambda: SimpleRNNCell(features=H), lambda: RNN(hidden_size=H)),
    "rnn_relu": (lambda: SimpleRNNCell(features=H, nonlinearity="relu"),
                 lambda: RNN(hidden_size=H, nonlinearity="relu")),
    "lstm": (lambda: LSTMCell(features=H), lambda: LSTM(hidden_size=H)),
    "lstm_proj": (lambda: LSTMCell(features=H, proj_size=P),
                  lambda: LSTM(hidden_size=H, proj_size=P)),
    "gru": (lambda: GRUCell(features=H), lambda: GRU(hidden_size=H)),
}


@pytest.fixture(autouse=True)
def op_by_op():
  with jax.disable_jit():
    yield


def key(seed):
  """A PRNG key whose bits are one XLA op: op by op, threefry's many small operations would
  each be compiled for every new parameter shape. The initialisers only see `key`."""
  return jax.random.key(seed, impl="unsafe_rbg")


def randn(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def out_size(name):
  return P if name == "lstm_proj" else H


def random_carry(name, rng, batch=(B,)):
  """Ours: h [B, P] for RNN / GRU, (c [B, H], h [B, P]) for LSTM."""
  if name.startswith("lstm"):
    return (randn(rng, *batch, H), randn(rng, *batch, out_size(name)))
  return randn(rng, *batch, H)


def torch_cell_params(module, suffix=""):
  """Our cell parameters from a torch cell (suffix "") or a torch layer (suffix "_l0")."""
  get = lambda name: getattr(module, name + suffix).detach().numpy()
  params = {"kernel_ih": get("weight_ih").T, "kernel_hh": get("weight_hh").T,
            "bias_ih": get("bias_ih"), "bias_hh": get("bias_hh")}
  if hasattr(module, "weight_hr" + suffix):
    params["kernel_hr"] = get("weight_hr").T
  return params


# ----------------------------------------------------------------------------------------
# Inside flax.linen.RNN (flax's own scan over single steps).


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rnn_tanh", "rnn_relu", "lstm", "gru"])
def test_cell_in_flax_rnn_matches_torch_cell_and_fused_layer(name):
  """nn.RNN(our cell) == torch.nn.RNNCell / LSTMCell / GRUCell stepped by hand, with
  weights copied from the torch cell; and == our fused layer with {'l0': those params}."""
  torch.manual_seed(0)
  if name.startswith("rnn"):
    cell = torch.nn.RNNCell(D, H, nonlinearity=name[4:])
  else:
    cell = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}[name](D, H)
  rng = np.random.default_rng(0)
  x = randn(rng, B, T, D)
  carry0 = random_carry(name, rng)

  # torch, one step at a time; torch's LSTMCell state is (h, c), ours (c, h)
  state = (torch.tensor(carry0[1]), torch.tensor(carry0[0])) if name == "lstm" else torch.tensor(carry0)
  torch_out = []
  with torch.no_grad():
    for t in range(T):
      state = cell(torch.tensor(x[:, t]), state)
      torch_out.append((state[0] if name == "lstm" else state).numpy())
  torch_out = np.stack(torch_out, axis=1)
  torch_carry = (state[1].numpy(), state[0].numpy()) if name == "lstm" else state.numpy()

  params = torch_cell_params(cell)
  make_cell, make_layer = CELLS[name]
  carry, out = nn.RNN(make_cell(), return_carry=True).apply(
      {"params": {"cell": params}}, jnp.asarray(x), initial_carry=jax.tree.map(jnp.asarray, carry0))
  np.testing.assert_allclose(out, torch_out, rtol=0, atol=1e-5)
  for ours, ref in zip(jax.tree.leaves(carry), jax.tree.leaves(torch_carry)):
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)

  h0 = (carry0[1] if name == "lstm" else carry0)[None]
  state0 = (h0, carry0[0][None]) if name == "lstm" else h0
  fused_out, hidden = make_layer().apply({"params": {"l0": params}}, jnp.asarray(x),
                                         initial_state=state0)
  np.testing.assert_allclose(fused_out, out, rtol=0, atol=1e-5)
  h_n = hidden[0] if name == "lstm" else hidden
  np.testing.assert_allclose(h_n[0], torch_carry[1] if name == "lstm" else torch_carry, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CELLS))
def test_flax_rnn_with_lengths_equals_fused_layer(name):
  """nn.RNN(cell, seq_lengths) (flax's own padding logic) == the fused layer with
  seq_lengths: outputs on valid steps (ours are zero past the end) and final carries;
  weights from a one-layer torch module, whose packed-sequence run both must equal."""
  module = make_torch("lstm" if name == "lstm_proj" else name, D, H,
                      proj_size=P if name == "lstm_proj" else 0)
  params = torch_cell_params(module, "_l0")
  rng = np.random.default_rng(1)
  x = randn(rng, B, T, D)
  carry0 = random_carry(name, rng)
  lengths = jnp.array(LENGTHS)
  make_cell, make_layer = CELLS[name]
  carry, out = nn.RNN(make_cell(), return_carry=True).apply(
      {"params": {"cell": params}}, jnp.asarray(x), initial_carry=jax.tree.map(jnp.asarray, carry0),
      seq_lengths=lengths)

  is_lstm = name.startswith("lstm")
  h0 = (carry0[1] if is_lstm else carry0)[None]
  state0 = (h0, carry0[0][None]) if is_lstm else h0
  fused_out, hidden = make_layer().apply({"params": {"l0": params}}, jnp.asarray(x),
                                         initial_state=state0, seq_lengths=lengths)
  valid = (np.arange(T)[None, :] < np.asarray(LENGTHS)[:, None])[..., None]
  np.testing.assert_array_equal(np.where(valid, 0.0, fused_out), 0.0)
  np.testing.assert_allclose(fused_out, np.where(valid, out, 0.0), rtol=0, atol=1e-5)
  fused_carry = (hidden[1][0], hidden[0][0]) if is_lstm else hidden[0]
  for ours, ref in zip(jax.tree.leaves(fused_carry), jax.tree.leaves(carry)):
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)

  ref = torch_run(module, x, h0=h0, c0=carry0[0][None] if is_lstm else None, lengths=LENGTHS)
  np.testing.assert_allclose(fused_out, ref["out"], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------
# One call of the cell against the equations written out here (float64 NumPy).


def sigmoid(a):
  return 1.0 / (1.0 + np.exp(-a))


def numpy_step(name, p, carry, x):
  """PyTorch's documented equations, with torch-layout weights W = kernel.T."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  x = np.asarray(x, np.float64)
  w_ih, w_hh, b_ih, b_hh = p["kernel_ih"].T, p["kernel_hh"].T, p["bias_ih"], p["bias_hh"]
  if name.startswith("rnn"):
    h = np.asarray(carry, np.float64)
    pre = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
    h_new = np.tanh(pre) if name == "rnn_tanh" else np.maximum(pre, 0.0)
    return h_new, h_new
  if name.startswith("lstm"):
    c, h = (np.asarray(a, np.float64) for a in carry)
    W_ii, W_if, W_ig, W_io = np.split(w_ih, 4, axis=0)
    W_hi, W_hf, W_hg, W_ho = np.split(w_hh, 4, axis=0)
    b_ii, b_if, b_ig, b_io = np.split(b_ih, 4)
    b_hi, b_hf, b_hg, b_ho = np.split(b_hh, 4)
    i = sigmoid(x @ W_ii.T + b_ii + h @ W_hi.T + b_hi)
    f = sigmoid(x @ W_if.T + b_if + h @ W_hf.T + b_hf)
    g = np.tanh(x @ W_ig.T + b_ig + h @ W_hg.T + b_hg)
    o = sigmoid(x @ W_io.T + b_io + h @ W_ho.T + b_ho)
    c_new = f * c + i * g
    h_new = o * np.tanh(c_new)
    if "kernel_hr" in p:
      w_hr = p["kernel_hr"].T              # torch's weight_hr [P, H]
      h_new = h_new @ w_hr.T
    return (c_new, h_new), h_new
  h = np.asarray(carry, np.float64)
  W_ir, W_iz, W_in = np.split(w_ih, 3, axis=0)
  W_hr, W_hz, W_hn = np.split(w_hh, 3, axis=0)
  b_ir, b_iz, b_in = np.split(b_ih, 3)
  b_hr, b_hz, b_hn = np.split(b_hh, 3)
  r = sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
  z = sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
  n = np.tanh(x @ W_in.T + b_in + r * (h @ W_hn.T + b_hn))
  h_new = (1.0 - z) * n + z * h
  return h_new, h_new


@pytest.mark.parametrize("name", list(CELLS))
def test_one_step_matches_numpy_equations(name):
  rng = np.random.default_rng(2)
  gates = {"rnn": 1, "lstm": 4, "gru": 3}[name.split("_")[0]]
  shapes = {"kernel_ih": (D, gates * H), "kernel_hh": (out_size(name), gates * H),
            "bias_ih": (gates * H,), "bias_hh": (gates * H,)}
  if name == "lstm_proj":
    shapes["kernel_hr"] = (H, P)
  params = {k: 0.5 * randn(rng, *shape) for k, shape in shapes.items()}
  x = randn(rng, B, D)
  carry = random_carry(name, rng)
  new_carry, out = CELLS[name][0]().apply({"params": params}, jax.tree.map(jnp.asarray, carry),
                                          jnp.asarray(x))
  expected_carry, expected_out = numpy_step(name, params, carry, x)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
  assert jax.tree.structure(new_carry) == jax.tree.structure(jax.tree.map(jnp.asarray, carry))
  for ours, expected in zip(jax.tree.leaves(new_carry), jax.tree.leaves(expected_carry)):
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
  if name == "rnn_relu":  # the test really reaches relu's cut-off
    assert np.any(expected_out == 0.0) and np.any(expected_out > 0.0)


# ----------------------------------------------------------------------------------------
# Carries and initialisation.


@pytest.mark.parametrize("batch", [(B,), (2, B), ()], ids=["1d", "2d", "unbatched"])
@pytest.mark.parametrize("name", list(CELLS))
def test_initialize_carry(name, batch):
  cell = CELLS[name][0]()
  carry = cell.initialize_carry(key(0), batch + (D,))
  if name.startswith("lstm"):
    assert isinstance(carry, tuple) and len(carry) == 2
    c, h = carry
    assert c.shape == batch + (H,) and h.shape == batch + (out_size(name),)
  else:
    assert carry.shape == batch + (H,)
  for leaf in jax.tree.leaves(carry):
    assert leaf.dtype == jnp.float32
    np.testing.assert_array_equal(leaf, 0.0)


@pytest.mark.parametrize("name", list(CELLS))
def test_initialize_carry_is_what_a_step_takes_and_returns(name):
  cell = CELLS[name][0]()
  x = jnp.ones((B, D))
  carry = cell.initialize_carry(key(0), x.shape)
  shapes = jax.eval_shape(cell.init, key(1), carry, x)
  rng = np.random.default_rng(3)
  params = jax.tree.map(lambda s: jnp.asarray(randn(rng, *s.shape)), shapes)
  new_carry, y = cell.apply(params, carry, x)
  assert jax.tree.map(jnp.shape, new_carry) == jax.tree.map(jnp.shape, carry)
  assert y.shape == (B, out_size(name))
  assert not np.allclose(y, 0.0)


@pytest.mark.slow
def test_default_init_is_torch_uniform():
  """U(-1/√H, 1/√H) for every weight and bias (torch's reset_parameters), H ≠ D: bounds,
  spread, mean 0 and standard deviation b/√3 on a cell large enough to measure them."""
  hidden, inputs = 64, 48
  bound = 1.0 / math.sqrt(hidden)
  cell = GRUCell(features=hidden)
  x = jnp.zeros((2, inputs))
  params = cell.init(key(0), cell.initialize_carry(key(1), x.shape), x)["params"]
  assert set(params) == {"kernel_ih", "kernel_hh", "bias_ih", "bias_hh"}
  assert params["kernel_ih"].shape == (inputs, 3 * hidden)
  for name, value in params.items():
    value = np.asarray(value)
    assert value.dtype == np.float32
    assert np.all(np.abs(value) <= bound), name
    assert np.max(np.abs(value)) > 0.9 * bound, name
    if value.size >= 1000:  # uniform on [-b, b]: mean 0, std b/√3
      assert abs(value.mean()) < 0.1 * bound, name
      assert abs(value.std() - bound / math.sqrt(3)) < 0.05 * bound, name


@pytest.mark.slow
@pytest.mark.long
def test_layer_default_init_is_torch_uniform():
  """Every cell of a layer, the projection included, gets its own U(-1/√H, 1/√H) draw."""
  bound = 1.0 / math.sqrt(H)
  layer = LSTM(hidden_size=H, num_layers=2, bidirectional=True, proj_size=P)
  params = layer.init(key(0), jnp.zeros((B, T, D)))["params"]
  assert set(params) == {"l0", "l0_reverse", "l1", "l1_reverse"}
  for cell in params.values():
    assert set(cell) == {"kernel_ih", "kernel_hh", "bias_ih", "bias_hh", "kernel_hr"}
    leaves = np.concatenate([np.ravel(leaf) for leaf in cell.values()])
    assert np.all(np.abs(leaves) <= bound) and np.max(np.abs(leaves)) > 0.9 * bound
  assert not np.allclose(params["l1"]["kernel_hh"], params["l1_reverse"]["kernel_hh"])
  assert not np.allclose(params["l0"]["kernel_hh"], params["l1"]["kernel_hh"])
  assert not np.allclose(params["l0"]["bias_ih"], params["l0"]["bias_hh"])
