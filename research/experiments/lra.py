"""The lra experiment: Long Range Arena's Text, Retrieval, Image and Pathfinder tasks
(Tay et al., ICLR 2021) with every attention variant and the LRU / S5 blocks (ListOps, LRA's
fifth task, is the listops experiment). config.data.task picks the task; each reads its data
from the user's files in the form it is distributed (`data.files`, nothing is downloaded),
Pathfinder's also generated here.
"""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.data import aan, cifar10, imdb, pathfinder
from research.errors import ConfigError
from research.experiments.classification import bucket_boundaries, classification_workload
from research.experiments.stack_config import (
  check_stack_keys,
  check_stack_sizes,
  parameter_count,
  parameter_keys,
)
from research.models.block_stack import POSITIONS
from research.models.dual_encoder_classifier import DualEncoderClassifier
from research.models.encoder_classifier import POOLINGS, EncoderClassifier
from research.models.kinds import BLOCK_KINDS
from research.models.transformer_block import NORMS
from research.training.config import (
  check_choice,
  check_host_memory,
  check_int,
  check_parameter_memory,
  check_positive,
  check_writable,
)
from research.training.experiment import Inference, Model, Workload, register

SPLITS = ("train", "val", "test")
# Test accuracy (%) in LRA's Table 1 (Tay et al., ICLR 2021) for our attention variants, per
# task (Path-X: every model failed, at chance); and the linear recurrences' papers' figures
# (Orvieto et al., 2023, Table 1: LRU; Smith et al., 2023, Table 1: S5), from their own
# recipes (deeper, longer-trained models than LRA's).
LRA_TABLE_1 = {
    "text": {"full": 64.27, "local": 52.98, "sparse": 63.58, "longformer": 62.85,
             "linformer": 53.94, "reformer": 56.10, "sinkhorn": 61.20, "synthesizer": 61.68,
             "bigbird": 64.02, "linear": 65.90, "performer": 65.40},
    "retrieval": {"full": 57.46, "local": 53.39, "sparse": 59.59, "longformer": 56.89,
                  "linformer": 52.27, "reformer": 53.40, "sinkhorn": 53.83, "synthesizer": 54.67,
                  "bigbird": 59.29, "linear": 53.09, "performer": 53.82},
    "image": {"full": 42.44, "local": 41.46, "sparse": 44.24, "longformer": 42.22,
              "linformer": 38.56, "reformer": 38.07, "sinkhorn": 41.23, "synthesizer": 41.61,
              "bigbird": 40.83, "linear": 42.34, "performer": 42.77},
    "pathfinder": {"full": 71.40, "local": 66.63, "sparse": 71.71, "longformer": 69.71,
                   "linformer": 76.34, "reformer": 68.50, "sinkhorn": 67.45, "synthesizer": 69.45,
                   "bigbird": 74.87, "linear": 75.30, "performer": 77.05},
}
RECURRENCE_PAPERS = {"lru": {"text": 89.4, "retrieval": 89.9, "image": 89.0, "pathfinder": 95.1,
                             "path_x": 94.2},
                     "s5": {"text": 89.31, "retrieval": 91.40, "image": 88.00,
                            "pathfinder": 95.33, "path_x": 98.58}}


class Task(NamedTuple):
  vocab_size: int
  num_classes: int
  pairs: bool                  # document pairs: tokens [N, 2, L]
  tokens: str                  # what a token is (the exported model's documentation)
  source: str                  # what data.files must hold


TASKS = {
    "text": Task(imdb.VOCAB_SIZE, imdb.NUM_CLASSES, False, imdb.TOKENS, imdb.SOURCE),
    "retrieval": Task(aan.VOCAB_SIZE, aan.NUM_CLASSES, True, aan.TOKENS, aan.SOURCE),
    "image": Task(cifar10.VOCAB_SIZE, cifar10.NUM_CLASSES, False, cifar10.TOKENS,
                  cifar10.SOURCE),
    "pathfinder": Task(pathfinder.VOCAB_SIZE, pathfinder.NUM_CLASSES, False, pathfinder.TOKENS,
                       pathfinder.SOURCE),
}
BYTE_TASKS = ("text", "retrieval")
AAN_PAIRS = (147_086, 18_090, 17_437)     # LRA's train, eval and test TSVs
LRA_PATHFINDER_IMAGES = 200_000           # per difficulty in LRA's release


