"""Acceptance grid: `from_torch(module)` reproduces torch.nn.RNN / LSTM / GRU.

Forward (outputs, h_n, c_n within 1e-5) and gradients (d/dx, d/dh0, d/dc0 and d/d every
torch parameter within 1e-4) against torch's own autograd, for every cell (× proj_size) ×
num_layers × direction × packed lengths, each with one of the four layouts × initial
states in turn (GRID: every pair of values of any two factors, and every triple of the
five besides the cell, is in it; the full product is four times as long for no pair more);
with lengths, torch runs on `pack_padded_sequence(..., enforce_sorted=False)`.

The grid runs our side op by op (`jax.disable_jit()`, see `torch_reference.ours_run`) so
that its 60 configurations do not each pay an XLA compilation; `test_transforms.py`
checks the compiled (jit) path against torch too.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import long_cases
from torch_reference import (
  LENGTHS,
  B,
  D,
  H,
  P,
  T,
  assert_close,
  assert_matches_torch,
  check_against_torch,
  make_torch,
  our_param,
  our_param_path,
  ours_run,
  random_inputs,
  torch_run,
)

from research.recurrent import GRU, LSTM, RNN, from_torch

pytestmark = [
    pytest.mark.filterwarnings("ignore:LSTM with projections is not supported"),
    pytest.mark.usefixtures("highest_precision"),  # float32 parity: no TF32 products
]

CELL_CONFIGS = [("rnn_tanh", 0), ("rnn_relu", 0), ("lstm", 0), ("lstm", P), ("gru", 0)]
CELL_IDS = ["rnn_tanh", "rnn_relu", "lstm", f"lstm_proj{P}", "gru"]


check = check_against_torch


LAYOUTS_AND_STATES = list(itertools.product((False, True), (False, True)))  # batch_first, h0
GRID = [(*cell, num_layers, bidirectional, *LAYOUTS_AND_STATES[(i + i // 4) % 4], use_lengths)
        for i, (cell, num_layers, bidirectional, use_lengths) in enumerate(itertools.product(
            CELL_CONFIGS, (1, 2, 3), (False, True), (False, True)))]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(
    "cell,proj_size,num_layers,bidirectional,batch_first,init_state,use_lengths", GRID,
    ids=["-".join([CELL_IDS[CELL_CONFIGS.index((c, p))], f"{n}layers", "bi" if b else "uni",
                   "batch_first" if f else "time_major", "h0" if h else "zero_state",
                   "packed" if u else "full"]) for c, p, n, b, f, h, u in GRID])
def test_grid_forward_and_gradients(cell, proj_size, num_layers, bidirectional, batch_first,
                                    init_state, use_lengths):
  check(cell, proj_size, num_layers=num_layers, bidirectional=bidirectional,
        batch_first=batch_first, init_state=init_state,
        lengths=LENGTHS if use_lengths else None)


EDGES = {  # name: (batch, time, input_size, hidden), lengths (None: unpacked), batch_first
    "time1": ((B, 1, D, H), None, False),
    "batch1": ((1, T, D, H), [T - 1], True),
    "hidden1": ((B, T, D, 1), LENGTHS, False),
}
# Each new shape costs compilations, so the edges take one configuration per gate count
# (and the projection where the hidden size allows one).
EDGE_CASES = [(cell, proj, edge) for edge in EDGES
              for cell, proj in ([("rnn_tanh", 0), ("lstm", 0), ("gru", 0)] if edge == "hidden1"
                                 else [("rnn_tanh", 0), ("lstm", P), ("gru", 0)])]
LONG_EDGES = {("rnn_tanh", 0, "batch1"), ("rnn_tanh", 0, "hidden1"), ("gru", 0, "batch1"),
              ("gru", 0, "hidden1"), ("lstm", P, "batch1"), ("lstm", 0, "hidden1"),
              ("lstm", P, "time1")}   # the long tier's: the suite keeps rnn_tanh's and gru's time1


@pytest.mark.slow
@pytest.mark.parametrize("cell,proj_size,edge", long_cases(EDGE_CASES, LONG_EDGES),
                         ids=[f"{CELL_IDS[CELL_CONFIGS.index((c, p))]}-{e}" for c, p, e in EDGE_CASES])
def test_edge_shapes(cell, proj_size, edge):
  """Time length 1, batch 1 and hidden size 1; bidirectional, with h0 (c0)."""
  (batch, time, input_size, hidden), lengths, batch_first = EDGES[edge]
  check(cell, proj_size, num_layers=1, bidirectional=True, batch_first=batch_first,
        init_state=True, lengths=lengths, batch=batch, time=time, input_size=input_size,
        hidden=hidden)


# Every cell time-major, and the one with every state (LSTM with a projection) batch-first too.
UNBATCHED = [(cell, proj, False) for cell, proj in CELL_CONFIGS] + [("lstm", P, True)]
LONG_UNBATCHED = {("lstm", 0, False), ("rnn_tanh", 0, False), ("lstm", P, True)}   # long tier


@pytest.mark.slow
@pytest.mark.parametrize("cell,proj_size,batch_first", long_cases(UNBATCHED, LONG_UNBATCHED), ids=[
    f"{CELL_IDS[CELL_CONFIGS.index((c, p))]}-{'batch_first' if f else 'time_major'}"
    for c, p, f in UNBATCHED])
def test_unbatched_input(cell, proj_size, batch_first):
  """x [T, D], h0 [K, P], c0 [K, H] like torch's unbatched mode (batch_first is moot)."""
  module = make_torch(cell, D, H, num_layers=1, bidirectional=True, batch_first=batch_first,
                      proj_size=proj_size)
  inputs = random_inputs(module, None, T, init_state=True, unbatched=True)
  assert inputs["x"].ndim == 2 and inputs["h0"].ndim == 2
  ref = torch_run(module, **inputs)
  layer, variables = from_torch(module)
  ours = ours_run(layer, variables["params"], **inputs)
  assert_matches_torch(module, ours, ref)


