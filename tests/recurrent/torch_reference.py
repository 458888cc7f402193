"""Shared helpers for the recurrent tests: torch modules as the reference.

* `make_torch` builds a float32 torch.nn.RNN / LSTM / GRU with a fixed seed.
* `our_param` maps a torch parameter name (`weight_ih_l1_reverse`, ...) to our array,
  in torch's layout, so the two can be compared directly.
* `torch_run` runs the torch module (packing with `pack_padded_sequence` when lengths
  are given) and backpropagates a given cotangent with torch's own autograd.
* `ours_run` does the same with our layer and `jax.value_and_grad`.
* `assert_matches_torch` compares everything (outputs, final states, d/dx, d/dh0,
  d/dc0 and d/d every torch parameter).

Nothing here computes an expected value with our own code: every expectation comes
from torch.
"""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import torch

torch.set_num_threads(1)

CELLS = ("rnn_tanh", "rnn_relu", "lstm", "gru")

# The shapes every test file uses unless it tests other shapes on purpose. Op by op, JAX
# compiles each small operation once per shape, so sharing them keeps the suite fast.
B, T, D, H, P = 3, 3, 3, 4, 2      # batch, time, input, hidden, LSTM projection
LENGTHS = [2, T, 1]                # unsorted, one full, one of length 1

FORWARD_TOL = 1e-5
GRAD_TOL = 1e-4


def make_torch(cell: str, input_size: int, hidden_size: int, *, num_layers: int = 1,
               bidirectional: bool = False, batch_first: bool = True, proj_size: int = 0,
               bias: bool = True, dropout: float = 0.0, seed: int = 0) -> torch.nn.Module:
  torch.manual_seed(seed)
  kwargs = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                bias=bias, batch_first=batch_first, dropout=dropout,
                bidirectional=bidirectional)
  if cell in ("rnn_tanh", "rnn_relu"):
    module = torch.nn.RNN(nonlinearity=cell[4:], **kwargs)
  elif cell == "lstm":
    module = torch.nn.LSTM(proj_size=proj_size, **kwargs)
  elif cell == "gru":
    module = torch.nn.GRU(**kwargs)
  else:
    raise ValueError(cell)
  return module.float()


_TORCH_NAME = re.compile(r"(weight|bias)_(ih|hh|hr)_l(\d+)(_reverse)?")


def our_param_path(torch_name: str) -> tuple[str, str]:
  """'weight_ih_l1_reverse' -> ('l1_reverse', 'kernel_ih'); 'bias_hh_l0' -> ('l0', 'bias_hh')."""
  match = _TORCH_NAME.fullmatch(torch_name)
  assert match, f"unexpected torch parameter name {torch_name}"
  kind, which, layer, reverse = match.groups()
  return f"l{layer}{reverse or ''}", ("kernel_" if kind == "weight" else "bias_") + which


def our_param(params, torch_name: str) -> np.ndarray:
  """Our parameter (or its gradient) for torch's `torch_name`, in torch's layout."""
  cell, leaf = our_param_path(torch_name)
  value = np.asarray(params[cell][leaf])
  return value.T if leaf.startswith("kernel") else value


def num_states(module) -> int:
  return module.num_layers * (2 if module.bidirectional else 1)


def state_sizes(module) -> tuple[int, int]:
  """(P, H): size of h0 / h_n and of c0 / c_n."""
  proj = getattr(module, "proj_size", 0)
  return (proj or module.hidden_size), module.hidden_size


def is_lstm(module) -> bool:
  return isinstance(module, torch.nn.LSTM)


