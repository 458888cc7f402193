"""Multi-layer, bidirectional RNN / LSTM / GRU layers with PyTorch's interface: its shapes,
packed-sequence semantics and parameter names (`RecurrentLayer`).

    layer = LSTM(hidden_size=256, num_layers=2, bidirectional=True, dropout=0.1)
    outputs, (h_n, c_n) = layer.apply(variables, x, initial_state=(h0, c0),
                                      seq_lengths=lengths, train=True, rngs={"dropout": key})
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_positive
from research.recurrent.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell

Array = jax.Array


def valid_mask(seq_lengths: Array | None, batch: int, num_steps: int) -> Array | None:
  """[batch, time] bool, True at t < seq_lengths[b]; None without lengths."""
  if seq_lengths is None:
    return None
  seq_lengths = jnp.asarray(seq_lengths)
  if seq_lengths.shape != (batch,):
    raise ValueError(f"seq_lengths must have shape (batch,) = ({batch},), got {seq_lengths.shape}")
  if not jnp.issubdtype(seq_lengths.dtype, jnp.integer):
    raise ValueError(f"seq_lengths must be integers, got dtype {seq_lengths.dtype}")
  return jnp.arange(num_steps)[None, :] < seq_lengths[:, None]


def layer_pass(cell: RecurrentCell, x: Array, h0: Array, c0: Array | None,
               valid: Array | None, *, time_axis: int, reverse: bool
               ) -> tuple[Array, Array, Array | None]:
  """One layer and direction over the sequence (`RecurrentCell.sequence`): (ys, h_n, c_n);
  the function `remat_layer` wraps, its arrays positional."""
  return cell.sequence(x, h0, c0, valid=valid, time_axis=time_axis, reverse=reverse)


class RecurrentLayer(nn.Module):
  """Shared body of `RNN`, `LSTM` and `GRU`; subclasses say which cell to stack.

  Shapes (B batch, T time, D input, H hidden, P = proj_size or H, K = num_layers ×
  num_directions): x [B, T, D] ([T, B, D] if not batch_first, [T, D] unbatched);
  outputs [B, T, num_directions·P]; h_n, h0 [K, B, P]; c_n, c0 [K, B, H], entry
  k = layer · num_directions + direction, as in PyTorch.

  `seq_lengths` [B] gives PyTorch's packed-sequence semantics (`pack_padded_sequence`):
  outputs past a sequence's end are zero, the reverse direction starts at each
  sequence's last valid step, and h_n / c_n hold each sequence's own final state.
  Dropout (rate `dropout`, PRNG stream "dropout") is applied to the outputs of every
  layer but the last, only when `train=True`.

  Parameters live in one cell per layer and direction, named `l{k}` and `l{k}_reverse`
  like PyTorch's `weight_ih_l{k}[_reverse]` (see `cells.py` for the layout).

  `remat_layer` wraps each layer and direction's pass over the sequence (`layer_pass`), a
  function (cell, x, h0, c0, valid) -> (ys, h_n, c_n) of the bound cell: e.g.
  `flax.linen.remat`, which recomputes the pass in the backward pass from its inputs instead
  of keeping its gate activations (research/models/remat.py). The parameters keep their
  names.
  """
  hidden_size: int                 # H, features of each hidden state
  num_layers: int = 1              # stacked recurrent layers
  bidirectional: bool = False      # add a reverse-time direction to every layer
  dropout: float = 0.0             # dropout on the outputs of all layers but the last
  batch_first: bool = True         # x is [B, T, D] (True) or [T, B, D] (False)
  dtype: Any = None                # computation dtype of the matrix products (None: float32)
  param_dtype: Any = jnp.float32   # parameter dtype
  remat_layer: Callable[[Callable], Callable] | None = None  # wraps each layer and
                                   # direction's pass (see the class docstring)

  def make_cell(self, name: str) -> RecurrentCell:
    raise NotImplementedError

  @property
  def num_directions(self) -> int:
    return 2 if self.bidirectional else 1

  def _check_config(self):
    for name in ("hidden_size", "num_layers"):
      check_positive(name, getattr(self, name))
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

  @nn.compact
  def __call__(self, x: Array, *, initial_state: Any = None, seq_lengths: Array | None = None,
               train: bool = False):
    """Runs the stack; see the class docstring for shapes.

    Returns (outputs, h_n) for RNN and GRU, (outputs, (h_n, c_n)) for LSTM.
    """
    self._check_config()
    unbatched = x.ndim == 2
    if x.ndim not in (2, 3):
      raise ValueError(f"x must be [batch, time, features] or [time, features], got shape {x.shape}")
    if unbatched:
      x = x[None] if self.batch_first else x[:, None]
    time_axis = 1 if self.batch_first else 0
    batch, num_steps = x.shape[1 - time_axis], x.shape[time_axis]
    cells = [[self.make_cell(f"l{layer}" + ("_reverse" if direction else ""))
              for direction in range(self.num_directions)] for layer in range(self.num_layers)]
    has_c = cells[0][0].equations.has_cell_state
    out_size = cells[0][0].out_features
    h0, c0 = self._initial_state(initial_state, has_c, batch, out_size, unbatched)
    valid = valid_mask(seq_lengths, batch, num_steps)

    h_n, c_n = [], []
    for layer, directions in enumerate(cells):
      outputs = []
      for direction, cell in enumerate(directions):
        k = layer * self.num_directions + direction
        run = functools.partial(layer_pass, time_axis=time_axis, reverse=direction == 1)
        if self.remat_layer is not None:
          run = self.remat_layer(run)
        ys, h, c = run(cell, x, h0[k], None if c0 is None else c0[k], valid)
        outputs.append(ys)
        h_n.append(h)
        c_n.append(c)
      x = outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=-1)
      if layer < self.num_layers - 1 and self.dropout > 0.0:
        x = nn.Dropout(rate=self.dropout, deterministic=not train)(x)

    out_dtype = self.dtype or jnp.float32
    outputs, h_n = x.astype(out_dtype), jnp.stack(h_n).astype(out_dtype)
    c_n = jnp.stack(c_n).astype(out_dtype) if has_c else None
    if unbatched:
      outputs = outputs[0] if self.batch_first else outputs[:, 0]
      h_n, c_n = h_n[:, 0], None if c_n is None else c_n[:, 0]
    return (outputs, (h_n, c_n)) if has_c else (outputs, h_n)

  def _initial_state(self, initial_state, has_c, batch, out_size, unbatched):
    """Checks and batches h0 [K, B, P] (and c0 [K, B, H]); zeros when not given."""
    k = self.num_layers * self.num_directions
    if initial_state is None:
      h0 = jnp.zeros((k, batch, out_size), jnp.float32)
      return h0, jnp.zeros((k, batch, self.hidden_size), jnp.float32) if has_c else None
    if has_c:
      if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2
              and all(s is not None for s in initial_state)):
        raise ValueError("LSTM initial_state must be a pair of arrays (h0, c0)")
      h0, c0 = initial_state
    else:
      h0, c0 = initial_state, None
    expected = {"h0": (h0, out_size), "c0": (c0, self.hidden_size)}
    states = {}
    for name, (state, size) in expected.items():
      if state is None:
        continue
      state = jnp.asarray(state)
      if unbatched and state.ndim == 2:
        state = state[:, None]
      if state.shape != (k, batch, size):
        raise ValueError(f"{name} must have shape (num_layers*num_directions, batch, {size}) = "
                         f"{(k, batch, size)}, got {state.shape}")
      states[name] = state.astype(jnp.float32)
    return states["h0"], states.get("c0")


class RNN(RecurrentLayer):
  """Elman RNN stack, as `torch.nn.RNN` (tanh or relu)."""
  nonlinearity: str = "tanh"       # "tanh" or "relu"

  def make_cell(self, name: str) -> RecurrentCell:
    return SimpleRNNCell(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype,
                         nonlinearity=self.nonlinearity, name=name)


class LSTM(RecurrentLayer):
  """LSTM stack, as `torch.nn.LSTM`, with optional projection (`proj_size`)."""
  proj_size: int = 0               # 0: none; else hidden states have proj_size features

  def make_cell(self, name: str) -> RecurrentCell:
    if not isinstance(self.proj_size, int) or not 0 <= self.proj_size < self.hidden_size:
      raise ValueError(f"proj_size must be an int in [0, hidden_size={self.hidden_size}), "
                       f"got {self.proj_size!r}")
    return LSTMCell(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, proj_size=self.proj_size,
                    name=name)


class GRU(RecurrentLayer):
  """GRU stack, as `torch.nn.GRU`."""

  def make_cell(self, name: str) -> RecurrentCell:
    return GRUCell(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name=name)
