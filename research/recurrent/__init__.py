"""Recurrent networks with PyTorch's equations, fused and fast in JAX, and linear recurrences.

Cells and multi-layer layers (RNN, LSTM, GRU) with PyTorch's interface and `from_torch`;
the linear recurrences (`LRU`, `S5`, causal linear attention as a cell and a layer, all on
`linear_scan`) and the selective ones (`Mamba`, `Mamba2`, `GLA`, `DeltaNet`), each parallel
over time or stepwise with a carried state. docs/recurrent.md says what each part does.
"""

from research.recurrent.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from research.recurrent.deltanet import DeltaNet
from research.recurrent.gla import GLA
from research.recurrent.layers import GRU, LSTM, RNN, RecurrentLayer
from research.recurrent.linear_attention_cell import (
  LinearAttention,
  LinearAttentionCell,
  retnet_decay,
)
from research.recurrent.linear_scan import linear_scan
from research.recurrent.lru import LRU
from research.recurrent.mamba import Mamba
from research.recurrent.mamba2 import Mamba2
from research.recurrent.recurrence import recurrence
from research.recurrent.s5 import S5
from research.recurrent.torch_import import from_torch

__all__ = [
    "GLA", "GRU", "DeltaNet", "GRUCell", "LRU", "LSTM", "LSTMCell", "LinearAttention",
    "LinearAttentionCell", "Mamba", "Mamba2", "RNN", "RecurrentCell", "RecurrentLayer", "S5",
    "SimpleRNNCell", "from_torch", "linear_scan", "recurrence", "retnet_decay",
]
