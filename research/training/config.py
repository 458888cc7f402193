"""The keys every experiment config shares; experiments add `experiment`, `model` and `data`.

`read_config_json(path)` is how a run's config.json is read back (research.training.run:
restore, --eval_only, --export), bounded in size and depth before anything walks it.
"""

import os
import stat

import ml_collections

from research import files
from research.errors import ConfigError, excerpt

MAX_BYTES = 2**20       # a run's config.json holds a few KiB
MAX_DEPTH = 16          # groups (and lists) within groups: a few levels in any experiment


def base_config() -> ml_collections.ConfigDict:
  """Shared defaults. Experiments override values, never derive them: a derived value would
  go stale when a later `--config.x=` override changes what it was derived from."""
  config = ml_collections.ConfigDict()
  config.experiment = ""              # the registered experiment: builds model, data and loss
  config.seed = 0                     # parameters, data order, dropout

  config.train = ml_collections.ConfigDict()
  config.train.num_steps = 1000
  config.train.batch_size = 64        # global, over all devices and hosts
  config.train.grad_accum_steps = 1   # k: each update from k microbatches of batch_size / k
  config.train.learning_rate = 1e-3   # AdamW's peak rate: linear warm-up, then the schedule
  config.train.warmup_steps = 0
  config.train.schedule = "cosine"    # after warm-up: "cosine" to 0, or "rsqrt" (Vaswani, LRA)
  config.train.adam_b2 = 0.999
  config.train.weight_decay = 0.0
  config.train.recurrence_learning_rate = 0.0   # > 0: the recurrences' own parameters and the
                                                # norms' at this peak rate, no weight decay
  config.train.grad_clip_norm = 1.0   # 0 disables clipping
  config.train.parallelism = "jit"    # "jit" (mesh + shardings) or "pmap"
  config.train.log_every = 50
  config.train.eval_every = 500
  config.train.checkpoint_every = 500
  config.train.keep_checkpoints = 3
  # "FIRST,LAST": a jax.profiler trace of those steps in <workdir>/profile (training/profiling.py)
  config.train.profile_steps = ""

  # Several processes (hosts) as one run; see research/training/distributed.py.
  config.distributed = ml_collections.ConfigDict()
  config.distributed.coordinator_address = ""   # HOST:PORT of process 0; "": cluster detection
  config.distributed.num_processes = 1
  config.distributed.process_id = 0

  # Weights & Biases beside TensorBoard (the `wandb` extra); see research/training/wandb_writer.py.
  config.wandb = ml_collections.ConfigDict()
  config.wandb.mode = "off"           # "off", "online", or "offline" (files kept for `wandb sync`)
  config.wandb.project = ""           # "": WANDB_PROJECT, else W&B's default project
  config.wandb.entity = ""            # "": WANDB_ENTITY, else your default entity
  config.wandb.name = ""              # "": the workdir's directory name
  return config


def parse_variants(arg: str | None, defaults: dict[str, str],
                   choices: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
  """The variant argument of get_config: 'a=x,b=y' -> defaults with a and b replaced.

  Names outside `defaults`, and values outside choices[name] where given, raise
  ConfigError naming what is allowed.
  """
  chosen = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    name, equals, value = item.partition("=")
    if not defaults:
      raise ConfigError(f"this config takes no variant arguments, got {arg!r}; give the "
                        "config file alone and change keys with --config.KEY=VALUE")
    if name not in defaults:
      raise ConfigError(f"unknown variant {name!r} in --config ...:{arg}; allowed: "
                        f"{', '.join(defaults)}")
    if not equals:
      raise ConfigError(f"variant {name!r} in --config ...:{arg} has no value; write "
                        f"{name}=VALUE")
    chosen[name] = value
  for name, allowed in (choices or {}).items():
    if chosen[name] not in allowed:
      raise ConfigError(f"variant {name}={chosen[name]!r} is not allowed; choose one of: "
                        f"{', '.join(allowed)}")
  return chosen


def read_config_json(path: str) -> dict:
  """The JSON object of a run's config.json at `path`, bounded before it is parsed or walked.

  Raises FileNotFoundError where there is none, files.UnreadableFile naming the file and the
  fault (cannot be read, not a regular file, empty, cut short or not JSON, not an object),
  ConfigError naming it for a file over MAX_BYTES or groups nested deeper than MAX_DEPTH
  (with the key where they do, when the parser could reach it): no run writes either.
  """
  try:
    status = os.stat(path)
  except FileNotFoundError:
    raise
  except OSError as error:
    raise files.UnreadableFile(f"{path} cannot be read ({error.strerror or error})") from None
  if not stat.S_ISREG(status.st_mode):       # a directory, a device (/dev/zero: endless)
    raise files.UnreadableFile(f"{path} is not a file")
  size = status.st_size
  if size > MAX_BYTES:
    raise ConfigError(f"{path} holds {size} bytes, more than a run's config ({MAX_BYTES} at "
                      "most): not a config.json a run wrote")
  try:
    value = files.read_json(path)
  except RecursionError:
    raise ConfigError(f"{path} nests its groups deeper than the JSON parser reads, more than "
                      f"{MAX_DEPTH} levels: not a config.json a run wrote") from None
  key = _too_deep(value)
  if key is not None:
    raise ConfigError(f"{path} nests its groups more than {MAX_DEPTH} levels deep, at "
                      f"{excerpt('config.' + key, 80)}: not a config.json a run wrote")
  return value


def _too_deep(node, key: str = "", level: int = 1) -> str | None:
  """The dotted key of the first group or list of `node` (a JSON value at `level`, the top
  object's being 1) deeper than MAX_DEPTH, or None; it descends MAX_DEPTH levels at most."""
  if isinstance(node, dict):
    children = ((f"{key}.{name}" if key else name, child) for name, child in node.items())
  elif isinstance(node, list):
    children = ((f"{key}[{i}]", child) for i, child in enumerate(node))
  else:
    return None
  for path, child in children:
    if isinstance(child, (dict, list)):
      found = path if level + 1 > MAX_DEPTH else _too_deep(child, path, level + 1)
      if found is not None:
        return found
  return None
