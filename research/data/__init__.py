"""Workload datasets and tokenisers: generated data and readers for user-supplied files."""

from research.data.stream import GeneratedStream, ShuffledStream, Stream, eval_batches
from research.data.text import Vocabulary, encode_pairs, read_parallel_corpus, tokenize

__all__ = ["GeneratedStream", "ShuffledStream", "Stream", "Vocabulary", "encode_pairs",
           "eval_batches", "read_parallel_corpus", "tokenize"]
