"""Readers of IMDB's aclImdb folder, LRA's AAN TSVs and CIFAR-10's python batches, on small files
written here in those formats. Expected tokens are computed here from the documented rules:
tfds' ByteTextEncoder (id = byte + 1, 0 pads; ids checked against tfds' own output) and
tf.image.rgb_to_grayscale's float32 formula (grey levels checked against TensorFlow's own)."""

import _codecs
import os
import pickle

import numpy as np
import pytest

from research.data import aan, byte_text, cifar10, imdb
from research.errors import InputError


def byte_ids(text: bytes, length: int) -> list[int]:
  """ByteTextEncoder's ids of `text` (byte + 1), cut to `length` and padded with 0."""
  ids = [byte + 1 for byte in text][:length]
  return ids + [0] * (length - len(ids))


def write(path, content: bytes):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(content)


def test_byte_ids_are_tfds_byte_text_encoders():
  row = np.zeros(6, np.uint16)
  count = byte_text.encode_into(row, b"A\x00\xff\xc3\xa9")    # "é" is two bytes
  # tfds.deprecated.text.ByteTextEncoder().encode(b"A\x00\xff\xc3\xa9"), vocab_size 257:
  assert (count, row.tolist()) == (5, [66, 1, 256, 196, 170, 0])
  assert byte_text.VOCAB_SIZE == 257


IMDB_TRAIN = {
    "neg/1_3.txt": b"  Awful.<br /><br />Truly caf\xc3\xa9-bad.\n",
    "neg/0_2.txt": b"Bad film.",
    "pos/0_9.txt": b"Great! " * 5 + b"\n",
    "pos/10_8.txt": b"ok",
}


def test_imdb_reads_reviews_as_lra_does(tmp_path):
  for name, text in IMDB_TRAIN.items():
    write(tmp_path / "train" / name, text)
  write(tmp_path / "train" / "unsup" / "0_0.txt", b"unlabelled")
  write(tmp_path / "test" / "neg" / "0_1.txt", b"No.")
  write(tmp_path / "test" / "pos" / "3_10.txt", b"Yes!")
  length = 16
  train = imdb.read_split(tmp_path, "train", length)
  order = ["neg/0_2.txt", "neg/1_3.txt", "pos/0_9.txt", "pos/10_8.txt"]   # neg, pos; by name
  stripped = [IMDB_TRAIN[name].strip() for name in order]
  assert train["tokens"].dtype == np.uint16 and train["tokens"].shape == (4, length)
  assert train["tokens"].tolist() == [byte_ids(text, length) for text in stripped]
  assert train["lengths"].dtype == np.int32
  assert train["lengths"].tolist() == [min(len(text), length) for text in stripped]
  assert train["labels"].dtype == np.int32 and train["labels"].tolist() == [0, 0, 1, 1]
  assert b"<br />" in stripped[1] and train["lengths"][2] == length      # kept; cut
  val, test = imdb.read_split(tmp_path, "val", 8), imdb.read_split(tmp_path, "test", 8)
  for split in (val, test):                        # LRA evaluates on the test folder
    assert split["tokens"].tolist() == [byte_ids(b"No.", 8), byte_ids(b"Yes!", 8)]
    assert split["labels"].tolist() == [0, 1]


def aan_line(label: str, text1: bytes, text2: bytes, end: bytes = b"\n") -> bytes:
  return label.encode() + b"\t17\t42\t" + text1 + b"\t" + text2 + end