def random_inputs(module, batch: int, time: int, *, init_state: bool, seed: int = 1,
                  unbatched: bool = False) -> dict:
  """x (in the module's layout), h0/c0 (or None) and cotangents for every output."""
  rng = np.random.default_rng(seed)
  out_size, hidden = state_sizes(module)
  k = num_states(module)
  dirs = 2 if module.bidirectional else 1
  randn = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  if unbatched:
    x_shape, state_batch, out_shape = (time, module.input_size), (), (time, dirs * out_size)
  elif module.batch_first:
    x_shape, state_batch, out_shape = (batch, time, module.input_size), (batch,), (batch, time, dirs * out_size)
  else:
    x_shape, state_batch, out_shape = (time, batch, module.input_size), (batch,), (time, batch, dirs * out_size)
  inputs = dict(x=randn(*x_shape), h0=None, c0=None,
                g_out=randn(*out_shape), g_h=randn(k, *state_batch, out_size), g_c=None)
  if init_state:
    inputs["h0"] = randn(k, *state_batch, out_size)
    if is_lstm(module):
      inputs["c0"] = randn(k, *state_batch, hidden)
  if is_lstm(module):
    inputs["g_c"] = randn(k, *state_batch, hidden)
  return inputs


def torch_run(module, x, h0=None, c0=None, lengths=None, g_out=None, g_h=None, g_c=None) -> dict:
  """Torch's outputs, h_n, c_n and, with cotangents, the gradients of
  loss = Σ out·g_out + Σ h_n·g_h (+ Σ c_n·g_c) w.r.t. x, h0, c0 and every parameter.

  With `lengths`, the input is packed with `pack_padded_sequence(enforce_sorted=False)`
  and the output padded back to the full length with `pad_packed_sequence`.
  """
  module.zero_grad(set_to_none=True)
  leaf = lambda a: None if a is None else torch.tensor(a, requires_grad=True)
  xt, h0t, c0t = leaf(x), leaf(h0), leaf(c0)
  if is_lstm(module):
    hx = None if h0t is None else (h0t, c0t)
  else:
    hx = h0t
  if lengths is None:
    out, hidden = module(xt, hx)
  else:
    total_length = x.shape[1 if module.batch_first else 0]
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        xt, torch.as_tensor(np.asarray(lengths), dtype=torch.int64),
        batch_first=module.batch_first, enforce_sorted=False)
    packed_out, hidden = module(packed, hx)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(
        packed_out, batch_first=module.batch_first, total_length=total_length)
  h_n, c_n = hidden if is_lstm(module) else (hidden, None)
  result = dict(out=out.detach().numpy(), h_n=h_n.detach().numpy(),
                c_n=None if c_n is None else c_n.detach().numpy())
  if g_out is None:
    return result
  loss = (out * torch.tensor(g_out)).sum() + (h_n * torch.tensor(g_h)).sum()
  if c_n is not None:
    loss = loss + (c_n * torch.tensor(g_c)).sum()
  loss.backward()
  grad = lambda t: None if t is None else t.grad.numpy()
  result.update(d_x=grad(xt), d_h0=grad(h0t), d_c0=grad(c0t),
                d_params={name: p.grad.numpy() for name, p in module.named_parameters()})
  return result


def ours_run(layer, params, x, h0=None, c0=None, lengths=None, g_out=None, g_h=None, g_c=None,
             *, jit: bool = False) -> dict:
  """Our layer's outputs, h_n, c_n and the gradients of the same loss as `torch_run`,
  with `jax.value_and_grad`. With jit=False the whole computation runs with
  `jax.disable_jit()` (op by op: the same operations without an XLA compilation per
  configuration, which keeps the large grid fast); jit=True compiles it."""
  has_c = c0 is not None or g_c is not None
  state = None if h0 is None else ((jnp.asarray(h0), jnp.asarray(c0)) if has_c else jnp.asarray(h0))
  seq_lengths = None if lengths is None else jnp.asarray(np.asarray(lengths), jnp.int32)

  def loss_fn(params, x, state):
    out, hidden = layer.apply({"params": params}, x, initial_state=state, seq_lengths=seq_lengths)
    h_n, c_n = hidden if has_c else (hidden, None)
    loss = jnp.sum(out * g_out) + jnp.sum(h_n * g_h)
    if has_c:
      loss = loss + jnp.sum(c_n * g_c)
    return loss, (out, h_n, c_n)

  fn = jax.value_and_grad(loss_fn, argnums=(0, 1, 2), has_aux=True)
  context = contextlib.nullcontext() if jit else jax.disable_jit()
  with context:
    if jit:
      fn = jax.jit(fn)
    (_, (out, h_n, c_n)), (d_params, d_x, d_state) = fn(params, jnp.asarray(x), state)
  d_h0, d_c0 = (d_state if has_c else (d_state, None)) if state is not None else (None, None)
  as_np = lambda a: None if a is None else np.asarray(a)
  return dict(out=as_np(out), h_n=as_np(h_n), c_n=as_np(c_n), d_x=as_np(d_x),
              d_h0=as_np(d_h0), d_c0=as_np(d_c0), d_params=d_params)


