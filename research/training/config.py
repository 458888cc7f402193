"""The config: a config file's `get_config()`, the keys every experiment shares
(`base_config`), variants, overrides, and the checks every value passes before anything is
compiled (ConfigError naming the key and what is allowed)."""

import ast
import importlib.util
import inspect
import math
import os
import re
from collections.abc import Iterable
from typing import NamedTuple

import jax
import ml_collections

from research.errors import ConfigError
from research.training import parallel
from research.training.checkpoints import parse_warm_start
from research.training.metrics import WANDB_MODES, check_profile_steps, check_wandb_installed
from research.training.parallel import STRATEGIES
from research.training.train_step import SCHEDULES
from research.training.workdir import RENAMED_KEYS, renamed


def load_config(spec: str):
  """experiments/NAME.py[:ARGS] -> (get_config(ARGS), the config module); ConfigError for a
  missing file, one that does not parse or lacks get_config, or a get_config that fails."""
  path, _, args = spec.partition(":")
  if not os.path.isfile(path) or not path.endswith(".py"):
    what = "not a Python file (.py)" if os.path.isfile(path) else "no config file"
    raise ConfigError(f"--config: {what} {path!r}; give experiments/NAME.py[:ARGS]")
  module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as error:
    raise ConfigError(f"--config: {path} does not parse: {error.msg} at line {error.lineno}"
                      ) from error
  except Exception as error:  # noqa: BLE001 - any failure of the file is the config's
    raise ConfigError(f"--config: {path} fails to load: {type(error).__name__}: {error}"
                      ) from error
  if not hasattr(module, "get_config"):
    raise ConfigError(f"--config: {path} defines no get_config()")
  try:
    config = module.get_config(args) if args else module.get_config()
  except ConfigError:
    raise
  except Exception as error:  # noqa: BLE001
    raise ConfigError(f"--config: {path}: get_config({args or ''}) failed: "
                      f"{type(error).__name__}: {error}") from error
  check_base_keys(config, f"--config: {path}: get_config()")
  return config, module


def sweep_points(module, config) -> list:
  """The config module's get_sweep(), or get_sweep(config) where it takes one (a grid read
  from the config, overrides included); ConfigError if it has none or it fails."""
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"--sweep: {module.__file__} defines no get_sweep(); --sweep needs one")
  try:
    if inspect.signature(module.get_sweep).parameters:
      return module.get_sweep(config)
    return module.get_sweep()
  except Exception as error:  # noqa: BLE001 - any failure of the file is the config's
    raise ConfigError(f"--sweep: {module.__file__}: get_sweep() failed: "
                      f"{type(error).__name__}: {error}") from error


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
  # "FIRST,LAST": a jax.profiler trace of those steps in <workdir>/profile (metrics.Profiler)
  config.train.profile_steps = ""
  # A warm start (research/training/checkpoints.py): "WORKDIR" or "WORKDIR:STEP" (default: its
  # latest checkpoint that reads), the other run whose parameters this one starts from; ""
  # none. Those whose '/'-joined path init_params matches whole are taken, the rest fresh.
  config.train.init_from = ""
  config.train.init_params = ".*"

  # Several processes (hosts) as one run; see research/training/parallel.py.
  config.distributed = ml_collections.ConfigDict()
  config.distributed.coordinator_address = ""   # HOST:PORT of process 0; "": cluster detection
  config.distributed.num_processes = 1
  config.distributed.process_id = 0

  # Weights & Biases beside TensorBoard (the `wandb` extra); see metrics.WandbRun.
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


def get(config: ml_collections.ConfigDict, key: str):
  """config['a.b.c'] for a dotted key."""
  value = config
  for part in key.split("."):
    value = value[part]
  return value


def check_choice(config, key: str, allowed: Iterable) -> None:
  allowed = list(allowed)
  value = get(config, key)
  if value not in allowed:
    raise ConfigError(f"config.{key}={value!r} is not allowed; choose one of: "
                      f"{', '.join(map(repr, allowed))}")


INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
SEED, SEED_MAX = "seed", 2**63 - 1   # any key so named; jax.random.key takes an int64


def check_positive(config, *keys: str, allow_zero: bool = False) -> None:
  """Each key a finite number > 0 (>= 0 with allow_zero); an int at most INT32_MAX."""
  for key in keys:
    value = get(config, key)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    finite = number and (isinstance(value, int) or math.isfinite(value))
    if not finite or value < 0 or (value == 0 and not allow_zero):
      bound = ">= 0" if allow_zero else "> 0"
      kind = "finite number" if number and not finite else "number"
      raise ConfigError(f"config.{key}={value!r} must be a {kind} {bound}")
    if isinstance(value, int) and value > INT32_MAX:
      raise ConfigError(f"config.{key}={value!r} must be at most {INT32_MAX} (an int32)")