def test_aan_reads_pairs_as_lra_does(tmp_path):
  long_text = b"b'" + b"x" * 30 + b"'"
  pairs = [("1", b"b'Paper one\\nAbstract'", b"b'Paper two'", b"\n"),
           ("0.0", long_text, b"b'caf\\xc3\\xa9'", b"\r\n"),
           ("0", "é".encode(), b"b'z'", b"")]              # last line without a line break
  write(tmp_path / "new_aan_pairs.train.tsv", b"".join(aan_line(*pair) for pair in pairs))
  write(tmp_path / "new_aan_pairs.eval.tsv", aan_line("1", b"b'e1'", b"b'e2'"))
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("0", b"b't1'", b"b't2'"))
  length = 24
  train = aan.read_split(tmp_path, "train", length)
  assert train["tokens"].dtype == np.uint16 and train["tokens"].shape == (3, 2, length)
  assert train["tokens"].tolist() == [[byte_ids(text1, length), byte_ids(text2, length)]
                                      for _, text1, text2, _ in pairs]
  assert train["lengths"].dtype == np.int32
  assert train["lengths"].tolist() == [[min(len(text1), length), min(len(text2), length)]
                                       for _, text1, text2, _ in pairs]
  assert train["labels"].dtype == np.int32 and train["labels"].tolist() == [1, 0, 0]
  val = aan.read_split(tmp_path, "val", 4)                     # LRA's eval file
  assert val["tokens"].tolist() == [[byte_ids(b"b'e1'", 4), byte_ids(b"b'e2'", 4)]]
  assert aan.read_split(tmp_path, "test", 4)["labels"].tolist() == [0]


def test_aan_encodes_at_most_lras_first_10000_bytes(tmp_path):
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("1", b"y" * 10_005, b"b'short'"))
  test = aan.read_split(tmp_path, "test", 10_010)
  assert test["lengths"].tolist() == [[10_000, 8]]
  assert test["tokens"][0, 0].tolist() == [ord("y") + 1] * 10_000 + [0] * 10


def write_cifar_batch(path, data: np.ndarray, labels: list[int]):
  """A batch as CIFAR-10's python batches hold it: a dict with bytes keys, pickled (protocol 2,
  numpy's array under the module name numpy 1, which wrote the originals, gives it)."""
  batch = {b"batch_label": b"training batch", b"labels": labels, b"data": data,
           b"filenames": [b"picture_%d.png" % i for i in range(len(labels))]}
  content = pickle.dumps(batch, protocol=2).replace(b"numpy._core.multiarray",
                                                    b"numpy.core.multiarray")
  write(path, content)


def tf_grey(planar: np.ndarray) -> np.ndarray:
  """tf.image.rgb_to_grayscale of uint8 pictures, its operations in float32: x · (1/255), the
  BT.601 weights 0.2989, 0.5870, 0.1140 summed in that order, then trunc(y · 255.5)."""
  rgb = planar.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)         # [n, row, column, channel]
  x = rgb.astype(np.float32) * np.float32(1 / 255)
  w = np.array([0.2989, 0.5870, 0.1140], np.float32)
  y = x[..., 0] * w[0] + x[..., 1] * w[1] + x[..., 2] * w[2]
  return (y * np.float32(255.5)).astype(np.uint8).reshape(len(planar), 1024)


# (R, G, B) -> tf.image.rgb_to_grayscale's grey level, as TensorFlow 2.21 computes it (the first
# three differ from the same formula in float64, (0, 0, 7) from round(luma)).
TF_GREYS = {(0, 122, 186): 93, (3, 121, 122): 86, (5, 171, 227): 128, (0, 0, 7): 0,
            (255, 255, 255): 255, (1, 226, 64): 140, (152, 150, 127): 148, (0, 0, 0): 0}


