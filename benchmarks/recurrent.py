"""Forward + backward time of our recurrent layers against PyTorch and flax.linen.

    python3 tasks.py bench                       # every shape (a few minutes on 2 cores)
    python benchmarks/recurrent.py --shapes base --repeats 15

For each shape (B batch, T time, D input, H hidden) and cell, one training step's worth
of work is timed: outputs of a single-layer unidirectional layer, a random cotangent,
gradients with respect to the input and every weight. Peers, all timed in the same run,
interleaved round-robin so that machine noise hits each alike:

  ours   research.recurrent.{LSTM, GRU, RNN}
  torch  torch.nn.{LSTM, GRU, RNN} (oneDNN kernels; as many threads as cores)
  flax   flax.linen.RNN over LSTMCell, OptimizedLSTMCell, GRUCell, SimpleCell

It prints median milliseconds and the ratios ours / peer (below 1.0: we are faster).
"""

import argparse
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
from timing import median_ms

from research import recurrent

SHAPES = {  # name: (B, T, D, H)
    "base": (32, 128, 256, 256),
    "long": (32, 1024, 256, 256),
    "wide": (32, 128, 1024, 1024),
}
CELLS = {  # cell: (our layer, torch module, {flax peer name: flax cell})
    "lstm": (recurrent.LSTM, torch.nn.LSTM,
             {"flax LSTMCell": nn.LSTMCell, "flax OptimizedLSTMCell": nn.OptimizedLSTMCell}),
    "gru": (recurrent.GRU, torch.nn.GRU, {"flax GRUCell": nn.GRUCell}),
    "rnn": (recurrent.RNN, torch.nn.RNN, {"flax SimpleCell": nn.SimpleCell}),
}


def jax_step(model: nn.Module, x: np.ndarray, cotangent: np.ndarray):
  """A jitted fn() computing d(<outputs, cotangent>)/d(params, x), blocking until done."""
  x, cotangent = jnp.asarray(x), jnp.asarray(cotangent)
  variables = model.init(jax.random.key(0), x)

  def loss(variables, x):
    outputs = model.apply(variables, x)
    outputs = outputs[0] if isinstance(outputs, tuple) else outputs
    return jnp.vdot(outputs, cotangent)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return lambda: jax.block_until_ready(grad(variables, x))


def torch_step(module: torch.nn.Module, x: np.ndarray, cotangent: np.ndarray):
  x = torch.from_numpy(x).requires_grad_(True)
  cotangent = torch.from_numpy(cotangent)

  def run():
    module.zero_grad(set_to_none=True)
    x.grad = None
    outputs, _ = module(x)
    outputs.backward(cotangent)

  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default="base,long,wide", help=f"comma list of {list(SHAPES)}")
  parser.add_argument("--cells", default="lstm,gru,rnn", help=f"comma list of {list(CELLS)}")
  parser.add_argument("--repeats", type=int, default=9)
  parser.add_argument("--pause", type=float, default=0.2, help="seconds idle before each call")
  args = parser.parse_args()
  torch.set_num_threads(os.cpu_count())
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads; medians of {args.repeats} interleaved rounds\n")
  print("| shape B,T,D,H | cell | ours ms | peer | peer ms | ours / peer |")
  print("|---|---|---|---|---|---|")
  for shape in args.shapes.split(","):
    b, t, d, h = SHAPES[shape]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, t, d), dtype=np.float32)
    cotangent = rng.standard_normal((b, t, h), dtype=np.float32)
    for cell in args.cells.split(","):
      ours, torch_cls, flax_cells = CELLS[cell]
      fns = {"ours": jax_step(ours(hidden_size=h), x, cotangent),
             "torch": torch_step(torch_cls(d, h, batch_first=True), x, cotangent)}
      fns.update({name: jax_step(nn.RNN(flax_cell(h)), x, cotangent)
                  for name, flax_cell in flax_cells.items()})
      ms = median_ms(fns, args.repeats, args.pause)
      for peer in list(fns)[1:]:
        print(f"| {b},{t},{d},{h} | {cell} | {ms['ours']:.1f} | {peer} | {ms[peer]:.1f} "
              f"| {ms['ours'] / ms[peer]:.2f} |", flush=True)


if __name__ == "__main__":
  main()
