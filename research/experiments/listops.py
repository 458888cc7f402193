"""The listops experiment: Long Range Arena's ListOps with every attention variant.

`EncoderClassifier(**config.model, <vocabulary size, 10 classes, max_length>)` reads LRA's
tokens of the trees in LRA's three TSV files (research/data/listops.py), the user's own or
generated once with LRA's recipe, and gives each tree's value; the length buckets, loss,
metrics and test report are research/experiments/classification.py's.
"""

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.data import listops
from research.errors import ConfigError, InputError
from research.experiments.classification import bucket_boundaries, classification_workload
from research.experiments.stack_config import (
  check_stack_keys,
  check_stack_sizes,
  parameter_count,
  parameter_keys,
)
from research.files import locked
from research.models.block_stack import POSITIONS
from research.models.encoder_classifier import POOLINGS, EncoderClassifier
from research.models.kinds import BLOCK_KINDS
from research.models.transformer_block import NORMS
from research.training.config import (
  check_choice,
  check_host_memory,
  check_parameter_memory,
  check_positive,
  check_writable,
)
from research.training.experiment import Inference, Model, Workload, register

SPLITS = ("train", "val", "test")
# LRA's recipe draws trees longer than 5000 tokens less than once in 10 000 draws (the
# longest of 300 000 draws with seed 0: 5883): shorter minimums only.
MAX_MIN_TREE_LENGTH = 5000
# Test accuracy (%) in LRA's Table 1 (Tay et al., ICLR 2021) for our attention variants, for
# comparison tables; a run's metrics hold only what it measured.
LRA_TABLE_1 = {"full": 36.37, "local": 15.82, "sparse": 17.07, "longformer": 35.63,
               "linformer": 35.70, "reformer": 37.27, "sinkhorn": 33.67, "synthesizer": 36.99,
               "bigbird": 36.05, "linear": 16.13, "performer": 18.01}


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / config.model value, naming the key."""
  d = config.data
  for key, allowed in (("kind", BLOCK_KINDS), ("positions", POSITIONS), ("norm", NORMS),
                       ("pooling", POOLINGS)):
    check_choice(config, f"model.{key}", allowed)
  check_stack_keys(config, causal=False)
  check_positive(config, "data.max_length", "data.length_buckets", "data.train_examples",
                 "data.eval_examples", "data.test_examples")
  check_positive(config, "data.min_tree_length", allow_zero=True)
  if d.length_buckets > d.max_length:
    raise ConfigError(f"config.data.length_buckets={d.length_buckets} must be at most "
                      f"config.data.max_length={d.max_length} (a bucket per length at most)")
  if not d.min_tree_length < d.max_tree_length - 1:
    raise ConfigError(f"config.data.min_tree_length={d.min_tree_length} and max_tree_length="
                      f"{d.max_tree_length} leave no length strictly between them")
  if d.min_tree_length >= MAX_MIN_TREE_LENGTH:
    raise ConfigError(f"config.data.min_tree_length={d.min_tree_length} must be below "
                      f"{MAX_MIN_TREE_LENGTH}: LRA's recipe draws a longer tree less than once "
                      "in 10 000 trees, so generating the splits would not end")
  cls = config.model.pooling == "cls"      # the CLS token before the tokens
  check_stack_sizes(config, d.max_length + cls, f"config.data.max_length={d.max_length}"
                    + (" and the CLS token" if cls else ""))
  if d.files and not os.path.isdir(d.files):
    raise ConfigError(f"config.data.files={d.files!r} is not a directory; give one holding "
                      "train.tsv, val.tsv, test.tsv (or LRA's basic_*.tsv), or '' to generate")
  if d.files:
    size = sum(map(os.path.getsize, _split_paths(d.files).values()))
    check_host_memory(config, ("data.files",), 2 * size, f"reading its {size} bytes of TSV")
  else:
    check_token_memory(config, d.train_examples + d.eval_examples + d.test_examples,
                       ("data.train_examples", "data.eval_examples", "data.test_examples"),
                       "to generate")
    if generates_data(config):
      check_writable(config, "data.dir", "the generated ListOps splits, or your own with "
                     "config.data.files")
  check_parameter_memory(config, parameter_keys(config, "data.max_length"),
                         parameter_count(config, d.max_length))


def check_token_memory(config, examples: int, keys: tuple[str, ...], where: str) -> None:
  """The token arrays of `examples` examples (twice: the evaluation batches copy them) and
  of a batch (a placeholder, or a padded last one) must fit the host's memory."""
  rows = 2 * examples + config.train.batch_size
  check_host_memory(config, ("data.max_length", "train.batch_size", *keys),
                    rows * config.data.max_length * 4,
                    f"the int32 tokens of the {examples} examples {where} and of a batch")


