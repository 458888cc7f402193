"""ACL Anthology Network paper pairs (Radev et al., 2013) from Long Range Arena's TSV files, as
LRA's Retrieval task tokenises them: the bytes of each of the two documents, as LRA's pipeline
(lra_benchmarks/matching/input_pipeline.py) reads and encodes them.
"""

import os

import numpy as np

from research.data import byte_text
from research.errors import InputError, excerpt

SPLITS = {"train": "train", "val": "eval", "test": "test"}   # split -> new_aan_pairs.<name>.tsv
FILE_NAME = "new_aan_pairs.{}.tsv"
FIELDS = ("label", "id1", "id2", "text1", "text2")
NUM_CLASSES = 2
VOCAB_SIZE = byte_text.VOCAB_SIZE
LRA_MAX_LENGTH = 4000           # per document
LRA_TEXT_CUT = 10_000           # LRA encodes at most a text's first 10 000 bytes
TOKENS = ("each paper's text field (a Python bytes literal b'…' as LRA's TSV holds it) as bytes, "
          "ids 1–256 (byte + 1), cut to max_length per document and padded with 0")
SOURCE = "LRA's lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv (lra_release.gz)"
_EXPECTED_ROW = f"{len(FIELDS)} tab-separated fields {'<TAB>'.join(FIELDS)} with a label 0 or 1"


def read_split(directory: str | os.PathLike, split: str, max_length: int) -> dict[str, np.ndarray]:
  """One split of LRA's AAN pairs in `directory`, tokenised as LRA does.

  The files are LRA's release (lra_release/tsv_data/ in lra_release.gz):
  new_aan_pairs.train.tsv, .eval.tsv and .test.tsv (about 147 000, 18 000 and 17 000 pairs).
  LRA reads them with no header and no quoting, a pair a line of five tab-separated fields

    label <TAB> id1 <TAB> id2 <TAB> text1 <TAB> text2       label 1: the papers are linked

  (the label parsed as a float and cast to int; an empty field stops LRA's reader, as it stops
  this one). Each text is encoded with tfds' ByteTextEncoder (research.data.byte_text) from at
  most its first 10 000 bytes, the ids cut to max_length (4000 in
  matching/configs/base_match_config.py, per document) and padded to max_length. The release
  writes each text as a Python bytes literal (b'…', line breaks escaped as \\n); LRA encodes the
  field as it stands, literal and escapes included, and so does this reader. LRA validates on
  the eval file and tests on the test file: splits train, val, test read train, eval, test.
  Pairs come in the files' order.

  Returns {"tokens": uint16 [N, 2, max_length] byte ids of text1 and text2 (0 pads),
  "lengths": int32 [N, 2] (ids kept per document), "labels": int32 [N] (1: linked)}. Raises
  InputError naming the file, and `path:line` for a line that is not UTF-8, has other than five
  fields, a label other than 0 or 1, or an empty text.
  """
  if split not in SPLITS:
    raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
  if max_length < 1:
    raise ValueError(f"max_length {max_length}: expected at least 1")
  path = os.path.join(directory, FILE_NAME.format(SPLITS[split]))
  try:
    with open(path, "rb") as f:
      count = _count_lines(f)
      f.seek(0)
      tokens = np.zeros((count, 2, max_length), np.uint16)
      lengths = np.zeros((count, 2), np.int32)
      labels = np.zeros(count, np.int32)
      for index, line in enumerate(f):
        labels[index], *texts = _pair(line, f"{path}:{index + 1}")
        for document, text in enumerate(texts):
          lengths[index, document] = byte_text.encode_into(
              tokens[index, document, :LRA_TEXT_CUT], text)
  except FileNotFoundError:
    raise InputError(f"{path}: no such file; expected {SOURCE}") from None
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
  if not count:
    raise InputError(f"{path}: an empty file; expected a pair a line, {_EXPECTED_ROW}")
  return {"tokens": tokens, "lengths": lengths, "labels": labels}


def _count_lines(f) -> int:
  """The number of lines of binary file `f` (a last line without a line break counts)."""
  count, last = 0, b"\n"
  while chunk := f.read(1 << 24):
    count += chunk.count(b"\n")
    last = chunk[-1:]
  return count + (last != b"\n")


def _pair(line: bytes, where: str) -> tuple[int, bytes, bytes]:
  """A line's (label, text1, text2); InputError naming `where` for a malformed line."""
  try:
    line.decode("utf-8")
  except UnicodeDecodeError as error:
    raise InputError(f"{where}: not UTF-8 text ({error.reason} at byte {error.start} of the "
                     "line)") from None
  if line.endswith(b"\n"):
    line = line[:-1]
  if line.endswith(b"\r"):
    line = line[:-1]
  fields = line.split(b"\t")
  if len(fields) != len(FIELDS):
    got = "an empty line" if fields == [b""] else f"{len(fields)} fields"
    raise InputError(f"{where}: expected {_EXPECTED_ROW}, got {got}")
  label, _, _, *texts = fields
  try:
    value = float(label)
  except ValueError:
    value = None
  if value not in (0.0, 1.0):
    raise InputError(f"{where}: expected a label 0 or 1 in the first field, got "
                     f"{excerpt(label.decode())}")
  for name, text in zip(FIELDS[3:], texts, strict=True):
    if not text:
      raise InputError(f"{where}: {name} is empty; expected {_EXPECTED_ROW}")
  return int(value), *texts