def test_cifar10_reads_grey_levels_as_lra_does(tmp_path):
  rng = np.random.default_rng(0)
  train = [rng.integers(0, 256, (4, 3072), dtype=np.uint8) for _ in range(5)]
  train_labels = [rng.integers(0, 10, 4).tolist() for _ in range(5)]
  for number, (data, labels) in enumerate(zip(train, train_labels, strict=True), start=1):
    write_cifar_batch(tmp_path / f"data_batch_{number}", data, labels)
  test = np.zeros((2, 3072), np.uint8)
  for pixel, colour in enumerate(TF_GREYS):              # picture 0: TF's colours, first row
    test[0, [pixel, 1024 + pixel, 2048 + pixel]] = colour
  test[1, [34, 1024 + 34, 2048 + 34]] = 255               # picture 1: one white pixel, row 1, col 2
  write_cifar_batch(tmp_path / "test_batch", test, [3, 9])

  read = cifar10.read_split(tmp_path, "test")
  assert read["tokens"].dtype == np.uint8 and read["tokens"].shape == (2, 1024)
  assert read["tokens"][0, :len(TF_GREYS)].tolist() == list(TF_GREYS.values())
  assert np.flatnonzero(read["tokens"][1]).tolist() == [1 * 32 + 2]
  assert read["labels"].dtype == np.int32 and read["labels"].tolist() == [3, 9]
  everything, labels = np.concatenate(train), sum(train_labels, [])
  for split, rows in (("train", slice(0, 18)), ("val", slice(18, 20))):    # LRA's 90% / 10%
    read = cifar10.read_split(tmp_path, split)
    np.testing.assert_array_equal(read["tokens"], tf_grey(everything[rows]))
    assert read["labels"].tolist() == labels[rows]


def imdb_not_utf8(tmp_path):
  write(tmp_path / "train" / "pos" / "0_9.txt", b"fine")
  write(tmp_path / "train" / "neg" / "0_1.txt", b"caf\xe9")
  return lambda: imdb.read_split(tmp_path, "train", 8), ["train/neg/0_1.txt", "UTF-8"]


def imdb_missing_folder(tmp_path):
  write(tmp_path / "train" / "neg" / "0_1.txt", b"bad")
  return lambda: imdb.read_split(tmp_path, "test", 8), ["test/neg", "aclImdb_v1.tar.gz"]


def imdb_no_reviews(tmp_path):
  write(tmp_path / "train" / "neg" / "0_1.txt", b"bad")
  write(tmp_path / "train" / "pos" / "notes.md", b"not a review")
  return lambda: imdb.read_split(tmp_path, "train", 8), ["train/pos", "no reviews"]


def aan_missing_file(tmp_path):
  write(tmp_path / "new_aan_pairs.train.tsv", aan_line("1", b"a", b"b"))
  return lambda: aan.read_split(tmp_path, "val", 8), ["new_aan_pairs.eval.tsv", "lra_release"]


def aan_four_fields(tmp_path):
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("1", b"a", b"b") + b"0\t17\tb'a'\tb'b'\n")
  return (lambda: aan.read_split(tmp_path, "test", 8),
          ["new_aan_pairs.test.tsv:2", "5 tab-separated fields", "got 4 fields"])


def aan_word_label(tmp_path):
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("yes", b"a", b"b"))
  return (lambda: aan.read_split(tmp_path, "test", 8),
          ["new_aan_pairs.test.tsv:1", "label 0 or 1", "'yes'"])


def aan_fractional_label(tmp_path):
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("1", b"a", b"b") + aan_line("0.5", b"a", b"b"))
  return lambda: aan.read_split(tmp_path, "test", 8), ["new_aan_pairs.test.tsv:2", "'0.5'"]


def aan_empty_text(tmp_path):
  write(tmp_path / "new_aan_pairs.test.tsv", aan_line("1", b"b'a'", b""))
  return lambda: aan.read_split(tmp_path, "test", 8), ["new_aan_pairs.test.tsv:1", "text2 is empty"]


def cifar_train_batches(tmp_path, missing=None):
  for number in range(1, 6):
    if number != missing:
      write_cifar_batch(tmp_path / f"data_batch_{number}", np.zeros((1, 3072), np.uint8), [0])


def cifar_missing_batch(tmp_path):
  cifar_train_batches(tmp_path, missing=3)
  return lambda: cifar10.read_split(tmp_path, "train"), ["data_batch_3", "cifar-10-python.tar.gz"]


def cifar_without_data(tmp_path):
  write(tmp_path / "test_batch", pickle.dumps({b"labels": [1]}, protocol=2))
  return lambda: cifar10.read_split(tmp_path, "test"), ["test_batch", 'b"data"', "b'labels'"]