def max_length(config) -> int:
  """Tokens per input (per document for Retrieval): data.max_length for the byte tasks, the
  pixels for the image tasks."""
  d = config.data
  return {"text": d.get("max_length"), "retrieval": d.get("max_length"),
          "image": cifar10.LENGTH, "pathfinder": d.get("resolution", 0) ** 2}[d.task]


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / config.model value, naming the key."""
  d = config.data
  check_choice(config, "data.task", TASKS)
  for key, allowed in (("kind", BLOCK_KINDS), ("positions", POSITIONS), ("norm", NORMS),
                       ("pooling", POOLINGS)):
    check_choice(config, f"model.{key}", allowed)
  check_stack_keys(config, causal=False)
  if d.task in BYTE_TASKS:
    check_positive(config, "data.max_length", "data.length_buckets")
    check_int(config, "data.max_length", "data.length_buckets")
  if d.task == "pathfinder":
    check_choice(config, "data.resolution", pathfinder.RESOLUTIONS)
    check_choice(config, "data.difficulty", pathfinder.DIFFICULTIES)
    if not d.files:
      check_positive(config, "data.examples")
      check_int(config, "data.examples", "data.seed")
  length = max_length(config)
  cls = config.model.pooling == "cls"
  check_stack_sizes(config, length + cls, f"the {d.task} task's inputs of {length} tokens"
                    + (" and the CLS token" if cls else ""))
  if d.files and not os.path.isdir(d.files):
    raise ConfigError(f"config.data.files={d.files!r} is not a directory; give "
                      f"{TASKS[d.task].source}")
  if generates_data(config):
    check_writable(config, "data.dir", "the generated Pathfinder images, or LRA's with "
                   "config.data.files")
  check_host_memory(config, _memory_keys(config), _token_bytes(config),
                    f"the {d.task} task's tokens")
  length_keys = {"text": ("data.max_length",), "retrieval": ("data.max_length",),
                 "image": (), "pathfinder": ("data.resolution",)}[d.task]
  check_parameter_memory(config, parameter_keys(config, *length_keys),
                         parameter_count(config, length))


def _memory_keys(config) -> tuple[str, ...]:
  """The keys that size the task's token arrays (_token_bytes)."""
  d = config.data
  return {"text": ("data.max_length",), "retrieval": ("data.max_length",),
          "image": ("data.task",),
          "pathfinder": ("data.resolution",) if d.files else ("data.examples",
                                                              "data.resolution")}[d.task]


def _token_bytes(config) -> int:
  """The host memory the task's token arrays take, from the data sets' sizes (rows of
  uint16 byte ids, of uint8 pixels; Text reads IMDB's test folder for val and for test)."""
  d = config.data
  rows = {"text": 3 * 25_000, "retrieval": 2 * sum(AAN_PAIRS), "image": 60_000,
          "pathfinder": d.get("examples") if not d.files else LRA_PATHFINDER_IMAGES}[d.task]
  return rows * max_length(config) * (2 if d.task in BYTE_TASKS else 1)


def generated_root(config) -> str:
  """Where config.data's generated Pathfinder images live (LRA's layout below it):
  <dir>/pathfinder-n<examples>-seed<seed>."""
  d = config.data
  return os.path.join(d.dir, f"pathfinder-n{d.examples}-seed{d.seed}")


def generates_data(config) -> bool:
  """Whether building config's task generates its data (minutes): Pathfinder without the
  user's files, not generated yet."""
  d = config.data
  return (d.task == "pathfinder" and not d.files
          and not pathfinder.is_generated(generated_root(config), d.resolution, d.difficulty,
                                          d.examples, d.seed))


def read_splits(config) -> dict[str, dict[str, np.ndarray]]:
  """split -> {"tokens", "lengths", "labels"} of config's task, read from the user's files
  (Pathfinder: or generated once, then read):

    text        IMDB reviews (research/data/imdb.py: the `aclImdb` folder) as bytes, 2 classes
    retrieval   pairs of ACL papers (research/data/aan.py: LRA's new_aan_pairs TSVs) as bytes,
                linked or not, through a two-tower encoder (DualEncoderClassifier)
    image       CIFAR-10 (research/data/cifar10.py: `cifar-10-batches-py`) as 1024 grey
                levels, 10 classes
    pathfinder  Pathfinder's R × R images (research/data/pathfinder.py) as R² grey levels,
                connected or not: LRA's released `pathfinder32|64|128` folders (data.files:
                the folder holding them), or generated once into <data.dir>/pathfinder…/ in
                the same layout and read back from there; R = 128 is Path-X
  """
  d = config.data
  if not d.files and d.task != "pathfinder":
    raise ConfigError(f"config.data.files='' but the {d.task} task reads its data from your "
                      f"files: give --config.data.files=DIR, DIR {TASKS[d.task].source} "
                      "(compiling alone, --compile_only, needs none)")
  if d.task == "text":
    return {split: imdb.read_split(d.files, split, d.max_length) for split in SPLITS}
  if d.task == "retrieval":
    return {split: aan.read_split(d.files, split, d.max_length) for split in SPLITS}
  if d.task == "image":
    splits = {split: cifar10.read_split(d.files, split) for split in SPLITS}
  elif d.files:
    splits = pathfinder.read_release(d.files, d.resolution, d.difficulty)
  else:
    splits = _read_generated_pathfinder(config)
  return {split: {**arrays, "lengths": np.full(len(arrays["labels"]), max_length(config),
                                               np.int32)}
          for split, arrays in splits.items()}


