"""Dropout between layers, as torch.nn.LSTM(dropout=p): on the outputs of every layer but
the last, only in training.

Torch's training-mode masks come from its own generator, so the training-mode result is
checked by rebuilding the stack from torch: torch layer k (its weights, run alone as a
one-layer module) applied to what our layer k-1 passed on after dropout must give our
layer k's output, and the passed-on tensor must be our layer k-1's output with a 0/1
mask and scaling 1/(1-p)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_reference import CELLS, B, D, H, T, make_torch, torch_run

from research.recurrent import LSTM, from_torch

# Compared with torch's float32 results within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

P_DROP = 0.5


@pytest.fixture(autouse=True)
def op_by_op():
  """Op by op (see test_torch_parity.py): the shapes are the grid's, already compiled."""
  with jax.disable_jit():
    yield


def inputs(module, seed=0):
  rng = np.random.default_rng(seed)
  shape = (B, T, module.input_size) if module.batch_first else (T, B, module.input_size)
  return rng.standard_normal(shape).astype(np.float32)


def ours(layer, variables, x, **kwargs):
  out, hidden = layer.apply(variables, jnp.asarray(x), **kwargs)
  h_n, c_n = hidden if isinstance(hidden, tuple) else (hidden, None)
  return np.asarray(out), np.asarray(h_n), None if c_n is None else np.asarray(c_n)


@pytest.mark.parametrize("cell", CELLS)
def test_eval_mode_matches_torch_eval(cell):
  module = make_torch(cell, D, H, num_layers=3, bidirectional=True, dropout=P_DROP).eval()
  layer, variables = from_torch(module)
  assert layer.dropout == P_DROP
  x = inputs(module)
  ref = torch_run(module, x)
  for kwargs in ({}, {"train": False}):  # train defaults to False
    out, h_n, c_n = ours(layer, variables, x, **kwargs)
    np.testing.assert_allclose(out, ref["out"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(h_n, ref["h_n"], rtol=0, atol=1e-5)
    if c_n is not None:
      np.testing.assert_allclose(c_n, ref["c_n"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_train_with_zero_dropout_matches_torch_train(cell):
  module = make_torch(cell, D, H, num_layers=3, batch_first=False, dropout=0.0).train()
  layer, variables = from_torch(module)
  x = inputs(module)
  ref = torch_run(module, x)
  out, h_n, _ = ours(layer, variables, x, train=True, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_allclose(out, ref["out"], rtol=0, atol=1e-5)
  np.testing.assert_allclose(h_n, ref["h_n"], rtol=0, atol=1e-5)


def test_train_depends_on_the_key_and_only_on_it():
  module = make_torch("lstm", D, H, num_layers=3, dropout=P_DROP)
  layer, variables = from_torch(module)
  x = inputs(module)
  run = lambda key: ours(layer, variables, x, train=True, rngs={"dropout": jax.random.key(key)})
  first, again, other = run(0), run(0), run(1)
  evaluation = ours(layer, variables, x, train=False)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(first[0], other[0])
  assert not np.allclose(first[0], evaluation[0])


def test_no_dropout_after_the_only_layer():
  """One layer: nothing comes after the last layer, so even p = 0.9 changes nothing."""
  module = make_torch("lstm", D, H, num_layers=1, bidirectional=True)
  _, variables = from_torch(module)
  layer = LSTM(hidden_size=H, num_layers=1, bidirectional=True, dropout=0.9)
  x = inputs(module)
  trained = ours(layer, variables, x, train=True, rngs={"dropout": jax.random.key(0)})
  ref = torch_run(module, x)
  for a, name in zip(trained, ("out", "h_n", "c_n")):
    np.testing.assert_allclose(a, ref[name], rtol=0, atol=1e-5)


def _single_layer(module, k, input_size):
  """Torch layer k of `module` (both directions) as a one-layer module with its weights."""
  kwargs = dict(num_layers=1, batch_first=module.batch_first, bidirectional=module.bidirectional)
  single = type(module)(input_size, module.hidden_size, **kwargs)
  with torch.no_grad():
    for name, value in single.named_parameters():
      value.copy_(getattr(module, name.replace("_l0", f"_l{k}")))
  return single


@pytest.mark.slow
@pytest.mark.parametrize("cell,bidirectional,batch_first", [   # two in the long tier
    pytest.param("lstm", True, False, marks=pytest.mark.long),
    pytest.param("gru", False, True, marks=pytest.mark.long), ("rnn_tanh", True, True)])
def test_train_mode_layer_by_layer_against_torch(cell, bidirectional, batch_first):
  num_layers = 3
  module = make_torch(cell, D, H, num_layers=num_layers, bidirectional=bidirectional,
                      batch_first=batch_first, dropout=P_DROP)
  layer, variables = from_torch(module)
  x = inputs(module)
  capture = lambda mdl, method: method in ("__call__", "sequence")
  (out, hidden), state = layer.apply(variables, jnp.asarray(x), train=True,
                                     rngs={"dropout": jax.random.key(0)},
                                     capture_intermediates=capture, mutable=["intermediates"])
  h_n = hidden[0] if isinstance(hidden, tuple) else hidden
  inter = state["intermediates"]

  # exactly num_layers - 1 dropout applications
  dropouts = sorted(name for name in inter if name.startswith("Dropout"))
  assert len(dropouts) == num_layers - 1

  def layer_output(k):  # our layer k's recurrent outputs, directions concatenated
    names = [f"l{k}"] + ([f"l{k}_reverse"] if bidirectional else [])
    return np.concatenate([np.asarray(inter[n]["sequence"][0][0]) for n in names], axis=-1)

  masks = []
  layer_input = x
  for k in range(num_layers):
    # torch's layer k on exactly what our stack fed to layer k
    single = _single_layer(module, k, layer_input.shape[-1])
    ref = torch_run(single, layer_input)
    np.testing.assert_allclose(layer_output(k), ref["out"], rtol=0, atol=1e-5)
    dirs = 2 if bidirectional else 1
    np.testing.assert_allclose(np.asarray(h_n)[k * dirs:(k + 1) * dirs], ref["h_n"], rtol=0, atol=1e-5)
    if k == num_layers - 1:
      break
    # what layer k+1 received: layer k's output, each entry dropped or scaled by 1/(1-p)
    passed = np.asarray(inter[f"Dropout_{k}"]["__call__"][0])
    y = layer_output(k)
    kept = passed != 0.0
    np.testing.assert_allclose(passed[kept], y[kept] / (1.0 - P_DROP), rtol=1e-6, atol=1e-7)
    assert 0.2 < kept.mean() < 0.8
    masks.append(kept)
    layer_input = passed

  # the last layer's output is returned as is: no dropout after it
  np.testing.assert_array_equal(np.asarray(out), layer_output(num_layers - 1))
  # each layer draws its own mask
  assert not np.array_equal(masks[0], masks[1])
