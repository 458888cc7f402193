"""Attention: score functions × patterns × compute strategies.

Functional core: `dot_product_attention` (dense / chunked / banded), masks, and the
registry of implementations (`register_implementation` plugs in a new kernel).
Scores: dot, scaled_dot, general, additive, concat, location (`scores.py`).
Patterns: Luong local-m / local-p (`local.py`), hard attention with REINFORCE and
Gumbel straight-through (`hard.py`), Linformer and memory-compressed attention
(`compressed.py`). Block-sparse patterns for `sparsity=`: Sparse Transformer's fixed and
strided, BigBird (`block_sparse.py`). Modules: `MultiHeadAttention` (with KV cache),
`NadarayaWatson`.
`from_torch(torch.nn.MultiheadAttention)` imports torch weights.
"""

from research.attention.block_sparse import BigBird, BlockSparse, SparseFixed, SparseStrided
from research.attention.compressed import (
                                           LinformerSelfAttention,
                                           MemoryCompressedAttention,
                                           linformer_attention,
)
from research.attention.functional import dot_product_attention
from research.attention.hard import (
                                           HardAttention,
                                           baseline_loss,
                                           choice_log_prob,
                                           gumbel_softmax,
                                           hard_attention,
                                           reinforce_surrogate,
                                           update_moving_average_baseline,
)
from research.attention.nadaraya_watson import SMOOTHING_KERNELS, NadarayaWatson, nadaraya_watson
from research.attention.local import LocalAttention, local_attention_weights
from research.attention.masks import (
                                           Visibility,
                                           causal_mask,
                                           global_tokens_mask,
                                           padding_mask,
                                           window_mask,
)
from research.attention.multi_head import MultiHeadAttention
from research.attention.registry import Implementation
from research.attention.registry import Request as AttentionRequest
from research.attention.registry import get as get_implementation
from research.attention.registry import names as implementation_names
from research.attention.registry import register as register_implementation
from research.attention.registry import registered as registered_implementations
from research.attention.registry import supporting as supporting_implementations
from research.attention.scores import (
                                           SCORE_FUNCTIONS,
                                           AdditiveScore,
                                           ConcatScore,
                                           DotScore,
                                           GeneralScore,
                                           LocationScore,
                                           ScaledDotScore,
                                           Score,
                                           additive_score,
                                           attend,
                                           concat_score,
                                           dot_score,
                                           general_score,
                                           location_score,
                                           make_score,
                                           scaled_dot_score,
)
from research.attention.torch_import import from_torch

__all__ = [
    "SMOOTHING_KERNELS", "SCORE_FUNCTIONS", "AdditiveScore", "AttentionRequest", "ConcatScore", "DotScore",
    "GeneralScore", "HardAttention", "Implementation", "LinformerSelfAttention", "LocalAttention",
    "LocationScore", "MemoryCompressedAttention", "MultiHeadAttention", "NadarayaWatson",
    "ScaledDotScore", "Score", "Visibility", "additive_score", "attend", "baseline_loss",
    "causal_mask", "choice_log_prob", "concat_score", "dot_product_attention", "dot_score",
    "from_torch", "general_score", "get_implementation", "global_tokens_mask", "gumbel_softmax",
    "hard_attention", "implementation_names", "linformer_attention", "local_attention_weights",
    "location_score", "make_score", "nadaraya_watson", "padding_mask", "register_implementation",
    "registered_implementations", "reinforce_surrogate", "scaled_dot_score", "supporting_implementations",
    "update_moving_average_baseline", "window_mask",
    "BigBird", "BlockSparse", "SparseFixed", "SparseStrided",
]