def assert_close(actual, expected, tol, what):
  """|actual - expected| <= tol · max(1, max|expected|), shapes equal."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != torch {expected.shape}"
  scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
  np.testing.assert_allclose(actual, expected, rtol=0, atol=tol * scale, err_msg=what)


def assert_matches_torch(module, ours: dict, ref: dict, *, grads: bool = True):
  """Outputs, h_n, c_n (1e-5) and, with grads, every gradient torch has (1e-4)."""
  assert_close(ours["out"], ref["out"], FORWARD_TOL, "outputs")
  assert_close(ours["h_n"], ref["h_n"], FORWARD_TOL, "h_n")
  if ref["c_n"] is not None:
    assert_close(ours["c_n"], ref["c_n"], FORWARD_TOL, "c_n")
  if not grads:
    return
  assert_close(ours["d_x"], ref["d_x"], GRAD_TOL, "d loss / d x")
  for name in ("d_h0", "d_c0"):
    if ref[name] is not None:
      assert_close(ours[name], ref[name], GRAD_TOL, f"d loss / {name}")
  assert ref["d_params"], "torch module has no parameters"
  for name, expected in ref["d_params"].items():
    assert_close(our_param(ours["d_params"], name), expected, GRAD_TOL, f"d loss / d {name}")


def padding_mask(lengths, batch_first: bool, time: int) -> np.ndarray:
  """[B, T, 1] (or [T, B, 1]) bool: True past each sequence's end."""
  pad = np.arange(time)[None, :] >= np.asarray(lengths)[:, None]
  return (pad if batch_first else pad.T)[..., None]


def check_against_torch(cell, proj_size, *, num_layers=1, bidirectional=False, batch_first=True,
                        init_state=False, lengths=None, batch=B, time=T, input_size=D, hidden=H,
                        bias=True, jit=False, seed=0):
  """Builds a torch module, imports it with `from_torch`, runs both on the same random
  inputs and cotangents, and asserts `assert_matches_torch`; with lengths, also that our
  padded outputs are exactly zero. Returns (module, ours, ref)."""
  from research.recurrent import from_torch  # pylint: disable=import-outside-toplevel
  module = make_torch(cell, input_size, hidden, num_layers=num_layers,
                      bidirectional=bidirectional, batch_first=batch_first,
                      proj_size=proj_size, bias=bias, seed=seed)
  inputs = random_inputs(module, batch, time, init_state=init_state, seed=seed + 1)
  ref = torch_run(module, lengths=lengths, **inputs)
  layer, variables = from_torch(module)
  ours = ours_run(layer, variables["params"], lengths=lengths, jit=jit, **inputs)
  assert_matches_torch(module, ours, ref)
  if lengths is not None:
    pad = np.broadcast_to(padding_mask(lengths, batch_first, time), ours["out"].shape)
    assert np.all(ours["out"][pad] == 0.0), "padded outputs must be zero"
  return module, ours, ref
