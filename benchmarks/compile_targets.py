"""Every experiment compiled for accelerators this machine does not have: the README's table.

    python3 project.py bench compile_targets [--targets tpu-v5e-1,tpu-v4-8,h100,t4]
        [--attention_targets tpu-v5e-1]

For each experiment's default config (and the listops `lra` preset in bfloat16, char_lm's
transformer), `research.training.compile_only` compiles the train and eval steps for each
target deviceless, then the `lra` preset in bfloat16 with each other attention for each of
`--attention_targets` (Colab's v5e by default; '' for none: about a minute each on 2 cores),
and this prints one markdown row per (experiment, target): whether the
train step fits one device, its per-device bytes against the device's, the attention
implementation each platform runs, the custom-call kernels, collectives, and the seconds the
compile took on this machine. Nothing is timed against a peer: compile seconds vary with
the machine's load.
"""

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from research import jax_start  # noqa: E402

jax_start.cpu_unless_accelerators()

import launch  # noqa: E402
from research import experiments  # noqa: E402
from research.errors import ConfigError  # noqa: E402
from research.models.self_attention import ATTENTIONS  # noqa: E402
from research.training.compile import gib  # noqa: E402
from research.training.compile_only import compile_only  # noqa: E402

LRA_BF16 = {"model.dtype": "bfloat16"}
EXPERIMENTS = {
    "nmt_dates": ("experiments/nmt_dates.py", {}),
    "sequence_tasks": ("experiments/sequence_tasks.py", {}),
    "listops (lra f32)": ("experiments/listops.py", {}),
    "listops (lra bf16)": ("experiments/listops.py", LRA_BF16),
    "char_lm (gru)": ("experiments/char_lm.py", {}),
    "char_lm (transformer)": ("experiments/char_lm.py:model=transformer", {}),
    "kernel_regression": ("experiments/kernel_regression.py", {}),
}
ATTENTION_ROWS = {f"listops (lra bf16) {attention}":
                  ("experiments/listops.py", {**LRA_BF16, "model.attention": attention})
                  for attention in ATTENTIONS if attention != "full"}
SHORT = {"tpu_custom_call": "Mosaic", "__gpu$xla.gpu.triton": "Triton",
         "__cudnn$fmhaSoftmax": "cuDNN fmha", "__cublas$gemm": "cuBLAS",
         "__cublas$lt$matmul": "cuBLASLt"}


def row(name: str, target: str, workdir: str) -> str:
  spec, overrides = {**EXPERIMENTS, **ATTENTION_ROWS}[name]
  config, _ = launch.load_config(os.path.join(ROOT, spec))
  for key, value in overrides.items():
    parent, _, leaf = key.rpartition(".")
    config[parent][leaf] = value
  if config.train.batch_size % 8 and target.endswith("-8"):
    config.train.batch_size -= config.train.batch_size % 8
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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--targets", default="tpu-v5e-1,tpu-v4-8,h100,t4")
  parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
  parser.add_argument("--attention_targets", default="tpu-v5e-1",
                      help="targets of the lra preset with each other attention ('': none)")
  args = parser.parse_args()
  print("| experiment | target | fits | train step per device | attention | kernels | "
        "collectives | compile s |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as workdir:
    cases = [(name, target) for name in args.experiments.split(",")
             for target in args.targets.split(",")]
    cases += [(name, target) for name in ATTENTION_ROWS
              for target in filter(None, args.attention_targets.split(","))]
    for name, target in cases:
      print(row(name, target, workdir), flush=True)


if __name__ == "__main__":
  main()