@pytest.mark.slow
@pytest.mark.parametrize("cell,proj_size", [
    ("lstm", P), pytest.param("gru", 0, marks=pytest.mark.long)], ids=[f"lstm_proj{P}", "gru"])
def test_unbatched_without_initial_state(cell, proj_size):
  module = make_torch(cell, D, H, num_layers=2, bidirectional=True, proj_size=proj_size)
  inputs = random_inputs(module, None, T, init_state=False, unbatched=True)
  ref = torch_run(module, **inputs)
  layer, variables = from_torch(module)
  assert_matches_torch(module, ours_run(layer, variables["params"], **inputs), ref)


@pytest.mark.parametrize("cell,proj_size", CELL_CONFIGS, ids=CELL_IDS)
def test_module_without_bias(cell, proj_size):
  module, ours, _ = check(cell, proj_size, num_layers=2, bidirectional=True, init_state=True,
                          lengths=LENGTHS, bias=False)
  assert not any("bias" in name for name, _ in module.named_parameters())
  _, variables = from_torch(module)
  for cell_params in variables["params"].values():
    assert not np.any(cell_params["bias_ih"]) and not np.any(cell_params["bias_hh"])


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("cell,proj_size", CELL_CONFIGS, ids=CELL_IDS)
def test_from_torch_copies_every_parameter(cell, proj_size, bidirectional):
  """Every torch parameter lands where the name mapping says, and nothing else exists."""
  module = make_torch(cell, D, H, num_layers=3, bidirectional=bidirectional, proj_size=proj_size)
  layer, variables = from_torch(module)
  torch_params = dict(module.named_parameters())
  for name, value in torch_params.items():
    np.testing.assert_array_equal(our_param(variables["params"], name), value.detach().numpy(),
                                  err_msg=name)
  ours = {(cell_name, leaf) for cell_name, leaves in variables["params"].items() for leaf in leaves}
  assert ours == {our_param_path(name) for name in torch_params}
  assert (layer.hidden_size, layer.num_layers, layer.bidirectional, layer.batch_first) == (
      module.hidden_size, module.num_layers, module.bidirectional, module.batch_first)
  if cell == "lstm":
    assert layer.proj_size == module.proj_size
  if cell.startswith("rnn"):
    assert layer.nonlinearity == module.nonlinearity


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("cell,proj_size", CELL_CONFIGS, ids=CELL_IDS)
def test_init_creates_torch_parameter_shapes(cell, proj_size, bidirectional):
  """A layer built directly (not from torch) has exactly torch's parameters, transposed."""
  module = make_torch(cell, D, H, num_layers=3, bidirectional=bidirectional, proj_size=proj_size)
  kwargs = dict(hidden_size=H, num_layers=3, bidirectional=bidirectional)
  layer = {"rnn_tanh": lambda: RNN(**kwargs), "rnn_relu": lambda: RNN(nonlinearity="relu", **kwargs),
           "lstm": lambda: LSTM(proj_size=proj_size, **kwargs), "gru": lambda: GRU(**kwargs)}[cell]()
  params = jax.eval_shape(layer.init, jax.random.key(0), jnp.zeros((B, T, D)))["params"]
  torch_params = dict(module.named_parameters())
  for name, value in torch_params.items():
    cell_name, leaf = our_param_path(name)
    shape = params[cell_name][leaf].shape
    assert (shape[::-1] if leaf.startswith("kernel") else shape) == tuple(value.shape), name
  assert sum(len(leaves) for leaves in params.values()) == len(torch_params)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("cell,proj_size", [("lstm", P), ("gru", 0)], ids=[f"lstm_proj{P}", "gru"])
