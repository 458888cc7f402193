"""CIFAR-10 (Krizhevsky, 2009) read from its python batches as Long Range Arena's Image task
tokenises it: 1024 grey levels a picture, as LRA's pipeline (lra_benchmarks/image/
input_pipeline.py) makes them from tfds' `cifar10`. The pickles are read by an unpickler that
builds only numpy arrays, each sized before numpy allocates it, so a file can neither run code
nor take more memory than a batch.
"""

import io
import math
import os
import pickle

import numpy as np

from research.errors import InputError, excerpt

TRAIN_BATCHES = tuple(f"data_batch_{number}" for number in range(1, 6))
TEST_BATCH = "test_batch"
SPLITS = ("train", "val", "test")
SIDE = 32
LENGTH = SIDE * SIDE
NUM_CLASSES = 10
VOCAB_SIZE = 256                # grey levels 0–255
GREY_WEIGHTS = (0.2989, 0.5870, 0.1140)
TOKENS = ("the picture's 1024 grey levels 0–255 (tf.image.rgb_to_grayscale of the RGB), "
          "row by row from the top left")
SOURCE = ("the cifar-10-batches-py folder of cifar-10-python.tar.gz from "
          "https://www.cs.toronto.edu/~kriz/cifar.html")
BATCH_PICTURES = 10_000         # in each of CIFAR-10's batch files
MAX_ARRAY_BYTES = BATCH_PICTURES * 3 * LENGTH       # a batch's b"data": the largest array in it
MAX_FILE_BYTES = 4 * MAX_ARRAY_BYTES    # CIFAR-10's files take 31 MB; numpy's protocol-2 pickle
                                        # writes a byte >= 128 of an array as two
_EXPECTED = (f'a dict with b"data" uint8 [n ≤ {BATCH_PICTURES}, {3 * LENGTH}] (1024 red, green, '
             'blue values a picture) and b"labels" n ints 0–9')
# The globals a numpy array's pickle names (numpy 1 wrote the originals; numpy 2 calls it _core).
_ARRAY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray",
                  "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


def read_split(directory: str | os.PathLike, split: str) -> dict[str, np.ndarray]:
  """One split of the `cifar-10-batches-py` folder at `directory`, as LRA tokenises it.

  The folder is `cifar-10-batches-py` from cifar-10-python.tar.gz
  (https://www.cs.toronto.edu/~kriz/cifar.html): data_batch_1 … data_batch_5 and test_batch,
  each a dict pickled by Python 2 whose b"data" is uint8 [10000, 3072] (per picture the 1024
  red, then green, then blue values of a 32×32 image, rows top to bottom) and b"labels" 10 000
  ints 0–9. Splits as LRA's: train[:90%], train[90%:] and test, 45 000, 5 000 and 10 000
  pictures. tfds stores the training pictures in an order of its own (a hash), so LRA's 5 000
  validation pictures are not recoverable from the batches; here they are the last tenth in
  batch order (the second half of data_batch_5), the rest is train.

  Returns {"tokens": uint8 [N, 1024] grey levels row-major, "labels": int32 [N] (0–9)}.
  Raises InputError naming the batch file that is missing, not a pickle of CIFAR-10's form,
  or holds data of another shape or type.
  """
  if split not in SPLITS:
    raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
  names = (TEST_BATCH,) if split == "test" else TRAIN_BATCHES
  batches = [_batch(os.path.join(directory, name)) for name in names]
  tokens = np.concatenate([grey_levels(data) for data, _ in batches])
  labels = np.concatenate([labels for _, labels in batches])
  boundary = len(labels) - len(labels) // 10             # LRA: train[:90%], train[90%:]
  rows = {"train": slice(None, boundary), "val": slice(boundary, None), "test": slice(None)}[split]
  return {"tokens": tokens[rows], "labels": labels[rows]}


