"""The keys every experiment config shares; experiments add `experiment`, `model` and `data`."""

import ml_collections

from research.errors import ConfigError


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
