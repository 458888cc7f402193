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

  layers = {torch.nn.LSTM: LSTM, torch.nn.GRU: GRU, torch.nn.RNN: RNN}  # no one subclasses another
  layer_cls = next((ours for theirs, ours in layers.items() if isinstance(module, theirs)), None)
  if layer_cls is None:
    raise TypeError(f"from_torch takes a torch.nn.RNN, LSTM or GRU, got {type(module).__name__}")
  options = dict(hidden_size=module.hidden_size, num_layers=module.num_layers,
                 bidirectional=module.bidirectional, dropout=float(module.dropout),
                 batch_first=module.batch_first)
  if layer_cls is LSTM:
    options["proj_size"] = module.proj_size
  if layer_cls is RNN:
    options["nonlinearity"] = module.nonlinearity
  layer = layer_cls(**options)

  params = {f"l{k}{suffix}": _cell_params(module, f"l{k}{suffix}")
            for k in range(module.num_layers)
            for suffix in ("", "_reverse")[:layer.num_directions]}
  return layer, {"params": params}


def _cell_params(module, name: str) -> dict[str, jnp.ndarray]:
  """One layer-direction's weights, e.g. name "l1_reverse" for weight_ih_l1_reverse."""
  w_ih = _array(getattr(module, f"weight_ih_{name}"))
  zeros = jnp.zeros(w_ih.shape[0], jnp.float32)
  params = {
      "kernel_ih": w_ih.T,
      "kernel_hh": _array(getattr(module, f"weight_hh_{name}")).T,
      "bias_ih": _array(getattr(module, f"bias_ih_{name}")) if module.bias else zeros,
      "bias_hh": _array(getattr(module, f"bias_hh_{name}")) if module.bias else zeros,
  }
  if getattr(module, "proj_size", 0):
    params["kernel_hr"] = _array(getattr(module, f"weight_hr_{name}")).T
  return params
