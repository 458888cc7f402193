"""CIFAR-10 (Krizhevsky, 2009) read from its python batches as Long Range Arena's Image task
tokenises it: 1024 grey levels a picture.

The folder is `cifar-10-batches-py` from cifar-10-python.tar.gz
(https://www.cs.toronto.edu/~kriz/cifar.html): data_batch_1 … data_batch_5 and test_batch,
each a dict pickled by Python 2 whose b"data" is uint8 [10000, 3072] (per picture the 1024 red,
then green, then blue values of a 32×32 image, rows top to bottom) and b"labels" 10 000 ints
0–9. The pickles are read with an unpickler that builds only numpy arrays, so a file cannot run
code.

LRA (lra_benchmarks/image/input_pipeline.py) takes tfds' `cifar10` and turns each picture grey
with `tf.image.rgb_to_grayscale` (ITU-R BT.601 luma weights) into int tokens 0–255 of a 1024
sequence, rows top to bottom. That function computes, in float32,

  y = 0.2989 · (R · 1/255) + 0.5870 · (G · 1/255) + 0.1140 · (B · 1/255)
  grey = trunc(y · 255.5)

(about floor(1.002 · luma): (0, 0, 7) is 0, not round(luma) = 1; and float32 matters: (0, 122,
186) is 93, the same formula in float64 gives 92). `grey_levels` follows it operation by
operation in float32; it agrees with TensorFlow 2.21 on all 2^24 colours.

Splits as LRA's: train[:90%], train[90%:] and test, 45 000, 5 000 and 10 000 pictures. tfds
stores the training pictures in an order of its own (a hash), so LRA's 5 000 validation pictures
are not recoverable from the batches; here they are the last tenth in batch order (the second
half of data_batch_5), the rest is train.
"""

import os
import pickle

import numpy as np

from research.errors import InputError

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
_EXPECTED = (f'a dict with b"data" uint8 [n, {3 * LENGTH}] (1024 red, green, blue values a '
             'picture) and b"labels" n ints 0–9')
# The globals a numpy array's pickle names (numpy 1 wrote the originals; numpy 2 calls it _core).
_ARRAY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray",
                  "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


def read_split(directory: str | os.PathLike, split: str) -> dict[str, np.ndarray]:
  """One split of the `cifar-10-batches-py` folder at `directory`, as LRA tokenises it.

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
  """uint8 [n, 3072] channel-planar RGB -> uint8 [n, 1024] grey, as tf.image.rgb_to_grayscale."""
  channels = data.reshape(-1, 3, LENGTH).astype(np.float32) * np.float32(1 / 255)
  red, green, blue = (np.float32(weight) for weight in GREY_WEIGHTS)
  luma = channels[:, 0] * red + channels[:, 1] * green + channels[:, 2] * blue
  return (luma * np.float32(255.5)).astype(np.uint8)


class _ArrayUnpickler(pickle.Unpickler):
  """Unpickles dicts, lists, numbers, bytes and numpy arrays; refuses any other global."""

  def find_class(self, module, name):
    if (module, name) not in _ARRAY_GLOBALS:
      raise pickle.UnpicklingError(f"it names {module}.{name}, not a numpy array")
    return super().find_class(module, name)


def _batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """A batch file's (data uint8 [n, 3072], labels int32 [n]), checked."""
  try:
    with open(path, "rb") as f:
      batch = _ArrayUnpickler(f, encoding="bytes").load()
  except FileNotFoundError:
    raise InputError(f"{path}: no such file; expected {', '.join(TRAIN_BATCHES)} and "
                     f"{TEST_BATCH} from {SOURCE}") from None
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
          KeyError, ImportError, UnicodeDecodeError) as error:
    raise InputError(f"{path}: not a CIFAR-10 python batch ({error}); expected {_EXPECTED}, "
                     f"as in {SOURCE}") from None
  if not isinstance(batch, dict) or not {b"data", b"labels"} <= batch.keys():
    got = (f"keys {', '.join(map(repr, batch))}" if isinstance(batch, dict)
           else f"a {type(batch).__name__}")
    raise InputError(f"{path}: expected {_EXPECTED}, got {got}")
  data, labels = batch[b"data"], np.asarray(batch[b"labels"])
  if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
          and data.shape[1] == 3 * LENGTH):
    got = (f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray)
           else f"a {type(data).__name__}")
    raise InputError(f'{path}: b"data" is {got}; expected {_EXPECTED}')
  if not (labels.dtype.kind in "iu" and labels.shape == (len(data),)
          and labels.min(initial=0) >= 0 and labels.max(initial=0) < NUM_CLASSES):
    raise InputError(f'{path}: b"labels" is not {len(data)} ints 0–{NUM_CLASSES - 1} (one a '
                     f'picture); expected {_EXPECTED}')
  return data, labels.astype(np.int32)
