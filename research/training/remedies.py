"""What would make a train step fit: the remedies a refusal names, each compiled.

When the train step needs more memory than one device has, the refusal (compile.py's
`compile_checked`) does not leave the user to guess: it compiles the step again with each
remedy the config admits and names the memory each would need, e.g.

  error: the train step needs 16.09 GiB per device (…) but t4 (Tesla T4) has 14.74 GiB;
  compiled with each remedy: --config.train.grad_accum_steps=2: 9.12 GiB (fits),
  --config.model.remat=block: 7.40 GiB (fits), --config.model.dtype=bfloat16: 10.31 GiB
  (fits); or reduce config.train.batch_size (now 32), …

The remedies, in the order tried (each a group whose alternatives are tried in turn until
one fits):

  accumulation   train.grad_accum_steps × 2, × 4, × 8, × 16 (while it divides each
                 device's rows): the same update from smaller microbatches
  remat          model.remat=block, where the model has blocks and recomputes none
  dtype          model.dtype=bfloat16, where the model computes in float32

Each costs one compile (the step is built again from shapes, its data not read).
"""

from collections.abc import Callable

from research.training.validation import apply_overrides

ACCUMULATION_FACTORS = (2, 4, 8, 16)
TRAIN_KEYS = ("train.",)          # overrides that leave the model (and its workload) as it is

Remedy = tuple[str, Callable[[], object]]     # (the flag, compile() -> XLA executable)


def candidates(config, devices: int) -> list[list[tuple[str, dict]]]:
  """The remedies `config` admits on `devices` devices, as groups of (flag, overrides)."""
  rows, steps = config.train.batch_size // devices, config.train.grad_accum_steps
  accumulation = [(f"--config.train.grad_accum_steps={steps * factor}",
                   {"train.grad_accum_steps": steps * factor})
                  for factor in ACCUMULATION_FACTORS if rows % (steps * factor) == 0]
  groups = [accumulation] if accumulation else []
  if config.model.get("remat") == "none":
    groups.append([("--config.model.remat=block", {"model.remat": "block"})])
  if config.model.get("dtype") == "float32":
    groups.append([("--config.model.dtype=bfloat16", {"model.dtype": "bfloat16"})])
  return groups


def remedies(config, devices: int, workload, build_workload: Callable,
             compile_train: Callable) -> list[list[Remedy]]:
  """The candidates as compile thunks: compile_train(config, workload) compiles the train
  step of a config variant; a variant that changes the model gets its own workload,
  build_workload(variant) (its shapes, or its data where the experiment has no shapes)."""

  def thunk(overrides: dict) -> Callable[[], object]:
    def compile_variant():
      variant = apply_overrides(config, overrides)
      same_model = all(key.startswith(TRAIN_KEYS) for key in overrides)
      return compile_train(variant, workload if same_model else build_workload(variant))
    return compile_variant

  return [[(flag, thunk(overrides)) for flag, overrides in group]
          for group in candidates(config, devices)]