def check_int(config, *keys: str) -> None:
  for key in keys:
    if not isinstance(get(config, key), int) or isinstance(get(config, key), bool):
      raise ConfigError(f"config.{key}={get(config, key)!r} must be an int")


def check_rate(config, *keys: str) -> None:
  """Each key a rate in [0, 1) (a dropout probability)."""
  for key in keys:
    value = get(config, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
      raise ConfigError(f"config.{key}={value!r} must be in [0, 1)")


def check_range(config, key: str, low: float, high: float, why: str = "") -> None:
  """config.key a finite number in [low, high]; `why` says what the bounds keep."""
  value = get(config, key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
    raise ConfigError(f"config.{key}={value!r} must be a number in [{low:g}, {high:g}]"
                      + (f" ({why})" if why else ""))


def check_with(config, key: str, check) -> None:
  """`check(get(config, key))`, a function of the library that raises ValueError (or
  TypeError) for a value it refuses: ConfigError with its message, naming the key."""
  try:
    check(get(config, key))
  except (TypeError, ValueError) as error:
    raise ConfigError(f"config.{key}: {error}") from None


GIB = 2**30


def available_ram() -> int | None:
  """The memory this machine has available (Linux's MemAvailable), None when unknown."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      found = re.search(r"MemAvailable:\s+(\d+) kB", f.read())
    if found:
      return int(found.group(1)) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def host_memory_refusal(needed: int, sizes: str, what: str) -> str | None:
  """'`sizes` would need … of host memory for `what`, but this machine has … available; …'
  when `needed` bytes exceed the memory available here; None when they fit (or nothing
  tells)."""
  available = available_ram()
  if available is None or needed <= available:
    return None
  return (f"{sizes} would need {gib(needed)} of host memory for {what}, but this machine "
          f"has {gib(available)} available; make them smaller")


def gib(n: int) -> str:
  """Bytes in words: GiB, MiB below one GiB, KiB below one MiB."""
  if n >= GIB:
    return f"{n / GIB:.2f} GiB"
  return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def check_host_memory(config, keys: Iterable[str], needed: int, what: str) -> None:
  """ConfigError when `needed` bytes of host memory (for `what`, sized by the config keys)
  exceed the memory this machine has available; the message shows the keys' values."""
  values = ", ".join(f"config.{key}={get(config, key)!r}" for key in keys)
  if refusal := host_memory_refusal(needed, values, what):
    raise ConfigError(refusal)


def check_writable(config, key: str, what: str) -> None:
  """ConfigError unless the directory at `key` is, or can be made under, a directory this
  process can write; `what` says what it is for ("the generated ListOps splits, or …")."""
  directory = get(config, key)
  target = existing = os.path.abspath(directory or ".")
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    where = "a file" if existing == target else f"under the file {existing!r}"
    raise ConfigError(f"config.{key}={directory!r} is {where}; give a directory for {what}")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f"config.{key}={directory!r} cannot be written ({existing} is not "
                      f"writable); give a directory for {what}")


def check_parameter_memory(config, keys: Iterable[str], count: int) -> None:
  """The model's `count` parameters (an estimate from the config `keys`), with their
  gradients and Adam's two moments in float32, must fit the host's memory: a model too
  large for any device is refused before it is traced."""
  check_host_memory(config, keys, 16 * count,
                    f"about {count:,} parameters, their gradients and Adam's moments")


def check_divides(config, divisor_key: str, key: str) -> None:
  """get(key) must be a multiple of get(divisor_key)."""
  divisor, value = get(config, divisor_key), get(config, key)
  if value % divisor:
    raise ConfigError(f"config.{divisor_key}={divisor} must divide config.{key}={value}")


# config.model.dtype: the dtype of matrix products (float16 with dynamic loss scaling:
# research/training/train_step.py's dynamic_loss_scale)
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")



class Rule(NamedTuple):
  """What a config key's value must be, as one row of a table that `check_rules` reads."""
  type: type = float        # int: an int (not a bool); float: a number, int or float
  bound: str = ""           # "> 0", ">= 0" (a finite number, an int within int32) or "[0, 1)"
  choices: tuple = ()       # the values allowed (type and bound then unused)


def check_rules(config, rules: dict[str, Rule]) -> None:
  """Each key of `rules` that config holds (a run's config.json of an earlier version may
  lack one) checked by its Rule, in the table's order: ConfigError naming the key and what
  is allowed (check_choice's, check_positive's, check_rate's and check_int's messages)."""
  for key, rule in rules.items():
    group, _, name = key.rpartition(".")
    if name not in (get(config, group) if group else config):
      continue
    if rule.choices:
      check_choice(config, key, rule.choices)
      continue
    if rule.bound == "[0, 1)":
      check_rate(config, key)
    elif rule.bound:
      check_positive(config, key, allow_zero=rule.bound == ">= 0")
    if rule.type is int:
      check_int(config, key)


# The shared keys' rules (base_config's); config.train.profile_steps, init_from and
# init_params, config.distributed and the sizes that must divide each other are checked in
# code (check_shared_values).
SHARED_RULES = {
    **{f"train.{key}": Rule(int, "> 0") for key in (
        "num_steps", "batch_size", "grad_accum_steps", "log_every", "eval_every",
        "checkpoint_every", "keep_checkpoints")},
    "train.learning_rate": Rule(float, "> 0"),
    "train.warmup_steps": Rule(int, ">= 0"),
    "train.weight_decay": Rule(float, ">= 0"),
    "train.grad_clip_norm": Rule(float, ">= 0"),
    "train.recurrence_learning_rate": Rule(float, ">= 0"),
    "train.adam_b2": Rule(float, "[0, 1)"),
    "train.parallelism": Rule(choices=tuple(STRATEGIES)),
    "train.schedule": Rule(choices=SCHEDULES),
    "wandb.mode": Rule(choices=WANDB_MODES),
}


def check_shared(config) -> None:
  """The keys of research.training.config.base_config(), checked before any compilation:
  their values (`check_shared_values`), and the packages they ask for installed."""
  check_shared_values(config)
  check_wandb_installed(config)


def check_shared_values(config) -> None:
  """The values of base_config()'s keys, whatever this machine has installed: what a run's
  config read back from its workdir must pass too (research.training.run.read_config)."""
  check_rules(config, SHARED_RULES)
  check_divides(config, "train.log_every", "train.checkpoint_every")
  check_divides(config, "train.grad_accum_steps", "train.batch_size")
  check_profile_steps(config)
  parse_warm_start(config.train)
  parallel.check_distributed(config)
  check_numbers(config)


def check_numbers(config) -> None:
  """Every number of the config, in nested groups, lists and tuples too (say
  config.model.recurrence.lru.max_phase): a float finite, an int within int32; every key
  named seed, at any depth (config.seed, config.data.seed), an int in 0 … SEED_MAX."""
  for key, value in leaves_of(config):
    if key.rpartition(".")[2] == SEED:
      if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= SEED_MAX:
        raise ConfigError(f"config.{key}={value!r} must be in 0 … {SEED_MAX} (an int64)")
    elif isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f"config.{key}={value!r} must be a finite number (not inf or nan)")
    elif (isinstance(value, int) and not isinstance(value, bool)
          and not INT32_MIN <= value <= INT32_MAX):
      bound = f"at most {INT32_MAX}" if value > 0 else f"at least {INT32_MIN}"
      raise ConfigError(f"config.{key}={value!r} must be {bound} (an int32)")