def _split_paths(directory: str) -> dict[str, str]:
  """split -> its file in `directory` (ours: train.tsv, LRA's: basic_train.tsv)."""
  paths = {}
  for split in SPLITS:
    names = (f"{split}.tsv", f"basic_{split}.tsv")
    found = [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]
    if not found:
      raise ConfigError(f"config.data.files={directory!r} has no {names[0]} (or {names[1]})")
    paths[split] = found[0]
  return paths


def generated_directory(config) -> str:
  """Where config.data's generated splits live: <dir>/listops for LRA's own recipe."""
  d = config.data
  recipe = ((d.min_tree_length, d.max_tree_length), tuple(
      (name, size) for name, size in zip(SPLITS, (d.train_examples, d.eval_examples,
                                                  d.test_examples), strict=True)), d.seed)
  if recipe == (listops.LRA_LENGTHS, listops.LRA_SPLITS, 0):
    return os.path.join(d.dir, "listops")
  return os.path.join(d.dir, f"listops-len{d.min_tree_length}-{d.max_tree_length}-n"
                      f"{d.train_examples}-{d.eval_examples}-{d.test_examples}-seed{d.seed}")


def _generated_paths(config) -> dict[str, str]:
  directory = generated_directory(config)
  return {split: os.path.join(directory, f"{split}.tsv") for split in SPLITS}


def generates_data(config) -> bool:
  """Whether building config's task generates its splits (minutes): no user files, and
  the generated ones not written yet."""
  return not config.data.files and not all(map(os.path.isfile,
                                                _generated_paths(config).values()))


def split_files(config) -> dict[str, str]:
  """split -> TSV path: the user's files, or the generated ones (written on first use).

  The user's own (config.data.files: a directory holding train.tsv / val.tsv / test.tsv, or
  LRA's basic_train.tsv / basic_val.tsv / basic_test.tsv), or generated once with LRA's recipe
  into `<dir>/listops/` (the LRA recipe with seed 0) or `<dir>/listops-<recipe>/` (other tree
  lengths, sizes or seeds) and read back from there on every later run.

  Each generated file is written whole (research.files.atomic_write) and the same for one
  directory (its name holds the recipe), so a run reads a split set only once all three are
  there, never part of one. They are written under the directory's lock (<directory>.lock,
  research.files.locked): a second run that finds them missing waits for the first's write,
  saying so on stderr, and then finds them all, instead of writing them again beside it."""
  if config.data.files:
    return _split_paths(config.data.files)
  paths = _generated_paths(config)
  if generates_data(config):
    d, directory = config.data, generated_directory(config)
    sizes = (d.train_examples, d.eval_examples, d.test_examples)
    try:
      os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
      with locked(f"{directory}.lock", f"another process generating {directory}"):
        if generates_data(config):                   # not written while this one waited
          listops.write_splits(directory, d.seed, tuple(zip(SPLITS, sizes, strict=True)),
                               (d.min_tree_length, d.max_tree_length))
    except OSError as error:
      raise ConfigError(f"config.data.dir={d.dir!r}: cannot write the generated splits to "
                        f"{error.filename or generated_directory(config)} ("
                        f"{error.strerror or error}); give a directory you can write to"
                        ) from None
  return paths


class Data(NamedTuple):
  splits: dict[str, dict[str, np.ndarray]]   # split -> {"tokens" [N, max_length], "lengths", "labels"}
  boundaries: tuple[int, ...]                # ascending bucket bounds, the last max_length


def token_ids(brackets: bool) -> dict[str, int]:
  """ListOps' tokens as LRA's pipeline makes them (listops.tokenize: operator names and
  digits; `brackets` keeps "[MAX" and "]") -> ids 1 … (0 pads)."""
  return {token: i + 1 for i, token in enumerate(listops.vocabulary(brackets))}