def _read_generated_pathfinder(config) -> dict[str, dict[str, np.ndarray]]:
  """Pathfinder's images generated into generated_root(config) (once) and read back, under
  the data set's lock (pathfinder.read_generated): a second run on the same data.dir waits
  for the first's generation, and neither reads a partial set."""
  d, root = config.data, generated_root(config)
  try:
    return pathfinder.read_generated(root, d.resolution, d.difficulty, d.examples, d.seed)
  except OSError as error:
    raise ConfigError(f"config.data.dir={d.dir!r}: cannot write the generated images to "
                      f"{error.filename or root} ({error.strerror or error}); give a "
                      "directory you can write to") from None


class Data(NamedTuple):
  splits: dict[str, dict[str, np.ndarray]]   # split -> {"tokens", "lengths", "labels"}
  boundaries: tuple[int, ...]                # ascending bucket bounds, the last max_length;
                                             # () for the image tasks (no buckets)


def load_data(config) -> Data:
  """The splits and their length buckets: the byte tasks' examples are cut to
  data.max_length (per document for Retrieval) and bucketed by length (data.length_buckets,
  as ListOps); the pixel tasks' sequences all have R² tokens."""
  splits = read_splits(config)
  if config.data.task not in BYTE_TASKS:
    return Data(splits, ())
  lengths = splits["train"]["lengths"]
  return Data(splits, bucket_boundaries(lengths.max(-1) if lengths.ndim > 1 else lengths,
                                        config.data.length_buckets, config.data.max_length))


def _dtype(config):
  """The tokens' dtype as the readers return them: byte ids uint16, grey levels uint8."""
  return np.uint16 if config.data.task in BYTE_TASKS else np.uint8


def _input_shape(config, rows: int) -> tuple[int, ...]:
  pairs = TASKS[config.data.task].pairs
  return (rows, 2, max_length(config)) if pairs else (rows, max_length(config))


def placeholder_data(config) -> Data:
  """One batch of full-length examples per split, with no file read or generated: the
  largest batch training meets (`build_shapes`, for compiling)."""
  rows, length = config.train.batch_size, max_length(config)
  shape = _input_shape(config, rows)
  split = {"tokens": np.ones(shape, _dtype(config)),
           "lengths": np.full(shape[:-1], length, np.int32), "labels": np.zeros(rows, np.int32)}
  return Data(dict.fromkeys(SPLITS, split), (length,) if config.data.task in BYTE_TASKS else ())


def build_model(config, read=None) -> Model:
  """config.model's EncoderClassifier (DualEncoderClassifier for Retrieval) over the task's
  vocabulary (257 byte ids, 256 grey levels), initialised on one input of max_length tokens;
  extras {"task": data.task}."""
  del read     # the run writes no file
  task = TASKS[config.data.task]
  classifier = DualEncoderClassifier if task.pairs else EncoderClassifier
  model = classifier(**config.model, vocab_size=task.vocab_size, num_classes=task.num_classes,
                     max_length=max_length(config))
  shape = _input_shape(config, 1)
  return Model(model, lambda rng: model.init(
      rng, jnp.ones(shape, jnp.int32), jnp.full(shape[:-1], max_length(config), jnp.int32)
  )["params"], {"task": config.data.task})


def inference(config, model, extras) -> Inference:
  """The class logits [B, C] of inputs [B, (2,) max_length] (token ids) and their lengths."""
  del extras
  task, length = TASKS[config.data.task], max_length(config)
  shape = _input_shape(config, 1)

  def function(params, tokens, lengths):
    return {"logits": model.apply({"params": params}, tokens, lengths)}

  pair = " for each of the two documents" if task.pairs else ""
  return Inference(
      function,
      {"tokens": (jax.ShapeDtypeStruct(shape, jnp.int32), f"{task.tokens}{pair}"),
       "lengths": (jax.ShapeDtypeStruct(shape[:-1], jnp.int32),
                   f"the number of tokens{pair}, 1 … {length}")},
      {"logits": f"the logits of the {task.num_classes} classes"},
      {"task": config.data.task,
       **({"padding_id": 0} if config.data.task in BYTE_TASKS else {})})   # pixels: no padding


def build(config, data: Data | None = None) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py.
  Loss, metrics and report are research/experiments/classification.py's (val during
  training, test in the final report; Text has no val split and evaluates on test
  throughout, as LRA does)."""
  data = load_data(config) if data is None else data
  model, init, _ = build_model(config)
  return classification_workload(config, model, init, data.splits, data.boundaries)


def build_shapes(config) -> Workload:
  """build's workload over placeholder data of the config's shapes (`--compile_only`)."""
  return build(config, placeholder_data(config))


register("lra", validate=validate, build=build, build_shapes=build_shapes,
         generates_data=generates_data, build_model=build_model, inference=inference)
