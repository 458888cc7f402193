"""Every experiment compiled for accelerators this machine does not have (docs/accelerators.md
quotes the table).

    python3 project.py bench compile_targets      # the table of results/compile_targets.md
    python benchmarks/compile_targets.py --targets t4 --experiments nmt_dates --attention_targets ''

For each experiment's default config (and the listops `lra` preset in bfloat16, char_lm's
transformer, each lra task's `lra` preset and Path-X in bfloat16), `research.training.compile_only` compiles the train and eval steps for each
target deviceless, then the `lra` preset in bfloat16 with each other attention for each of
`--attention_targets` (Colab's v5e by default; '' for none: about a minute each on 2 cores),
and this prints one markdown row per (experiment, target): whether the
train step fits one device, its per-device bytes against the device's, the attention
implementation each platform runs, the custom-call kernels, collectives, and the seconds the
compile took on this machine. Nothing is timed against a peer: compile seconds vary with
the machine's load. A step that does not fit its target is a row ("no", and what it needs);
a target whose toolchain is missing here (the `aot` extra) refuses the run before it starts.
"""

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cli  # noqa: E402

from research import jax_start  # noqa: E402

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  jax_start.cpu_unless_accelerators()
  from research import experiments
  from research.aot import targets
  from research.errors import ConfigError
  from research.models.self_attention import SELF_ATTENTIONS
  from research.training.compile_only import compile_only
  from research.training.config import gib, load_config

LRA_BF16 = {"model.dtype": "bfloat16"}
EXPERIMENTS = {
    "nmt_dates": ("experiments/nmt_dates.py", {}),
    "sequence_tasks": ("experiments/sequence_tasks.py", {}),
    "listops (lra f32)": ("experiments/listops.py", {}),
    "listops (lra bf16)": ("experiments/listops.py", LRA_BF16),
    "char_lm (gru)": ("experiments/char_lm.py", {}),
    "char_lm (transformer)": ("experiments/char_lm.py:model=transformer", {}),
    "kernel_regression": ("experiments/kernel_regression.py", {}),
    **{f"lra {task} (lra bf16)": (f"experiments/lra.py:task={task}", LRA_BF16)
       for task in ("text", "retrieval", "image", "pathfinder")},
    "lra path_x (bf16)": ("experiments/lra.py:task=pathfinder,preset=path_x", LRA_BF16),
    "listops (s5)": ("experiments/listops.py:preset=s5", {}),
    "listops (lru)": ("experiments/listops.py:preset=lru", {}),
    "mqar (zoology)": ("experiments/mqar.py", {}),
}
ATTENTION_ROWS = {f"listops (lra bf16) {attention}":
                  ("experiments/listops.py", {**LRA_BF16, "model.attention": attention})
                  for attention in SELF_ATTENTIONS if attention != "full"}
SHORT = {"tpu_custom_call": "Mosaic", "__gpu$xla.gpu.triton": "Triton",
         "__cudnn$fmhaSoftmax": "cuDNN fmha", "__cublas$gemm": "cuBLAS",
         "__cublas$lt$matmul": "cuBLASLt"}


def row(name: str, target: str, workdir: str) -> str:
  spec, overrides = {**EXPERIMENTS, **ATTENTION_ROWS}[name]
  config, _ = load_config(os.path.join(ROOT, spec))
  for key, value in overrides.items():
    parent, _, leaf = key.rpartition(".")
    config[parent][leaf] = value
  devices = len(targets.devices_of(targets.get(target)))   # the batch splits over them
  config.train.batch_size -= config.train.batch_size % devices
  start = time.perf_counter()
  try:
    report = compile_only(config, workdir, experiments.get(config.experiment), target)
  except ConfigError as error:
    return f"| {name} | {target} | no | {error} | | | | {time.perf_counter() - start:.0f} |"
  train = report["steps"]["train"]
  kernels = sorted({SHORT.get(k, None) for k in train["kernels"]} - {None})
  return (f"| {name} | {target} | {'yes' if train['fits'] else 'no'} | "
          f"{gib(train['bytes']['total'])} of {gib(train['chip_memory_bytes'])} | "
          f"{', '.join(report['attention']) or '-'} | {', '.join(kernels) or '-'} | "
          f"{', '.join(train['collectives']) or '-'} | {report['seconds']:.0f} |")


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  """The arguments, each target's toolchain checked too: a table of targets this machine
  cannot compile for would be a table of refusals."""
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--targets", type=cli.names_of(targets.TARGETS),
                      default="tpu-v5e-1,tpu-v4-8,h100,t4")
  parser.add_argument("--experiments", type=cli.names_of(EXPERIMENTS),
                      default=",".join(EXPERIMENTS))
  parser.add_argument("--attention_targets",
                      type=cli.names_of(targets.TARGETS, allow_empty=True),
                      default="tpu-v5e-1",
                      help="targets of the lra preset with each other attention ('': none)")
  return cli.parse(parser, argv, check_toolchains)


def check_toolchains(parser: cli.Parser, args: argparse.Namespace) -> None:
  """Refuses targets this machine cannot compile for (the `aot` extra missing)."""
  for name in dict.fromkeys([*args.targets, *args.attention_targets]):
    try:
      targets.devices_of(targets.get(name))
    except targets.TargetUnavailable as error:
      parser.error(f"argument --targets: {error}")


def main():
  args = parse_arguments()
  print("| experiment | target | fits | train step per device | attention | kernels | "
        "collectives | compile s |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as workdir:
    cases = [(name, target) for name in args.experiments for target in args.targets]
    cases += [(name, target) for name in ATTENTION_ROWS for target in args.attention_targets]
    for name, target in cases:
      print(row(name, target, workdir), flush=True)


if __name__ == "__main__":
  cli.run(main)
