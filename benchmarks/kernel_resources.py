"""Our Triton kernels' resources on an NVIDIA GPU, compiled here without one.

    python benchmarks/kernel_resources.py                      # d = 128 bf16 causal, each tiling
    python benchmarks/kernel_resources.py --target=a100 --shape=1,4096,8,64 --tilings=compact

Compiles the gradient of `pallas_gpu` attention (forward, dQ, dK / dV and, for global tokens,
their slices' kernels) for `--target` with XLA's own GPU compiler (`research.aot`: the CUDA
plugin, ptxas), reads each kernel's launch (grid, threads, shared memory) from XLA's thunk
sequence and its registers and spills from ptxas on the PTX XLA wrote (`--xla_dump_to`), and
prints one row per kernel and tiling, and whether it uses Hopper's wgmma. No timing: what a
tiling costs in registers and shared memory, and whether it fits at all, before a GPU is lent
(`research/attention/kernels/gpu_tiles.py` quotes these figures for the d128 tiling).
"""

import glob
import os
import re
import subprocess
import tempfile

import cli

from research import jax_start

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  jax_start.cpu_unless_accelerators()
  import jax
  import jax.numpy as jnp

  from research.aot import targets
  from research.attention import registry
  from research.attention.kernels import pallas_gpu
  from research.attention.kernels.gpu_tiles import TILINGS
  from research.attention.masks import Visibility

ARCHITECTURES = {"h100": "sm_90a", "h100x8": "sm_90a", "a100": "sm_80", "l4": "sm_89"}


def ptxas() -> str:
  """The ptxas of the nvidia-cuda-nvcc wheel (the `aot` extra), or the one on PATH."""
  targets._put_ptxas_on_path()   # noqa: SLF001 - the same lookup the compiles use
  return "ptxas"


def kernels(tiling: str, shape, dtype, target: str, global_tokens: int | None) -> list[tuple]:
  """(kernel, grid, threads, shared KiB, registers, spill bytes stored / loaded, wgmma) of
  each Pallas kernel in the compiled gradient of causal attention at `shape`."""
  found = targets.get(target)
  device = targets.devices_of(found)[0]
  q = jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  window = 256 if global_tokens else None
  visibility = Visibility.make(True, window, None, tuple(range(global_tokens or 0)))
  attention = lambda q, k, v: pallas_gpu.pallas_gpu_attention(
      q, k, v, scale=shape[3] ** -0.5, bias=None, mask=None, visibility=visibility,
      block_size=None, return_weights=False, interpret=False, tiling=tiling)
  gradient = jax.jit(jax.grad(lambda q, k, v: attention(q, k, v).astype(jnp.float32).sum(),
                              (0, 1, 2)))
  rows = []
  with tempfile.TemporaryDirectory() as dump:
    with registry.compiling_for("gpu", targets.gpu_capability(found), found.description):
      lowered = gradient.trace(q, q, q).lower(lowering_platforms=("cuda",))
    lowered.compile({**targets.COMPILER_OPTIONS["cuda"], "xla_dump_to": dump})
    with open(glob.glob(os.path.join(dump, "*thunk_sequence.txt"))[0]) as f:
      launches = f.read()
    for path in glob.glob(os.path.join(dump, "*.ptx")):
      with open(path) as f:
        ptx = f.read()
      name = re.search(r"\.entry (\w+)\(", ptx)
      if not name or not name.group(1).startswith("pallas_gpu"):
        continue
      info = subprocess.run([ptxas(), f"-arch={ARCHITECTURES[target]}", "-v", path, "-o",
                             os.devnull], capture_output=True, text=True, check=True).stderr
      launch = re.search(rf"{name.group(1)} grid: \[([\d, ]+)\] threads: \[(\d+)[^\]]*\]\s+"
                         r"shared_memory: (\d+)", launches)
      spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info).groups()
      rows.append((name.group(1), launch.group(1), int(launch.group(2)),
                   int(launch.group(3)) // 1024,
                   int(re.search(r"Used (\d+) registers", info).group(1)), "/".join(spills),
                   "wgmma" in ptx))
  return sorted(rows)


def parse_arguments(argv: list[str] | None = None):
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", type=cli.name_of(ARCHITECTURES), default="h100")
  parser.add_argument("--shape", type=cli.positive_ints, default="1,4096,8,128",
                      help="B,L,H,d of q, k and v (default: %(default)s)")
  parser.add_argument("--dtype", type=cli.name_of(("bfloat16", "float16", "float32")),
                      default="bfloat16")
  parser.add_argument("--tilings", type=cli.names_of(TILINGS), default=",".join(TILINGS))
  parser.add_argument("--global_tokens", type=cli.positive_int, default=None,
                      help="that many global tokens and a window of 256 (default: none, "
                           "dense causal)")
  return cli.parse(parser, argv, check_shape)


def check_shape(parser: cli.Parser, args) -> None:
  if len(args.shape) != 4:
    parser.error(f"argument --shape: must be B,L,H,d, got {','.join(map(str, args.shape))}")


def main():
  args = parse_arguments()
  print(f"pallas_gpu's gradient compiled for {args.target} ({ARCHITECTURES[args.target]}), "
        f"{args.dtype} {tuple(args.shape)}, causal"
        + (f", window 256 + {args.global_tokens} global tokens" if args.global_tokens else "")
        + "\n\n| tiling | kernel | grid | threads | shared KiB | registers | spills stored / "
          "loaded (bytes) | wgmma |\n|---|---|---|---|---|---|---|---|")
  for tiling in args.tilings:
    for row in kernels(tiling, tuple(args.shape), jnp.dtype(args.dtype), args.target,
                       args.global_tokens):
      name, grid, threads, shared, registers, spills, wgmma = row
      print(f"| {tiling} | {name} | {grid} | {threads} | {shared} | {registers} | {spills} | "
            f"{'yes' if wgmma else 'no'} |", flush=True)


if __name__ == "__main__":
  cli.run(main)