def leaves_of(node, key: str = "", sequences: bool = True):
  """(dotted key, value) for every leaf under node, in lists and tuples too (key[i]); with
  sequences False a list or tuple is one leaf (a key the command line sets whole)."""
  if isinstance(node, (ml_collections.ConfigDict, dict)):
    for name, child in node.items():
      yield from leaves_of(child, f"{key}.{name}" if key else name, sequences)
  elif isinstance(node, (list, tuple)) and sequences:
    for index, child in enumerate(node):
      yield from leaves_of(child, f"{key}[{index}]")
  else:
    yield key, node


def check_base_keys(config, what: str) -> None:
  """`what` (a config) is an ml_collections.ConfigDict with every key of base_config()."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"{what} returned {config!r:.60} (a {type(config).__name__}), not an "
                      "ml_collections.ConfigDict; start it from research.training.base_config()")
  missing = [key for key, _ in leaves_of(base_config()) if not _has(config, key)]
  if missing:
    raise ConfigError(f"{what} has no {', '.join(f'config.{k}' for k in missing[:5])}"
                      f"{' …' if len(missing) > 5 else ''}; start it from "
                      "research.training.base_config()")


def _has(config, key: str) -> bool:
  node = config
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def check_devices(config, key: str = "train.batch_size") -> None:
  """The global batch must split evenly over every device (of every host), and pmap runs on
  one process (see parallel.PmapStrategy)."""
  batch_size, devices = get(config, key), jax.device_count()
  if batch_size % devices:
    raise ConfigError(f"config.{key}={batch_size} must be divisible by the number of devices "
                      f"({devices}); allowed values are multiples of {devices}")
  accumulated = config.train.grad_accum_steps
  if key == "train.batch_size" and batch_size % (devices * accumulated):
    raise ConfigError(f"config.train.batch_size={batch_size} must split into "
                      f"config.train.grad_accum_steps={accumulated} microbatches on each of the "
                      f"{devices} devices; allowed batch sizes are multiples of "
                      f"{devices * accumulated}")
  if config.train.parallelism == "pmap" and jax.process_count() > 1:
    raise ConfigError(f"config.train.parallelism='pmap' runs on one process, not "
                      f"{jax.process_count()}; use 'jit' (a mesh over every host's devices)")


def _children(config, prefix: str) -> list[str]:
  node = get(config, prefix) if prefix else config
  return sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []


def check_key(config, key: str) -> None:
  """key must name an existing leaf; the message lists the keys next to it, or names the
  new key of a renamed one (workdir.RENAMED_KEYS)."""
  parts = key.split(".")
  for depth in range(len(parts)):
    prefix = ".".join(parts[:depth])
    if parts[depth] not in _children(config, prefix):
      parent, _, leaf = RENAMED_KEYS.get(key, ("",))[0].rpartition(".")
      if leaf in _children(config, parent):      # this config has the key's new name
        raise ConfigError(f"config key {renamed(key)}: set that key instead")
      where = f"under config.{prefix}" if prefix else "at the top level"
      raise ConfigError(f"unknown config key config.{key}; keys {where}: "
                        f"{', '.join(_children(config, prefix))}")
  if isinstance(get(config, key), ml_collections.ConfigDict):
    raise ConfigError(f"config.{key} is a group, not a value; its keys: "
                      f"{', '.join(_children(config, key))}")


def parse_value(config, key: str, text: str):
  """Parses a command-line value to the type of config.key's default; a tuple or list from a
  Python literal, as ml_collections' config_flags reads one ("(64, 128)"; a lone value "64"
  is the tuple (64,), a bare word "mamba" ("mamba",))."""
  check_key(config, key)
  default = get(config, key)
  kind = type(default)
  try:
    if kind is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if kind in (int, float):
      return kind(text)
    if kind in (tuple, list):
      try:
        value = ast.literal_eval(text)
      except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = text                       # a bare word: one str, as config_flags reads it
      return kind(value if isinstance(value, (tuple, list)) else (value,))
  except ValueError:
    raise ConfigError(f"config.{key}={text!r} must be of type {kind.__name__} "
                      f"(like its default {default!r})") from None
  return text


def apply_overrides(config, overrides: dict) -> ml_collections.ConfigDict:
  """A copy of config with {dotted key: value} set; unknown keys and wrong types fail."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in overrides.items():
    value = parse_value(config, key, value) if isinstance(value, str) else value
    check_key(config, key)
    _check_type(key, get(config, key), value)
    parent, _, leaf = key.rpartition(".")
    (get(config, parent) if parent else config)[leaf] = value
  return config


