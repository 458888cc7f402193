"""Attention: score functions × patterns × compute strategies (see SPEC section 1)."""

from research.attention.functional import IMPLEMENTATIONS, dot_product_attention
from research.attention.masks import (Visibility, causal_mask, global_tokens_mask, padding_mask,
                                      window_mask)

__all__ = [
    "IMPLEMENTATIONS", "Visibility", "causal_mask", "dot_product_attention",
    "global_tokens_mask", "padding_mask", "window_mask",
]
