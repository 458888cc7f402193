"""Task models composed from research.attention and research.recurrent."""

from research.models.decoding import beam_search, gnmt_length_penalty, greedy_decode
from research.models.encoder_classifier import EncoderClassifier
from research.models.language_model import LanguageModel
from research.models.seq2seq import (
                                     ATTENTIONS,
                                     STYLES,
                                     Decoder,
                                     DecoderState,
                                     Encoder,
                                     Memory,
                                     Seq2Seq,
)
from research.models.sequence_model import KINDS, SequenceModel

__all__ = ["ATTENTIONS", "KINDS", "STYLES", "Decoder", "DecoderState", "Encoder",
           "EncoderClassifier", "LanguageModel", "Memory",
           "Seq2Seq", "SequenceModel", "beam_search", "gnmt_length_penalty", "greedy_decode"]
