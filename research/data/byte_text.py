"""Long Range Arena's byte-level tokenisation, shared by its Text (IMDB) and Retrieval (AAN) tasks:
tfds' `ByteTextEncoder()` (no additional tokens), byte b as id b + 1 and 0 for padding, so a
vocabulary of 257 ids (lra_benchmarks/text_classification/input_pipeline.py,
lra_benchmarks/matching/input_pipeline.py).
"""

import numpy as np

VOCAB_SIZE = 257        # id 0 pads; byte b is id b + 1
PAD_ID = 0


def encode_into(row: np.ndarray, text: bytes) -> int:
  """Writes the ids of `text`'s first len(row) bytes into `row` and returns how many.

  row: uint16 [max_length], zeros (the padding is left as it is); text: the raw bytes. As LRA
  keeps the first max_length ids and pads with 0:

    text bytes b_1 … b_n   ->   ids b_1 + 1, …, b_n + 1   (1–256),   then 0, 0, … to max_length

  The bytes are the text's as stored (UTF-8 here), not characters: "é" is two ids, 196 and 170.
  """
  count = min(len(text), row.shape[0])
  row[:count] = np.frombuffer(text, np.uint8, count=count)
  row[:count] += 1
  return count
