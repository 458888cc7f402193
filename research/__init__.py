"""A JAX/Flax research codebase for attention mechanisms and recurrent networks.

research.attention (attention functions, modules and kernels), research.recurrent (RNN,
LSTM, GRU layers), research.models (the experiments' models), research.data, research.experiments
and research.training (the train loop, checkpoints, sweeps).
"""

__version__ = "0.2.0"