def cifar_wrong_shape(tmp_path):
  write_cifar_batch(tmp_path / "test_batch", np.zeros((2, 1024), np.uint8), [0, 1])
  return lambda: cifar10.read_split(tmp_path, "test"), ["test_batch", "uint8 [2, 1024]", "3072"]


def cifar_label_out_of_range(tmp_path):
  write_cifar_batch(tmp_path / "test_batch", np.zeros((2, 3072), np.uint8), [0, 10])
  return lambda: cifar10.read_split(tmp_path, "test"), ["test_batch", "2 ints 0–9"]


def cifar_not_a_pickle(tmp_path):
  write(tmp_path / "test_batch", b"data_batch_1,data_batch_2\n")
  return lambda: cifar10.read_split(tmp_path, "test"), ["test_batch", "not a CIFAR-10 python batch"]


class MakesADirectory:
  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return os.mkdir, (self.path,)


def cifar_pickle_that_runs_code(tmp_path):
  write(tmp_path / "test_batch", pickle.dumps(MakesADirectory(str(tmp_path / "ran")), protocol=2))
  return lambda: cifar10.read_split(tmp_path, "test"), ["test_batch", "mkdir, not a numpy array"]


@pytest.mark.parametrize("case", [
    imdb_not_utf8, imdb_missing_folder, imdb_no_reviews, aan_missing_file, aan_four_fields,
    aan_word_label, aan_fractional_label, aan_empty_text, cifar_missing_batch, cifar_without_data,
    cifar_wrong_shape, cifar_label_out_of_range, cifar_not_a_pickle, cifar_pickle_that_runs_code])
def test_a_missing_or_malformed_file_is_one_line_naming_it(tmp_path, case):
  read, expected = case(tmp_path)
  with pytest.raises(InputError) as raised:
    read()
  message = str(raised.value)
  assert "\n" not in message and str(tmp_path) in message
  for part in expected:
    assert part in message
  assert not (tmp_path / "ran").exists()              # the pickle's code did not run


class Declares:
  """Pickles as a call of `function` on `args` (then, with a `state`, numpy's BUILD of it): an
  array as a crafted batch declares it, through the globals numpy's own pickles name."""

  def __init__(self, function, args, state=None):
    self.function, self.args, self.state = function, args, state

  def __reduce__(self):
    return (self.function, self.args) + ((self.state,) if self.state is not None else ())


RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]      # numpy.(_)core.multiarray._reconstruct
U1, F8 = np.dtype("u1"), np.dtype("f8")
PICTURES = cifar10.BATCH_PICTURES

# b"data" -> what the one-line InputError says: arrays declared larger than a batch's 10 000 x
# 3072 uint8 (by shape, by dtype, by either path numpy's pickles build arrays on), or of
# Python objects, and calls numpy's pickles do not make.
DECLARED = {
    "10^11 elements, reconstructed": (
        Declares(RECONSTRUCT, (np.ndarray, (10**11,), b"b")),
        "array of int8 [100000000000], 100,000,000,000 bytes, more than a batch holds"),
    "10^11 elements, in its state": (
        Declares(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (10**11,), U1, False, b"abc")),
        "array of uint8 [100000000000], 100,000,000,000 bytes"),
    "10^11 elements, called": (Declares(np.ndarray, ((10**5, 10**6), U1)),
                               "array of uint8 [100000, 1000000]"),
    "a 333-bit dimension": (Declares(np.ndarray, ((10**100,), U1)), "[a 333-bit number]"),
    "a batch's shape in float64": (Declares(np.ndarray, ((PICTURES, 3072), F8)),
                                   "array of float64 [10000, 3072], 245,760,000 bytes"),
    "one picture more than a batch": (Declares(np.ndarray, ((PICTURES + 1, 3072), U1)),
                                      "[10001, 3072], 30,723,072 bytes"),
    "a 2 GB element": (
        Declares(RECONSTRUCT, (np.ndarray, (1,), np.dtype(("u1", (40_000, 50_000))))),
        "2,000,000,000 bytes"),
    "Python objects": (Declares(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2,), np.dtype("O"),
                                                                      False, [1, 2])),
                       "array of Python objects"),
    "data shorter than its shape": (Declares(RECONSTRUCT, (np.ndarray, (0,), b"b"),
                                             (1, (2, 3072), U1, False, b"abc")),
                                    "array of uint8 [2, 3072] whose data is not as many bytes"),
    "a negative dimension": (Declares(np.ndarray, ((-1, 3072), U1)), "whole numbers"),
    "an encoding numpy does not use": (Declares(_codecs.encode, ("abc", "punycode")),
                                       "_codecs.encode other than as numpy's arrays do"),
}


