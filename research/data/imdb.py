"""IMDB movie reviews (Maas et al., 2011) read from Stanford's `aclImdb` folder as Long Range
Arena's Text task tokenises them: bytes, as LRA's pipeline
(lra_benchmarks/text_classification/input_pipeline.py) encodes tfds' `imdb_reviews`.
"""

import os

import numpy as np

from research.data import byte_text
from research.errors import InputError

SPLITS = {"train": "train", "val": "test", "test": "test"}   # split -> aclImdb folder
CLASS_FOLDERS = ("neg", "pos")                                # label 0, 1
NUM_CLASSES = 2
VOCAB_SIZE = byte_text.VOCAB_SIZE
# LRA's paper runs Text at length 4K (its Table 1); the released config
# (text_classification/configs/base_tc_config.py) has max_length = 1000.
LRA_MAX_LENGTH = 4000
TOKENS = ("the review's UTF-8 bytes, whitespace-stripped at both ends, as ids 1–256 (byte + 1), "
          "cut to max_length and padded with 0")
SOURCE = ("the aclImdb folder of aclImdb_v1.tar.gz from "
          "https://ai.stanford.edu/~amaas/data/sentiment/")


def read_split(directory: str | os.PathLike, split: str, max_length: int) -> dict[str, np.ndarray]:
  """One split of the `aclImdb` folder at `directory`, tokenised as LRA does.

  The folder is the one in aclImdb_v1.tar.gz (https://ai.stanford.edu/~amaas/data/sentiment/):

    aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt     12 500 reviews in each of the four
    aclImdb/train/unsup/                                  unlabelled, ignored

  tfds' `imdb_reviews` builder, which LRA loads, reads each of these files as bytes and strips
  leading and trailing whitespace (`bytes.strip()`), keeping the rest as it is (the HTML
  `<br />` line breaks included), with label 0 = neg, 1 = pos; LRA encodes the text with tfds'
  ByteTextEncoder (research.data.byte_text), keeps the first max_length ids and pads to
  max_length. IMDB has no validation split: LRA evaluates on the test split during training
  too, so `val` reads aclImdb/test here as well. Reviews come in a fixed order: neg then pos,
  files sorted by name (tfds' order is a hash of the paths; training shuffles anyway).

  Returns {"tokens": uint16 [N, max_length] byte ids (0 pads), "lengths": int32 [N] (ids kept,
  at most max_length), "labels": int32 [N] (0 neg, 1 pos)}. Raises InputError naming the folder
  or file for a missing folder, a folder without reviews, an unreadable or non-UTF-8 review.
  """
  if split not in SPLITS:
    raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
  if max_length < 1:
    raise ValueError(f"max_length {max_length}: expected at least 1")
  paths, labels = [], []
  for label, folder in enumerate(CLASS_FOLDERS):
    found = _reviews(os.path.join(directory, SPLITS[split], folder))
    paths += found
    labels += [label] * len(found)
  tokens = np.zeros((len(paths), max_length), np.uint16)
  lengths = np.array([byte_text.encode_into(row, _review(path))
                      for row, path in zip(tokens, paths, strict=True)], np.int32)
  return {"tokens": tokens, "lengths": lengths, "labels": np.array(labels, np.int32)}


def _reviews(folder: str) -> list[str]:
  """The paths of the *.txt files in `folder`, sorted by name."""
  expected = f"expected {folder}{os.sep}<id>_<rating>.txt, as in {SOURCE}"
  try:
    names = sorted(name for name in os.listdir(folder) if name.endswith(".txt"))
  except FileNotFoundError:
    raise InputError(f"{folder}: no such folder; {expected}") from None
  except OSError as error:
    raise InputError(f"{folder}: cannot be read ({error.strerror or error}); {expected}") from None
  if not names:
    raise InputError(f"{folder}: no reviews (*.txt) in it; {expected}")
  return [os.path.join(folder, name) for name in names]


def _review(path: str) -> bytes:
  """A review's bytes as tfds' imdb_reviews keeps them: whitespace stripped at both ends."""
  try:
    with open(path, "rb") as f:
      text = f.read()
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
  try:
    text.decode("utf-8")
  except UnicodeDecodeError as error:
    raise InputError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); expected a "
                     f"review from {SOURCE}") from None
  return text.strip()
