"""Attention: score functions × patterns × compute strategies, importable into any Flax model.

The functional core `dot_product_attention` and its registry of implementations (portable
ones and the accelerator kernels of `kernels/`), the score functions, the patterns and
modules of the papers, Long Range Arena's efficient attentions (each a function and a
self-attention module) and `from_torch`; docs/attention.md says what each part does.
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
from research.attention.linear import LinearSelfAttention, kernelized_attention, linear_attention
from research.attention.local import LocalAttention, local_attention_weights
from research.attention.masks import (
                                           Visibility,
                                           causal_mask,
                                           global_tokens_mask,
                                           padding_mask,
                                           window_mask,
)
from research.attention.multi_head import MultiHeadAttention
from research.attention.nadaraya_watson import SMOOTHING_KERNELS, NadarayaWatson, nadaraya_watson
from research.attention.performer import (
                                           PerformerSelfAttention,
                                           favor_attention,
                                           orthogonal_random_features,
)
from research.attention.reformer import LSHSelfAttention, lsh_attention, lsh_rotations
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
from research.attention.sinkhorn import (
                                           SinkhornSelfAttention,
                                           sinkhorn_attention,
                                           sinkhorn_normalize,
)
from research.attention.synthesizer import (
                                           SynthesizerSelfAttention,
                                           dense_synthesizer_logits,
                                           synthesizer_attention,
                                           synthesizer_attention_in_blocks,
)
from research.attention.torch_import import from_torch

__all__ = [
    "SMOOTHING_KERNELS", "SCORE_FUNCTIONS", "AdditiveScore", "AttentionRequest", "ConcatScore", "DotScore",
    "GeneralScore", "HardAttention", "Implementation", "LSHSelfAttention", "LinearSelfAttention",
    "LinformerSelfAttention", "LocalAttention", "LocationScore", "MemoryCompressedAttention",
    "MultiHeadAttention", "NadarayaWatson", "PerformerSelfAttention", "ScaledDotScore", "Score",
    "SinkhornSelfAttention", "SynthesizerSelfAttention", "Visibility", "additive_score", "attend",
    "baseline_loss", "causal_mask", "choice_log_prob", "concat_score", "dense_synthesizer_logits",
    "dot_product_attention", "dot_score", "favor_attention", "from_torch", "general_score",
    "get_implementation", "global_tokens_mask", "gumbel_softmax", "hard_attention",
    "implementation_names", "kernelized_attention", "linear_attention", "linformer_attention",
    "local_attention_weights", "location_score", "lsh_attention", "lsh_rotations", "make_score",
    "nadaraya_watson", "orthogonal_random_features", "padding_mask", "register_implementation",
    "registered_implementations", "reinforce_surrogate", "scaled_dot_score", "sinkhorn_attention",
    "sinkhorn_normalize", "supporting_implementations", "synthesizer_attention",
    "synthesizer_attention_in_blocks", "update_moving_average_baseline", "window_mask",
    "BigBird", "BlockSparse", "SparseFixed", "SparseStrided",
]