def encode(pairs: list[tuple[str, int]], path: str, brackets: bool, max_length: int
           ) -> dict[str, np.ndarray]:
  """A split's (source, label) pairs, read from `path` -> int32 tokens [N, max_length]
  (0-padded, truncated), lengths, labels.

  InputError naming path:line for a source without a token or with a token outside
  ListOps' vocabulary (anywhere in it, kept or truncated)."""
  ids = token_ids(brackets)
  tokens = np.zeros((len(pairs), max_length), np.int32)
  lengths = np.zeros(len(pairs), np.int32)
  for row, (source, _) in enumerate(pairs):
    words = listops.tokenize(source, brackets)
    unknown = [w for w in words if w not in ids]
    if unknown or not words:
      found = f"token {unknown[0]!r} is not ListOps'" if unknown else "no ListOps token"
      raise InputError(f"{path}:{row + 2}: {found} in the source (allowed: {' '.join(ids)})")
    words = words[:max_length]
    tokens[row, :len(words)] = [ids[w] for w in words]
    lengths[row] = len(words)
  return {"tokens": tokens, "lengths": lengths,
          "labels": np.array([label for _, label in pairs], np.int32)}


def load_data(config) -> Data:
  """The three splits, encoded, and their length buckets.

  Batches are bucketed by length: the training lengths' quantiles, rounded up to a multiple
  of 64 (and `max_length` last), cut the examples into `length_buckets` groups; a batch holds
  one group's examples padded to that group's bound, so short inputs cost a short batch (one
  compiled step per bucket).
  """
  d = config.data
  paths = split_files(config)
  try:
    pairs = {split: listops.read_split(path) for split, path in paths.items()}
    if d.files:
      check_token_memory(config, sum(map(len, pairs.values())), ("data.files",), "in its files")
    splits = {split: encode(pairs[split], path, d.brackets, d.max_length)
              for split, path in paths.items()}
  except InputError as error:
    if d.files:
      raise
    raise InputError(f"{error} (a generated split, changed since: delete "
                     f"{generated_directory(config)} to generate it again)") from None
  boundaries = bucket_boundaries(splits["train"]["lengths"], d.length_buckets, d.max_length)
  return Data(splits, boundaries)


def placeholder_data(config) -> Data:
  """One batch of full-length examples per split, with no file read or generated: the
  largest batch training meets (`build_shapes`, for compiling)."""
  d, rows = config.data, config.train.batch_size
  split = {"tokens": np.ones((rows, d.max_length), np.int32),
           "lengths": np.full(rows, d.max_length, np.int32), "labels": np.zeros(rows, np.int32)}
  return Data(dict.fromkeys(SPLITS, split), (d.max_length,))


def build_model(config, read=None) -> Model:
  """config.model's EncoderClassifier over ListOps' fixed vocabulary, initialised on one
  input of config.data.max_length tokens; extras {"token_ids": token_ids(brackets)}."""
  del read     # the run writes no file
  ids, max_length = token_ids(config.data.brackets), config.data.max_length
  model = EncoderClassifier(**config.model, vocab_size=len(ids) + 1,
                            num_classes=listops.NUM_CLASSES, max_length=max_length)
  return Model(model, lambda rng: model.init(rng, jnp.ones((1, max_length), jnp.int32),
                                             jnp.full((1,), max_length, jnp.int32))["params"],
               {"token_ids": ids})


def inference(config, model, extras) -> Inference:
  """The class logits [B, 10] of expressions [B, config.data.max_length] (token ids, 0-padded)
  and their lengths [B]; `about` has the token ids."""
  max_length, brackets = config.data.max_length, config.data.brackets

  def function(params, tokens, lengths):
    return {"logits": model.apply({"params": params}, tokens, lengths)}

  tokens = ("operator names and digits (LRA's pipeline: brackets and parentheses dropped)"
            if not brackets else "operators as '[MAX', digits and ']' (parentheses dropped)")
  return Inference(
      function,
      {"tokens": (jax.ShapeDtypeStruct((1, max_length), jnp.int32),
                  f"each expression's tokens, {tokens}, as token_ids, padded with 0 to "
                  f"{max_length} (a longer expression cut there, as in training)"),
       "lengths": (jax.ShapeDtypeStruct((1,), jnp.int32),
                   f"the number of tokens of each expression, 1 … {max_length}")},
      {"logits": "the logits of the expression's value, 0 … 9"},
      {"token_ids": extras["token_ids"], "padding_id": 0, "brackets": brackets,
       "classes": list(listops.CLASS_NAMES)})


def build(config, data: Data | None = None) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py."""
  data = load_data(config) if data is None else data
  model, init, _ = build_model(config)
  return classification_workload(config, model, init, data.splits, data.boundaries)


def build_shapes(config) -> Workload:
  """build's workload over placeholder data of the config's shapes (`--compile_only`)."""
  return build(config, placeholder_data(config))


register("listops", validate=validate, build=build, build_shapes=build_shapes,
         generates_data=generates_data, build_model=build_model, inference=inference)
