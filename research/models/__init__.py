"""Workload models composed from research.attention and research.recurrent.

`TransformerBlock` is the one block of every transformer here and `BlockStack` the one stack
of them that SequenceModel, LanguageModel and EncoderClassifier are made of, its
self-attention chosen by name (`self_attention`); `model.kind` picks a recurrent stack or
blocks (kinds.py). The Seq2Seq decoder's attention is one of DECODER_ATTENTIONS.
"""

from research.models.block_stack import BlockStack, StackFields
from research.models.decoding import beam_search, gnmt_length_penalty, greedy_decode
from research.models.encoder_classifier import EncoderClassifier
from research.models.kinds import KINDS
from research.models.language_model import LanguageModel
from research.models.self_attention import CAUSAL_ATTENTIONS, SELF_ATTENTIONS, self_attention
from research.models.seq2seq import (
                                     DECODER_ATTENTIONS,
                                     STYLES,
                                     Decoder,
                                     DecoderState,
                                     Encoder,
                                     Memory,
                                     Seq2Seq,
)
from research.models.sequence_model import SequenceModel
from research.models.transformer_block import TransformerBlock

__all__ = ["CAUSAL_ATTENTIONS", "DECODER_ATTENTIONS", "KINDS", "SELF_ATTENTIONS", "STYLES",
           "BlockStack", "Decoder", "DecoderState", "Encoder", "EncoderClassifier",
           "LanguageModel", "Memory", "Seq2Seq", "SequenceModel", "StackFields",
           "TransformerBlock", "beam_search", "gnmt_length_penalty", "greedy_decode",
           "self_attention"]