def grey_levels(data: np.ndarray) -> np.ndarray:
  """uint8 [n, 3072] channel-planar RGB -> uint8 [n, 1024] grey, as tf.image.rgb_to_grayscale.

  LRA turns each picture grey with that function (ITU-R BT.601 luma weights), into int tokens
  0–255 of a 1024 sequence, rows top to bottom. It computes, in float32,

    y = 0.2989 · (R · 1/255) + 0.5870 · (G · 1/255) + 0.1140 · (B · 1/255)
    grey = trunc(y · 255.5)

  (about floor(1.002 · luma): (0, 0, 7) is 0, not round(luma) = 1; and float32 matters: (0,
  122, 186) is 93, the same formula in float64 gives 92). This follows it operation by
  operation in float32; it agrees with TensorFlow 2.21 on all 2^24 colours.
  """
  channels = data.reshape(-1, 3, LENGTH).astype(np.float32) * np.float32(1 / 255)
  red, green, blue = (np.float32(weight) for weight in GREY_WEIGHTS)
  luma = channels[:, 0] * red + channels[:, 1] * green + channels[:, 2] * blue
  return (luma * np.float32(255.5)).astype(np.uint8)


def _declared(shape, dtype) -> tuple[tuple[int, ...], np.dtype]:
  """(shape, dtype) of an array a pickle declares, before anything is allocated; refused
  (pickle.UnpicklingError) unless the shape is whole numbers ≥ 0, the dtype holds numbers (not
  Python objects) and the array takes at most MAX_ARRAY_BYTES."""
  shape = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
  if len(shape) > 32 or not all(isinstance(n, int) and n >= 0 for n in shape):
    raise pickle.UnpicklingError("it declares an array whose shape is not at most 32 whole "
                                 "numbers ≥ 0")
  dtype = np.dtype(dtype)
  if dtype.hasobject:
    raise pickle.UnpicklingError(f"it declares an array of Python objects ({dtype})")
  size = math.prod(shape) * dtype.itemsize
  if size > MAX_ARRAY_BYTES:
    dimensions = ", ".join(str(n) if n.bit_length() < 64 else f"a {n.bit_length()}-bit number"
                           for n in shape)
    raise pickle.UnpicklingError(
        f"it declares an array of {dtype} [{dimensions}], {_bytes(size)}, more than a batch "
        f"holds ({BATCH_PICTURES} × {3 * LENGTH} uint8, {MAX_ARRAY_BYTES:,} bytes)")
  return shape, dtype


def _bytes(size: int) -> str:
  """A byte count for a message (one too long to print by its number of bits)."""
  if size.bit_length() < 64:
    return f"{size:,} bytes"
  return f"a {size.bit_length()}-bit number of bytes"


class _Array(np.ndarray):
  """numpy's array as a batch's pickle may build it (find_class's "numpy.ndarray"): its size
  checked (`_declared`) before numpy allocates it, whether called, reconstructed or given its
  state. `_batch` turns it back into a plain ndarray."""

  def __new__(cls, shape, dtype=float):          # ndarray(shape, dtype): no buffer, no strides
    return super().__new__(cls, *_declared(shape, dtype))

  def __setstate__(self, state):
    """numpy's (version, shape, dtype, is_fortran, data bytes) (or without the version)."""
    if not (isinstance(state, tuple) and len(state) in (4, 5)):
      raise pickle.UnpicklingError("it gives an array a state other than numpy's")
    shape, dtype = _declared(*state[-4:-2])
    data = state[-1]
    if not (isinstance(data, bytes) and len(data) == math.prod(shape) * dtype.itemsize):
      raise pickle.UnpicklingError(f"it declares an array of {dtype} {list(shape)} whose data "
                                   "is not as many bytes")
    super().__setstate__(state)


_NUMPY_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]   # numpy.(_)core.multiarray's


def _reconstruct(subtype, shape, dtype):
  """numpy's _reconstruct (an empty array numpy's pickles then give their state), sized first."""
  if subtype is not _Array:
    raise pickle.UnpicklingError("it reconstructs something other than a numpy array")
  return _NUMPY_RECONSTRUCT(_Array, *_declared(shape, dtype))


