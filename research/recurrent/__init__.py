"""Recurrent networks with PyTorch's equations, fused and fast in JAX.

Cells (one step, `flax.linen.RNNCellBase`): `SimpleRNNCell`, `LSTMCell`, `GRUCell`.
Layers (whole sequences, multi-layer, bidirectional, packed lengths): `RNN`, `LSTM`, `GRU`.
`from_torch(module)` imports a torch.nn.RNN / LSTM / GRU with its weights.
"""

from research.recurrent.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from research.recurrent.layers import GRU, LSTM, RNN, RecurrentLayer
from research.recurrent.recurrence import recurrence
from research.recurrent.torch_import import from_torch

__all__ = [
    "GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RecurrentCell", "RecurrentLayer",
    "SimpleRNNCell", "from_torch", "recurrence",
]
