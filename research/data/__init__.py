"""Task datasets and tokenisers: generated data and readers for user-supplied files."""

from research.data.stream import GeneratedStream, ShuffledStream, Stream, eval_batches

__all__ = ["GeneratedStream", "ShuffledStream", "Stream", "eval_batches"]