def _encode(text, encoding="utf-8", errors="strict"):
  """_codecs.encode as numpy's pickles use it: a str of an array's bytes, to latin1."""
  if not (isinstance(text, str) and encoding in ("latin1", "latin-1")):
    raise pickle.UnpicklingError("it calls _codecs.encode other than as numpy's arrays do (a str "
                                 "to latin1)")
  return text.encode("latin1", errors)


_CHECKED = {"ndarray": _Array, "_reconstruct": _reconstruct, "encode": _encode}


class _ArrayUnpickler(pickle.Unpickler):
  """Unpickles dicts, lists, numbers, bytes and numpy arrays (sized before they are allocated,
  `_Array`); refuses any other global.

  So a file cannot run code, and cannot take more memory than a batch: a file of at most
  MAX_FILE_BYTES, arrays of numbers of at most a batch's data (10 000 × 3072 uint8,
  MAX_ARRAY_BYTES), labels checked as a list before numpy builds anything from them (`_labels`).
  """

  def find_class(self, module, name):
    if (module, name) not in _ARRAY_GLOBALS:
      raise pickle.UnpicklingError(f"it names {module}.{name}, not a numpy array")
    return _CHECKED.get(name) or super().find_class(module, name)


def _batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """A batch file's (data uint8 [n, 3072], labels int32 [n]), checked; no larger than a batch
  of CIFAR-10 (see `_declared`), and no MemoryError escapes: each is one InputError."""
  try:
    with open(path, "rb") as f:
      content = f.read(MAX_FILE_BYTES + 1)
    if len(content) > MAX_FILE_BYTES:
      raise InputError(f"{path}: more than {MAX_FILE_BYTES:,} bytes, more than a CIFAR-10 batch "
                       f"takes (31 MB); expected {_EXPECTED}, as in {SOURCE}")
    batch = _ArrayUnpickler(io.BytesIO(content), encoding="bytes").load()
  except FileNotFoundError:
    raise InputError(f"{path}: no such file; expected {', '.join(TRAIN_BATCHES)} and "
                     f"{TEST_BATCH} from {SOURCE}") from None
  except InputError:
    raise
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
          KeyError, ImportError, UnicodeError, MemoryError, OverflowError) as error:
    raise InputError(f"{path}: not a CIFAR-10 python batch ({type(error).__name__}: {error}); "
                     f"expected {_EXPECTED}, as in {SOURCE}") from None
  if not isinstance(batch, dict) or not {b"data", b"labels"} <= batch.keys():
    got = (f"keys {', '.join(_key(key) for key in list(batch)[:8])}" if isinstance(batch, dict)
           else f"a {type(batch).__name__}")
    raise InputError(f"{path}: expected {_EXPECTED}, got {got}")
  data = batch[b"data"]
  if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
          and data.shape[1] == 3 * LENGTH):
    got = (f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray)
           else f"a {type(data).__name__}")
    raise InputError(f'{path}: b"data" is {got}; expected {_EXPECTED}')
  return np.asarray(data), _labels(path, batch[b"labels"], len(data))


def _key(key) -> str:
  """A dict key for a message: bytes and str shown (cut short), others by type (the repr of a
  crafted tuple or int can take long or fail)."""
  return excerpt(repr(key)) if isinstance(key, bytes | str) else type(key).__name__


def _labels(path: str, labels, rows: int) -> np.ndarray:
  """int32 [rows] of a batch's b"labels": a list of `rows` ints 0–9 (CIFAR-10's) or such a
  1-D integer array; a list is checked item by item before numpy builds anything of it."""
  if isinstance(labels, np.ndarray):
    labels = np.asarray(labels)
    fits = (labels.dtype.kind in "iu" and labels.shape == (rows,)
            and labels.min(initial=0) >= 0 and labels.max(initial=0) < NUM_CLASSES)
  else:
    fits = (isinstance(labels, list | tuple) and len(labels) == rows
            and all(type(label) is int and 0 <= label < NUM_CLASSES for label in labels))
  if not fits:
    raise InputError(f'{path}: b"labels" is not {rows} ints 0–{NUM_CLASSES - 1} (one a '
                     f'picture); expected {_EXPECTED}')
  return np.asarray(labels, np.int32)
