"""Causal self-attention forward + backward: our implementations against jax.nn and torch.

    python3 project.py bench attention          # every length (several minutes on 2 cores)
    python benchmarks/attention.py --lengths 2048 --repeats 5

On a GPU it prints the bf16 table of `attention_gpu.py` (our kernels, cuDNN, torch SDPA,
tokamax; `--gpu_shapes`, `--patterns`, `--candidates`, `--variants` choose its rows, and
`--rehearse` runs that table's code on a CPU at tiny shapes); elsewhere the float32 CPU
table below.

For q, k, v of shape [B, L, H=8, d=64] and a random output cotangent, times the
gradient with respect to q, k and v of causal attention computed by

  ours auto / dense / chunked / banded (w=256)   research.attention.dot_product_attention
  ours auto w=256 / chunked w=256               the same with the window
  jax.nn                                 jax.nn.dot_product_attention (XLA)
  torch                                  torch.nn.functional.scaled_dot_product_attention

interleaved round-robin in one process (medians; torch with as many threads as cores),
and reports peak memory: for the JAX functions the buffers XLA plans for the compiled
forward + backward (arguments + outputs + temporaries), for torch the growth of the
peak resident set over one step in a fresh process (inputs excluded for torch). Configurations whose dense
[L, L] weights would not fit in memory are skipped. Ratios are ours / torch.
"""

import argparse
import os
import subprocess
import sys

import cli

from research import jax_start

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  import attention_gpu
  import jax
  import jax.numpy as jnp
  import numpy as np
  from timing import median_ms

  from research.attention import dot_product_attention

HEADS, HEAD_DIM, WINDOW = 8, 64, 256
DENSE_LIMIT_BYTES = 6 * 2**30       # skip dense / jax.nn when B·H·L² float32 weights exceed this
STEP_ARRAYS = 8                     # q, k, v, the cotangent, the output, the three gradients


def batch_of(length: int) -> int:
  """B at length L: 4, or 1 beyond 8192."""
  return 1 if length > 8192 else 4


def dense_bytes(batch: int, length: int) -> int:
  """The [B, H, L, L] float32 weights of dense attention."""
  return 4 * batch * HEADS * length * length


def host_bytes(batch: int, length: int, dense: bool = True) -> int:
  """A low estimate of the host memory of one length's forward + backward: its STEP_ARRAYS
  [B, L, H, d] float32 arrays and, where the dense candidates run (`dense` and the weights
  within DENSE_LIMIT_BYTES), the weights and their gradient."""
  weights = dense_bytes(batch, length)
  return (STEP_ARRAYS * 4 * batch * length * HEADS * HEAD_DIM
          + (2 * weights if dense and weights <= DENSE_LIMIT_BYTES else 0))


def jax_candidates(batch: int, length: int) -> dict:
  attention = {
      "ours auto": lambda q, k, v: dot_product_attention(q, k, v, is_causal=True),
      "ours auto w=256": lambda q, k, v: dot_product_attention(q, k, v, is_causal=True,
                                                               window=WINDOW),
      "ours chunked": lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, implementation="chunked"),
      "ours banded w=256": lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, window=WINDOW,
                                                                 implementation="banded"),
      "ours chunked w=256": lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, window=WINDOW,
                                                                  implementation="chunked"),
  }
  if dense_bytes(batch, length) <= DENSE_LIMIT_BYTES:
    attention["ours dense"] = lambda q, k, v: dot_product_attention(q, k, v, is_causal=True,
                                                                    implementation="dense")
    attention["jax.nn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)
  return attention


def jax_step(attention, q, k, v, cotangent):
  """(fn() running one forward + backward, planned peak bytes)."""
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.vdot(attention(q, k, v), cotangent), (0, 1, 2)))
  memory = grad.lower(q, k, v).compile().memory_analysis()
  peak = memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
  return (lambda: jax.block_until_ready(grad(q, k, v))), peak


def torch_step(q, k, v, cotangent):
  import torch  # pylint: disable=import-outside-toplevel
  tq, tk, tv = (torch.from_numpy(np.asarray(x)).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
  tg = torch.from_numpy(np.asarray(cotangent)).transpose(1, 2).contiguous()

  def run():
    for t in (tq, tk, tv):
      t.grad = None
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

  return run


def inputs(batch: int, length: int):
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.standard_normal((batch, length, HEADS, HEAD_DIM), dtype=np.float32))
          for _ in range(4)]


