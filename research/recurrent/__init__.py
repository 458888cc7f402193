"""Recurrent networks with PyTorch's equations, fused and fast in JAX, and linear recurrences.

Cells (one step, `flax.linen.RNNCellBase`): `SimpleRNNCell`, `LSTMCell`, `GRUCell`.
Layers (whole sequences, multi-layer, bidirectional, packed lengths): `RNN`, `LSTM`, `GRU`.
`from_torch(module)` imports a torch.nn.RNN / LSTM / GRU with its weights.

Linear recurrences, parallel over time (`jax.lax.associative_scan`) or stepwise with a
carried state: `LRU` (Orvieto et al. 2023), `S5` (Smith et al. 2023), and causal linear
attention as a recurrent cell, `LinearAttentionCell` (optional per-head decay, RetNet's
being `retnet_decay`), and over whole sequences as a layer, `LinearAttention`;
`linear_scan` is the recurrence h_t = a_t ⊙ h_{t−1} + b_t they share.

Selective recurrences, whose transition depends on the input, in the same two forms
(`selective.py`'s frame): `Mamba` (Gu & Dao 2023, S6), `Mamba2` (Dao & Gu 2024, SSD),
`GLA` (Yang et al. 2024, gated linear attention) and `DeltaNet` (Schlag et al. 2021, the
delta rule; chunkwise as Yang et al. 2024).
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