def _check_type(key: str, default, value) -> None:
  if not _fits(default, value):
    raise ConfigError(f"config.{key}={value!r} must be of type {type(default).__name__}")


def _fits(default, value) -> bool:
  """Whether `value` may stand where `default` does, as config_flags allows: the same type
  (a bool not for an int, nor an int for a bool), an int for a float; anything for None."""
  if default is None:
    return True
  expected = float if isinstance(default, float) else type(default)
  ok = isinstance(value, expected) and isinstance(value, bool) == isinstance(default, bool)
  return ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))


def check_like(value: dict, reference, key: str = "") -> None:
  """Each key of `reference` (a ConfigDict: base_config()) that `value` (a config as JSON, a
  run's config.json) holds has its default's type, as a launched config's keys have: a group
  a JSON object, a float a number, an int an int, a str a str; ConfigError naming the first
  that has not (its value cut to 60 characters)."""
  for name, default in reference.items():
    if name not in value:
      continue
    dotted, given = f"{key}.{name}" if key else name, value[name]
    if isinstance(default, ml_collections.ConfigDict):
      if not isinstance(given, dict):
        raise ConfigError(f"config.{dotted}={_shown(given)} must be a group of "
                          f"keys ({', '.join(default)})")
      check_like(given, default, dotted)
    elif not _fits(default, given):
      raise ConfigError(f"config.{dotted}={_shown(given)} must be of type "
                        f"{type(default).__name__}")


def _shown(value, limit: int = 60) -> str:
  """repr(value), its two ends where it is longer than `limit` characters."""
  text = repr(value)
  if len(text) <= limit:
    return text
  return f"{text[:limit // 2]}…{text[-limit // 2:]} ({len(text)} characters)"
