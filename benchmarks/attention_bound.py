"""What bounds chunked causal attention on XLA:CPU: its matrix products alone, against torch.

    python benchmarks/attention_bound.py --length 2048 --repeats 5

Causal forward + backward over [block, block] tiles performs seven products per visible
(query block i, key block j) pair, i ≥ j:

  forward   s = q_i k_jᵀ,  o_i += p v_j
  backward  sᵀ = k_j q_iᵀ (recomputed),  dpᵀ = v_j dout_iᵀ,  dv_j += pᵀ dout_i,
            dk_j += dsᵀ q_i,  dq_i += ds k_j

"matmuls only" runs exactly these products on the same tiles with one multiply in
place of the softmax and its exponentials, masks and rescaling: no attention
implementation built from XLA:CPU's kernels can be faster. It is timed in one
interleaved run with our chunked attention (block 256) and torch's fused
`scaled_dot_product_attention`, at B=4, H=8, d=64.
"""

import argparse
import os

import cli

from research import jax_start

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  import jax
  import jax.numpy as jnp
  from attention import HEADS, host_bytes, inputs, jax_step, torch_step
  from jax import lax
  from timing import median_ms

  from research.attention import dot_product_attention

BLOCK, BATCH = 256, 4


def matmuls_only(q, k, v, d_out):
  """The seven tile products of causal attention fwd+bwd. q, k, v, d_out: [B, L, H, d]."""
  b, length, h, d = q.shape
  q, k, v, d_out = (x.transpose(0, 2, 1, 3).reshape(b * h, length, d) for x in (q, k, v, d_out))
  pairs = [(i, j) for i in range(length // BLOCK) for j in range(i + 1)]
  rows, cols = jnp.array([i for i, _ in pairs]), jnp.array([j for _, j in pairs])
  tile = lambda x, start: lax.dynamic_slice_in_dim(x, start * BLOCK, BLOCK, 1)

  def pair(t, carry):
    o_i, d_q, d_k, d_v = carry
    q_i, d_out_i, k_j, v_j = tile(q, rows[t]), tile(d_out, rows[t]), tile(k, cols[t]), tile(v, cols[t])
    o_i = o_i + jnp.einsum("nqk,nkd->nqd", jnp.einsum("nqd,nkd->nqk", q_i, k_j), v_j)
    s_t = jnp.einsum("nkd,nqd->nkq", k_j, q_i)
    ds_t = s_t * jnp.einsum("nkd,nqd->nkq", v_j, d_out_i)
    d_v = d_v + jnp.einsum("nkq,nqd->nkd", s_t, d_out_i)
    d_k = d_k + jnp.einsum("nkq,nqd->nkd", ds_t, q_i)
    d_q = d_q + jnp.einsum("nkq,nkd->nqd", ds_t, k_j)
    return o_i, d_q, d_k, d_v

  zeros = jnp.zeros((b * h, BLOCK, d), q.dtype)
  return lax.fori_loop(0, len(pairs), pair, (zeros,) * 4)


def tiled_length(text: str) -> int:
  """A positive multiple of BLOCK: the tiles cover every position."""
  if not text.strip().isdigit() or int(text) < BLOCK or int(text) % BLOCK:
    raise argparse.ArgumentTypeError(f"must be a positive multiple of {BLOCK}, got {text!r}")
  return int(text)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=tiled_length, default=2048,
                      help=f"L, a multiple of the tile size {BLOCK}")
  parser.add_argument("--repeats", type=cli.positive_int, default=5)
  return cli.parse(parser, argv, check_memory)


def check_memory(parser: cli.Parser, args: argparse.Namespace) -> None:
  """Refuses a --length whose step would not fit the host's memory (no dense weights)."""
  cli.check_memory(parser, host_bytes(BATCH, args.length, dense=False),
                   f"--length={args.length}", "q, k, v and their gradients")


def main():
  args = parse_arguments()
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count())
  q, k, v, cotangent = inputs(BATCH, args.length)
  skeleton = jax.jit(matmuls_only)
  chunked, _ = jax_step(lambda q, k, v: dot_product_attention(
      q, k, v, is_causal=True, implementation="chunked"), q, k, v, cotangent)
  ms = median_ms({"matmuls only": lambda: jax.block_until_ready(skeleton(q, k, v, cotangent)),
                  "ours chunked": chunked,
                  "torch": torch_step(q, k, v, cotangent)}, args.repeats, pause=0.3)
  print(f"causal fwd+bwd, B={BATCH}, L={args.length}, H={HEADS}, d=64; medians of {args.repeats} rounds\n")
  print("| implementation | time ms | time / torch |\n|---|---|---|")
  for name, t in ms.items():
    print(f"| {name} | {t:.0f} | {t / ms['torch']:.2f} |")


if __name__ == "__main__":
  cli.run(main)
