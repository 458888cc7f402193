"""Workload models composed from research.attention and research.recurrent.

`TransformerBlock` (transformer_block.py) is the one block of every transformer here; its
self-attention is chosen by name (`self_attention`, self_attention.py), and `model.kind`
picks a recurrent stack or a transformer (kinds.py).
"""

from research.models.decoding import beam_search, gnmt_length_penalty, greedy_decode
from research.models.encoder_classifier import EncoderClassifier
from research.models.kinds import KINDS
from research.models.language_model import LanguageModel
from research.models.self_attention import self_attention
from research.models.seq2seq import (
                                     ATTENTIONS,
                                     STYLES,
                                     Decoder,
                                     DecoderState,
                                     Encoder,
                                     Memory,
                                     Seq2Seq,
)
from research.models.sequence_model import SequenceModel
from research.models.transformer_block import TransformerBlock

__all__ = ["ATTENTIONS", "KINDS", "STYLES", "Decoder", "DecoderState", "Encoder",
           "EncoderClassifier", "LanguageModel", "Memory", "Seq2Seq", "SequenceModel",
           "TransformerBlock", "beam_search", "gnmt_length_penalty", "greedy_decode",
           "self_attention"]
