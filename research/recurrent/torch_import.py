"""Import a `torch.nn.RNN`, `LSTM` or `GRU` as a layer of this package with its weights.

    layer, variables = from_torch(torch_lstm)
    outputs, (h_n, c_n) = layer.apply(variables, x)   # == torch_lstm(x), as arrays

torch is imported lazily: only this function needs it.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np

from research.recurrent.layers import GRU, LSTM, RNN, RecurrentLayer


def _array(tensor) -> jnp.ndarray:
  return jnp.asarray(tensor.detach().cpu().numpy().astype(np.float32))


def from_torch(module) -> tuple[RecurrentLayer, dict[str, Any]]:
  """Returns `(layer, variables)` reproducing `module`, a torch.nn.RNN / LSTM / GRU.

  Every layer, direction, `batch_first`, LSTM `proj_size` and RNN `nonlinearity` is
  carried over; `module.dropout` too (active only with `train=True`). A module built
  with `bias=False` maps to zero biases. Parameters are float32.
  """
  import torch  # pylint: disable=import-outside-toplevel

  common = dict(hidden_size=module.hidden_size, num_layers=module.num_layers,
                bidirectional=module.bidirectional, dropout=float(module.dropout),
                batch_first=module.batch_first)
  if isinstance(module, torch.nn.LSTM):
    layer = LSTM(proj_size=module.proj_size, **common)
  elif isinstance(module, torch.nn.GRU):
    layer = GRU(**common)
  elif isinstance(module, torch.nn.RNN):
    layer = RNN(nonlinearity=module.nonlinearity, **common)
  else:
    raise TypeError(f"from_torch takes a torch.nn.RNN, LSTM or GRU, got {type(module).__name__}")

  params = {}
  for k in range(module.num_layers):
    for suffix in ("", "_reverse")[:layer.num_directions]:
      get = lambda name: getattr(module, f"{name}_l{k}{suffix}", None)
      gates_hidden = get("weight_ih").shape[0]
      bias = lambda name: _array(get(name)) if module.bias else jnp.zeros(gates_hidden, jnp.float32)
      cell = {"kernel_ih": _array(get("weight_ih")).T, "kernel_hh": _array(get("weight_hh")).T,
              "bias_ih": bias("bias_ih"), "bias_hh": bias("bias_hh")}
      if get("weight_hr") is not None:
        cell["kernel_hr"] = _array(get("weight_hr")).T
      params[f"l{k}{suffix}"] = cell
  return layer, {"params": params}