# Runs in a fresh interpreter with numpy and torch only, so nothing else's peak hides torch's.
_TORCH_PEAK = """
import os, resource, sys, numpy as np, torch
torch.set_num_threads(os.cpu_count())
b, L, H, d = (int(a) for a in sys.argv[1:])
q, k, v, g = (torch.from_numpy(np.random.default_rng(0).standard_normal((b, H, L, d), dtype=np.float32))
              for _ in range(4))
for t in (q, k, v):
  t.requires_grad_()
small = torch.ones(1, 1, 8, 8, requires_grad=True)  # torch's one-time set-up is not attention's
torch.nn.functional.scaled_dot_product_attention(small, small, small, is_causal=True).sum().backward()
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss)
"""


def torch_peak_bytes(batch: int, length: int) -> int:
  """Growth of the peak resident set over one torch forward + backward (fresh process)."""
  out = subprocess.run([sys.executable, "-c", _TORCH_PEAK, str(batch), str(length), str(HEADS),
                        str(HEAD_DIM)], capture_output=True, text=True, check=True)
  return int(out.stdout.split()[-1])


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=cli.positive_ints, default="512,2048,8192,16384",
                      help="comma list of L (CPU)")
  parser.add_argument("--repeats", type=cli.positive_int, default=3)
  parser.add_argument("--pause", type=cli.non_negative_float, default=0.2,
                      help="seconds idle before each call")
  parser.add_argument("--inner", type=cli.positive_int, default=10,
                      help="steps per timed call (GPU)")
  parser.add_argument("--gpu_shapes", type=cli.names_of(map(str, attention_gpu.SHAPES)),
                      default=",".join(map(str, attention_gpu.SHAPES)),
                      help="GPU table: comma list of L, each its shape (default: %(default)s)")
  parser.add_argument("--patterns", type=cli.names_of(attention_gpu.PATTERN_NAMES),
                      default=",".join(attention_gpu.PATTERN_NAMES),
                      help="GPU table: comma list of patterns (default: %(default)s)")
  parser.add_argument("--candidates", type=cli.names_of(attention_gpu.CANDIDATES),
                      default=",".join(attention_gpu.CANDIDATES),
                      help="GPU table: comma list of what is timed (default: %(default)s)")
  parser.add_argument("--variants", type=cli.names_of(attention_gpu.VARIANTS, allow_empty=True,
                                                      every="all"), default="",
                      help="GPU table: our Triton kernel's other settings timed beside it, "
                           "or all (default: none)")
  parser.add_argument("--rehearse", action="store_true",
                      help="run the GPU table's code here at tiny shapes (no measurement)")
  return cli.parse(parser, argv, check_memory)


def check_memory(parser: cli.Parser, args: argparse.Namespace) -> None:
  """Refuses --lengths whose largest step would not fit the host's memory."""
  length = max(args.lengths, key=lambda n: host_bytes(batch_of(n), n))
  cli.check_memory(parser, host_bytes(batch_of(length), length),
                   f"--lengths up to {length} (batch {batch_of(length)})",
                   "q, k, v, their gradients and the attention weights")


def main():
  args = parse_arguments()
  if jax.default_backend() == "gpu" or args.rehearse:
    args.gpu_shapes = [int(length) for length in args.gpu_shapes]
    attention_gpu.main(args)
    return
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count())
  print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads); causal "
        f"self-attention fwd+bwd, H={HEADS}, d={HEAD_DIM}; medians of {args.repeats} interleaved rounds\n")
  print("| B | L | implementation | time ms | peak MiB | time / torch |")
  print("|---|---|---|---|---|---|")
  for length in args.lengths:
    batch = batch_of(length)
    q, k, v, cotangent = inputs(batch, length)
    steps, peaks = {}, {}
    for name, attention in jax_candidates(batch, length).items():
      steps[name], peaks[name] = jax_step(attention, q, k, v, cotangent)
    if length <= 8192:
      steps["torch"], peaks["torch"] = torch_step(q, k, v, cotangent), torch_peak_bytes(batch, length)
    ms = median_ms(steps, args.repeats, args.pause)
    for name in steps:
      ratio = f"{ms[name] / ms['torch']:.2f}" if "torch" in ms else "—"
      print(f"| {batch} | {length} | {name} | {ms[name]:.0f} | {peaks[name] / 2**20:.0f} | {ratio} |",
            flush=True)


if __name__ == "__main__":
  cli.run(main)
