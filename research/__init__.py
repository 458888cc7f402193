"""A JAX/Flax research codebase for attention mechanisms and recurrent networks.

research.attention (attention functions, modules and kernels), research.recurrent (RNN,
LSTM, GRU layers), research.models (the experiments' models), research.data, research.experiments
and research.training (the train loop, checkpoints, sweeps).
"""

from research import jax_start

__version__ = "0.2.0"

jax_start.start_quietly()   # on a machine without a GPU, the CUDA plugin's notices left out