@pytest.mark.parametrize("case", DECLARED)
def test_an_array_larger_than_a_batch_is_refused_before_it_is_allocated(tmp_path, case):
  declared, message = DECLARED[case]
  write(tmp_path / "test_batch", pickle.dumps({b"data": declared, b"labels": [0]}, protocol=2))
  with pytest.raises(InputError) as raised:
    cifar10.read_split(tmp_path, "test")
  text = str(raised.value)
  assert text.startswith(f"{tmp_path / 'test_batch'}: not a CIFAR-10 python batch (")
  assert message in text and "MemoryError" not in text and "\n" not in text
  assert "uint8 [n ≤ 10000, 3072]" in text                   # what was expected


@pytest.mark.slow
def test_a_full_batch_is_read_and_its_arrays_are_plain_numpy(tmp_path):
  """10 000 pictures of bytes 255, which numpy's protocol-2 pickle writes as two bytes each:
  61 MB, the largest a batch re-pickled by Python 3 takes."""
  write_cifar_batch(tmp_path / "test_batch", np.full((PICTURES, 3072), 255, np.uint8),
                    [9] * PICTURES)
  read = cifar10.read_split(tmp_path, "test")
  assert read["tokens"].shape == (PICTURES, 1024) and (read["tokens"] == 255).all()
  assert type(read["tokens"]) is np.ndarray and type(read["labels"]) is np.ndarray


def nested_labels() -> list:
  """10^12 ints once numpy makes an array of them, a few KB pickled (each level one list
  referenced ten times)."""
  labels = [0] * 10
  for _ in range(11):
    labels = [labels] * 10
  return labels


@pytest.mark.parametrize("labels", [nested_labels(), [0, 1, 2], [True], [0.0], ["0"]],
                         ids=["10^12 nested", "more than pictures", "a bool", "a float", "a str"])
def test_labels_are_checked_as_a_list_before_numpy_builds_them(tmp_path, labels):
  write_cifar_batch(tmp_path / "test_batch", np.zeros((1, 3072), np.uint8), labels)
  with pytest.raises(InputError, match='test_batch: b"labels" is not 1 ints 0–9'):
    cifar10.read_split(tmp_path, "test")


def test_a_file_larger_than_a_batch_is_refused_unread(tmp_path, monkeypatch):
  write_cifar_batch(tmp_path / "test_batch", np.zeros((1, 3072), np.uint8), [0])
  monkeypatch.setattr(cifar10, "MAX_FILE_BYTES", 1000)            # the file takes 3.3 KB
  with pytest.raises(InputError, match="test_batch: more than 1,000 bytes, more than a CIFAR-10 "
                     "batch takes"):
    cifar10.read_split(tmp_path, "test")


def test_running_out_of_memory_unpickling_is_one_line_naming_the_batch(tmp_path, monkeypatch):
  write_cifar_batch(tmp_path / "test_batch", np.zeros((1, 3072), np.uint8), [0])

  def out_of_memory(self):
    raise MemoryError

  monkeypatch.setattr(cifar10._ArrayUnpickler, "load", out_of_memory)
  with pytest.raises(InputError, match="test_batch: not a CIFAR-10 python batch [(]MemoryError"):
    cifar10.read_split(tmp_path, "test")