def test_zero_length_sequence_keeps_initial_state(cell, proj_size, bidirectional):
  """Length 0 (torch cannot pack it): outputs are zero, h_n == h0 and c_n == c0 for that
  sequence, and the other sequences are exactly torch's result without it."""
  module = make_torch(cell, D, H, num_layers=2, bidirectional=bidirectional, proj_size=proj_size)
  inputs = random_inputs(module, B, T, init_state=True)
  lengths = [2, 0, T]
  layer, variables = from_torch(module)
  ours = ours_run(layer, variables["params"], lengths=lengths, **inputs)
  np.testing.assert_array_equal(ours["out"][1], 0.0)
  np.testing.assert_array_equal(ours["h_n"][:, 1], inputs["h0"][:, 1])
  if inputs["c0"] is not None:
    np.testing.assert_array_equal(ours["c_n"][:, 1], inputs["c0"][:, 1])
  keep = [0, 2]
  sub = {k: None if v is None else (v[keep] if k in ("x", "g_out") else v[:, keep])
         for k, v in inputs.items()}
  ref = torch_run(module, lengths=[lengths[i] for i in keep], **sub)
  assert_close(ours["out"][keep], ref["out"], 1e-5, "outputs")
  assert_close(ours["h_n"][:, keep], ref["h_n"], 1e-5, "h_n")
  assert_close(ours["d_x"][keep], ref["d_x"], 1e-4, "d x")
  # the empty sequence's x gets no gradient; its h0 gets exactly the h_n cotangent
  np.testing.assert_array_equal(ours["d_x"][1], 0.0)
  np.testing.assert_allclose(ours["d_h0"][:, 1], inputs["g_h"][:, 1], atol=1e-6)
  if inputs["c0"] is not None:
    np.testing.assert_allclose(ours["d_c0"][:, 1], inputs["g_c"][:, 1], atol=1e-6)
  for name, expected in ref["d_params"].items():
    assert_close(our_param(ours["d_params"], name), expected, 1e-4, name)


@pytest.mark.slow
@pytest.mark.long
@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, T), min_size=B, max_size=B),
       cell=st.sampled_from(CELL_CONFIGS), num_layers=st.integers(1, 3),
       bidirectional=st.booleans(), batch_first=st.booleans(), init_state=st.booleans())
def test_random_packed_lengths_match_torch(lengths, cell, num_layers, bidirectional, batch_first,
                                           init_state):
  """Random lengths (ties, all full, all 1, any order) and configurations against torch's
  packed sequences. Batch and time stay the grid's: op by op, every new shape costs an
  XLA compilation of each small operation (about a second per example)."""
  check(*cell, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first,
        init_state=init_state, lengths=lengths, seed=sum(lengths))
