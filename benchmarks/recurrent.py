"""Forward + backward time of our recurrent layers against cuDNN, PyTorch and flax.linen.

    python3 project.py bench recurrent             # both tables: results/recurrent.md
    python benchmarks/recurrent.py --shapes base --repeats 15
    python benchmarks/recurrent.py               # on a GPU: the four GPU rows, float32 + bfloat16
    python benchmarks/recurrent.py --shapes all --cells lstm --dtypes float32,bfloat16

What is timed, for each shape (B batch, T time, D input, H hidden, layers, bidirectional),
cell and dtype: one training step's worth of work. The layer maps x [B, T, D] (zero
initial state) to outputs [B, T, directions·H]; the gradients of <outputs, cotangent>
(a fixed random cotangent) with respect to x and every weight are computed. For the JAX
peers that is one ahead-of-time compiled `jit(grad(...))` call followed by
`jax.block_until_ready`; for torch, forward + `backward(cotangent)` followed by
`torch.cuda.synchronize()` on a GPU. Compilation and two warm-up calls are not timed.
Peers run interleaved round-robin in one process (medians over rounds, `timing.py`) so
that machine noise hits each alike; ratios are ours / peer (below 1.0: we are faster).

  ours                  research.recurrent.{LSTM, GRU, RNN}(hidden_size=H, num_layers,
                        bidirectional, dtype)
  torch cuDNN / torch   torch.nn.{LSTM, GRU, RNN}(D, H, num_layers, bidirectional,
                        batch_first=True): on CUDA (cuDNN; the weights in its one buffer,
                        bfloat16 included: `flattened`) when JAX's backend is a GPU and
                        torch sees CUDA, else on the CPU (oneDNN, as many threads as cores)
  jax.experimental.rnn  JAX's cuDNN LSTM (`lstm`, weights from `init_lstm_weight`):
                        GPU backend and LSTM only; never imported on the CPU
  flax <Cell>           flax.linen.RNN over LSTMCell, OptimizedLSTMCell, GRUCell, SimpleCell;
                        layers > 1 are stacked by `FlaxStack` (each layer's outputs feed the
                        next, as in torch) and a bidirectional layer is nn.Bidirectional

dtypes: float32, or bfloat16 computation with float32 parameters where the peer has that
mode: ours `dtype=bfloat16` (outputs bfloat16, float32 accumulation and state), flax cells
`dtype=bfloat16, param_dtype=float32`. torch and jax.experimental.rnn have no such mode:
their weights and inputs are cast to bfloat16 (module `.to(torch.bfloat16)`). float32
matrix products run at each library's default precision (TF32 on recent NVIDIA GPUs for
JAX, cuDNN through torch and jax.experimental.rnn); the header line says which.

A peer that cannot run a case prints "—" and the reason below the table: in this jax,
jax.experimental.rnn lowers float32 only, and flax's SimpleCell cannot scan in bfloat16
with float32 parameters (its float32 carry meets a bfloat16 output).

Defaults follow the platform (`jax.default_backend()`): on the CPU the shapes base, long,
wide (one unidirectional layer), cells lstm, gru, rnn, float32, 9 rounds, 0.2 s pause;
on a GPU the four shapes of the GPU goal (base, long_bidir, stack_bidir,
wide_stack_bidir), cells lstm, gru, float32 and bfloat16, 20 rounds, no pause, and a
last line checking the goal: ours at most 0.8 × torch cuDNN's time. The flags override;
`--peers` narrows the peers (torch, jax_rnn, flax) and `--linear_layers` the linear
section's layers (the GPU pass: torch's cuDNN alone; LRU and S5).

Linear recurrences (`--section linear`, or `all` for both tables):

    python3 project.py bench recurrent --section linear     # a few minutes on 2 CPU cores
    python benchmarks/recurrent.py --section linear --linear_shape 4,64,64

times forward + backward (the same step as above: gradients of <outputs, cotangent> with
respect to x and every parameter) of each linear recurrence computed in parallel over time
(`mode="parallel"`: chunks side by side joined by associative_scan for the diagonal ones,
see research/recurrent/linear_scan.py and selective_scan.py; chunked matrix products for
Mamba-2, GLA and DeltaNet) and stepwise (`mode="stepwise"`, one step at a time), and our
`GRU`, at x [B, T, H] for T in `--lengths` (1K, 4K, 16K) and B, H, N in `--linear_shape`
(default 1, 32, 32): LRU with N complex states, S5 with 2N HiPPO-N states (N kept with
conjugate symmetry), Mamba with the paper's 16 states per channel (2H channels), Mamba-2
with N states per head of 16 channels, GLA and DeltaNet with heads of size N (H / N heads),
the GRU with hidden size H (`LINEAR_LAYERS`). On a CPU the parallel form gains where a
step's work is small against the loop's per-step cost (narrow layers, small batches); at
[4, T, 64] a step is already a vector pass over memory and the two forms come close.
Medians of `--linear_repeats` interleaved rounds per length, the calls back to back as in
a training loop (`--linear_pause`, 0 s by default: the pause above is for torch's spinning
threads, absent here, and after a 0.2 s sleep every call on the 2-core machine paid a
wake-up cost of several ms, more for the parallel form's many small operations: 21 ms
against 10.5 ms back to back, the stepwise form 30 ms against 22); the ratios are
stepwise / parallel (above 1.0: the parallel form is faster) and GRU / parallel, and last
lines check the goals (`LINEAR_GOALS`): the parallel form at least 2× faster than the
stepwise one at the longest length for LRU and S5, 3× at T = 4 096 for the selective ones.
Then each of those steps at `--compile_lengths` is compiled for
`--compile_target` (a TPU v5e chip by default) without the chip (`research.aot`), and
XLA's per-chip bytes and FLOP count are printed; where the target's toolchain (libtpu, the
`aot` extra) is missing the run is refused before it starts (`--compile_target=''` leaves
the compile out).
"""

import argparse
import os
import sys
from typing import Any
from unittest import mock

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX and torch share a GPU
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import cli  # noqa: E402

from research import jax_start  # noqa: E402

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  jax_start.cpu_unless_accelerators()   # the compile-only toolchains, without probing for chips
  import flax
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  from jax.sharding import SingleDeviceSharding
  from timing import median_ms

  from research import recurrent
  from research.aot import report, targets

SHAPES = {  # name: (B, T, D, H, layers, bidirectional)
    "base": (32, 128, 256, 256, 1, False),
    "long": (32, 1024, 256, 256, 1, False),
    "wide": (32, 128, 1024, 1024, 1, False),
    "long_bidir": (16, 1024, 256, 256, 1, True),
    "stack_bidir": (128, 256, 512, 512, 2, True),
    "wide_stack_bidir": (256, 64, 1024, 1024, 2, True),
}
CELLS = {  # cell: (our layer, torch module, {flax peer name: flax cell})
    "lstm": (recurrent.LSTM, torch.nn.LSTM,
             {"flax LSTMCell": nn.LSTMCell, "flax OptimizedLSTMCell": nn.OptimizedLSTMCell}),
    "gru": (recurrent.GRU, torch.nn.GRU, {"flax GRUCell": nn.GRUCell}),
    "rnn": (recurrent.RNN, torch.nn.RNN, {"flax SimpleCell": nn.SimpleCell}),
}
DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16)}
DEFAULTS = {  # backend: flag defaults (any other backend gets the CPU's)
    "cpu": {"shapes": "base,long,wide", "cells": "lstm,gru,rnn", "dtypes": "float32",
            "repeats": 9, "pause": 0.2},
    "gpu": {"shapes": "base,long_bidir,stack_bidir,wide_stack_bidir", "cells": "lstm,gru",
            "dtypes": "float32,bfloat16", "repeats": 20, "pause": 0.0},
}
GOAL = 0.8        # on a GPU: ours / torch cuDNN at most this at every row

LINEAR_LAYERS = {  # layer: its module for width H, N states and a mode, x [B, T, H] -> [B, T, H]
    "LRU": lambda h, n, mode: recurrent.LRU(state_size=n, mode=mode),
    "S5": lambda h, n, mode: recurrent.S5(state_size=2 * n, mode=mode),
    "Mamba": lambda h, n, mode: recurrent.Mamba(state_size=16, mode=mode),     # the paper's N
    "Mamba-2": lambda h, n, mode: recurrent.Mamba2(state_size=n, head_dim=16, mode=mode),
    "GLA": lambda h, n, mode: recurrent.GLA(state_size=n, mode=mode),          # heads of d_v = N
    "DeltaNet": lambda h, n, mode: recurrent.DeltaNet(state_size=n, mode=mode),
}
MODES = ("parallel", "stepwise")
# stepwise / parallel at least this on the CPU, at T (None: the longest length): LRU and S5
# (their issue's goal), the selective recurrences at 4 096 steps (theirs)
LINEAR_GOALS = {"LRU": (2.0, None), "S5": (2.0, None), "Mamba": (3.0, 4096),
                "Mamba-2": (3.0, 4096), "GLA": (3.0, 4096), "DeltaNet": (3.0, 4096)}


def linear_rows(width: int, states: int, layers=LINEAR_LAYERS) -> dict[str, nn.Module]:
  """{"LRU parallel": module, "LRU stepwise": …, …, "GRU": …}: every timed row of `layers`."""
  rows = {f"{name} {mode}": LINEAR_LAYERS[name](width, states, mode)
          for name in layers for mode in MODES}
  return {**rows, "GRU": recurrent.GRU(hidden_size=width)}


class FlaxStack(nn.Module):
  """flax.linen.RNN layers stacked like torch's num_layers; nn.Bidirectional if asked.

  x: [B, T, D] -> outputs [B, T, directions·H] of the last layer.
  """
  cell: Any                        # a flax.linen cell class, e.g. nn.LSTMCell
  features: int                    # H
  num_layers: int = 1
  bidirectional: bool = False
  dtype: Any = None                # the cells' computation dtype (parameters stay float32)

  @nn.compact
  def __call__(self, x):
    rnn = lambda: nn.RNN(self.cell(self.features, dtype=self.dtype, param_dtype=jnp.float32))
    for _ in range(self.num_layers):
      x = nn.Bidirectional(rnn(), rnn())(x) if self.bidirectional else rnn()(x)
    return x


def compiled_step(loss, *args):
  """fn() computing d loss(*args) / d(args[0], args[1]), compiled ahead of time.

  Every array is an argument (nothing large is baked into the executable); fn blocks
  until the gradients are ready.
  """
  grad = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
  return lambda: jax.block_until_ready(grad(*args))


def output_loss(model: nn.Module):
  """loss(variables, x, cotangent) = <outputs, cotangent> of a module returning outputs or
  (outputs, state)."""
  def loss(variables, x, cotangent):
    outputs = model.apply(variables, x)
    outputs = outputs[0] if isinstance(outputs, tuple) else outputs
    return jnp.vdot(outputs, cotangent)

  return loss


def jax_step(model: nn.Module, x: jax.Array, cotangent: jax.Array):
  """fn() for a flax module mapping x to outputs (or (outputs, state)): grads of params, x."""
  variables = model.init(jax.random.key(0), x)
  return compiled_step(output_loss(model), variables, x, cotangent)


def jax_cudnn_lstm_step(layers: int, bidirectional: bool, x: jax.Array, cotangent: jax.Array,
                        hidden: int):
  """fn() for JAX's cuDNN LSTM, jax.experimental.rnn.lstm: grads of its weights and x.

  Call only on a GPU backend: the op has no CPU lowering.
  """
  from jax.experimental import rnn  # pylint: disable=import-outside-toplevel
  batch, steps, features = x.shape
  weights = rnn.init_lstm_weight(jax.random.key(0), features, hidden, layers, bidirectional)
  state = jnp.zeros((layers * (2 if bidirectional else 1), batch, hidden), x.dtype)
  lengths = jnp.full((batch,), steps, jnp.int32)

  def loss(weights, x, cotangent, h0, c0, lengths):
    outputs, _, _ = rnn.lstm(x, h0, c0, weights, lengths, features, hidden, layers, 0.0,
                             bidirectional)
    return jnp.vdot(outputs, cotangent)

  return compiled_step(loss, weights.astype(x.dtype), x, cotangent, state, state, lengths)


def flattened(module: torch.nn.RNNBase) -> torch.nn.RNNBase:
  """module with its weights in the one contiguous buffer cuDNN reads: otherwise cuDNN
  copies them into one on every call, and a timing includes the copy. Called after every
  dtype or device move (a move re-creates the weights).

  torch's `flatten_parameters` does nothing for bfloat16: it asks
  `torch.backends.cudnn.is_acceptable`, which takes half, float and double only, yet torch
  runs a bfloat16 RNN on cuDNN, which then compacted the weights on every call (the "not
  part of single contiguous chunk of memory" warning of
  results/accelerator/h200_pass2/recurrent.log). Here a bfloat16 tensor is acceptable where
  a float32 one on its device would be. On CUDA, weights left in more than one buffer raise
  (the row's peer is then not run, its reason printed below the table)."""
  cudnn = torch.backends.cudnn
  acceptable = cudnn.is_acceptable
  as_float32 = lambda t: acceptable(t.new_empty(0, dtype=torch.float32))
  with mock.patch.object(cudnn, "is_acceptable", lambda t: acceptable(t) or (
      t.dtype == torch.bfloat16 and as_float32(t))):
    module.flatten_parameters()
  weights = module._flat_weights  # pylint: disable=protected-access  # what cuDNN reads
  buffers = {w.untyped_storage().data_ptr() for w in weights}
  if weights[0].is_cuda and len(buffers) != 1:
    raise RuntimeError(f"torch's {type(module).__name__} weights in {len(buffers)} buffers after "
                       f"flatten_parameters ({weights[0].dtype}): cuDNN would copy them every call")
  return module


def torch_step(module: torch.nn.Module, x: np.ndarray, cotangent: np.ndarray,
               device: torch.device, dtype: torch.dtype):
  """fn() running module's forward and backward(cotangent) on device, waiting for it."""
  module = flattened(module.to(device=device, dtype=dtype))
  x = torch.from_numpy(x).to(device=device, dtype=dtype).requires_grad_(True)
  cotangent = torch.from_numpy(cotangent).to(device=device, dtype=dtype)
  synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None

  def run():
    module.zero_grad(set_to_none=True)
    x.grad = None
    outputs, _ = module(x)
    outputs.backward(cotangent)
    synchronize()

  return run


def optional_peer(fns: dict, notes: dict, name: str, build):
  """fns[name] = build(), or the reason in notes[name] when the peer cannot run this case."""
  try:
    fns[name] = build()
  except Exception as error:  # pylint: disable=broad-except  # a peer's unsupported case
    notes[name] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}"


PEERS = ("torch", "jax_rnn", "flax")   # --peers: torch's RNN modules, jax.experimental.rnn, flax


def peers(shape: str, cell: str, dtype: str, backend: str, device: torch.device,
          chosen=PEERS):
  """({peer: fn}, {peer: reason not run}) for one table row; "ours" first, then the
  `chosen` kinds of peer."""
  b, t, d, h, layers, bidirectional = SHAPES[shape]
  ours, torch_cls, flax_cells = CELLS[cell]
  jax_dtype, torch_dtype = DTYPES[dtype]
  rng = np.random.default_rng(0)
  x = rng.standard_normal((b, t, d), dtype=np.float32)
  cotangent = rng.standard_normal((b, t, (2 if bidirectional else 1) * h), dtype=np.float32)
  jx, jcotangent = jnp.asarray(x, jax_dtype), jnp.asarray(cotangent, jax_dtype)

  fns, notes = {}, {}
  fns["ours"] = jax_step(ours(hidden_size=h, num_layers=layers, bidirectional=bidirectional,
                              dtype=jax_dtype), jx, jcotangent)
  torch_name = "torch cuDNN" if device.type == "cuda" else "torch"
  if "torch" in chosen:
    optional_peer(fns, notes, torch_name, lambda: torch_step(
        torch_cls(d, h, num_layers=layers, bidirectional=bidirectional, batch_first=True),
        x, cotangent, device, torch_dtype))
  if backend == "gpu" and cell == "lstm" and "jax_rnn" in chosen:
    optional_peer(fns, notes, "jax.experimental.rnn",
                  lambda: jax_cudnn_lstm_step(layers, bidirectional, jx, jcotangent, h))
  for name, flax_cell in flax_cells.items() if "flax" in chosen else ():
    stack = FlaxStack(flax_cell, h, layers, bidirectional, jax_dtype)
    optional_peer(fns, notes, name, lambda stack=stack: jax_step(stack, jx, jcotangent))
  return fns, notes


def header(backend: str, device: torch.device, repeats: int) -> str:
  if device.type == "cuda":
    torch_where = (f"cuda ({torch.cuda.get_device_name(device)}, cuDNN "
                   f"{torch.backends.cudnn.version()}, cudnn.allow_tf32="
                   f"{torch.backends.cudnn.allow_tf32})")
  else:
    torch_where = f"cpu ({torch.get_num_threads()} threads)"
  precision = jax.config.jax_default_matmul_precision or "default"
  return (f"{backend} ({jax.devices()[0].device_kind}): jax {jax.__version__} (matmul precision "
          f"{precision}), flax {flax.__version__}, torch {torch.__version__} on {torch_where}; "
          f"medians of {repeats} interleaved rounds")


def cells_section(args, backend: str, device: torch.device):
  """The table of our RNN / LSTM / GRU layers against their peers (module docstring)."""
  print(header(backend, device, args.repeats) + "\n")
  print("| shape B,T,D,H,layers,bidir | cell | dtype | ours ms | peer | peer ms | ours / peer |")
  print("|---|---|---|---|---|---|---|")
  not_run, goal_ratios = {}, []
  for shape in args.shapes:
    b, t, d, h, layers, bidirectional = SHAPES[shape]
    shape_text = f"{b},{t},{d},{h},{layers},{'yes' if bidirectional else 'no'}"
    for cell in args.cells:
      for dtype in args.dtypes:
        fns, notes = peers(shape, cell, dtype, backend, device, args.peers)
        ms = median_ms(fns, args.repeats, args.pause)
        row = f"| {shape_text} | {cell} | {dtype} | {ms['ours']:.2f} |"
        for peer in list(fns)[1:] + list(notes):
          if peer in notes:
            print(f"{row} {peer} | — | — |", flush=True)
            not_run.setdefault((peer, notes[peer]), []).append(f"{shape_text} {cell} {dtype}")
            continue
          ratio = ms["ours"] / ms[peer]
          print(f"{row} {peer} | {ms[peer]:.2f} | {ratio:.2f} |", flush=True)
          if peer == "torch cuDNN":
            goal_ratios.append((ratio, f"{shape_text} {cell} {dtype}"))
        del fns  # free this row's device buffers before the next

  for (peer, reason), rows in not_run.items():
    print(f"\n{peer} not run at {'; '.join(rows)}: {reason}")
  if goal_ratios:
    met = sum(ratio <= GOAL for ratio, _ in goal_ratios)
    worst, where = max(goal_ratios)
    print(f"\nGoal ours / torch cuDNN <= {GOAL}: met at {met} of {len(goal_ratios)} rows; "
          f"worst {worst:.2f} at {where}")


def linear_timings(shape: tuple[int, int, int], lengths: list[int], repeats: int,
                   pause: float, layers=LINEAR_LAYERS) -> dict[str, dict[int, float]]:
  """Prints the CPU table; returns {layer: {T: stepwise / parallel}}."""
  batch, width, states = shape
  print(f"{jax.default_backend()} ({jax.devices()[0].device_kind}, {os.cpu_count()} cores): "
        f"jax {jax.__version__}; forward + backward, x [{batch}, T, {width}], N = {states}; "
        f"medians of {repeats} interleaved rounds\n")
  print("| T | layer | parallel ms | stepwise ms | stepwise / parallel | GRU ms | "
        "GRU / parallel |")
  print("|---|---|---|---|---|---|---|")
  ratios = {name: {} for name in layers}
  for steps in lengths:
    rng = np.random.default_rng(0)
    x, cotangent = (jnp.asarray(rng.standard_normal((batch, steps, width), dtype=np.float32))
                    for _ in range(2))
    fns = {row: jax_step(model, x, cotangent)
           for row, model in linear_rows(width, states, layers).items()}
    ms = median_ms(fns, repeats, pause)
    for layer in layers:
      parallel, stepwise = ms[f"{layer} parallel"], ms[f"{layer} stepwise"]
      ratios[layer][steps] = stepwise / parallel
      print(f"| {steps} | {layer} | {parallel:.1f} | {stepwise:.1f} | {stepwise / parallel:.2f} | "
            f"{ms['GRU']:.1f} | {ms['GRU'] / parallel:.2f} |", flush=True)
    del fns
  return ratios


def linear_compiled(shape: tuple[int, int, int], lengths: list[int], target_name: str) -> None:
  """Prints XLA's per-chip bytes and FLOPs of each step compiled for `target_name`."""
  batch, width, states = shape
  print(f"\nCompiled for {target_name} without the chip (research.aot), forward + backward, "
        f"x [{batch}, T, {width}], N = {states}:\n")
  target = targets.get(target_name)   # its toolchain checked by parse_arguments
  device = targets.devices_of(target)[0]
  sharding = SingleDeviceSharding(device)
  on_chip = lambda tree: jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)
  print("| T | layer | per-chip MiB (temporaries) | fits | GFLOP |")
  print("|---|---|---|---|---|")
  for steps in lengths:
    x = jax.ShapeDtypeStruct((batch, steps, width), jnp.float32)
    for name, model in linear_rows(width, states).items():
      variables = jax.eval_shape(model.init, jax.random.key(0), x)
      grad = jax.jit(jax.grad(output_loss(model), argnums=(0, 1)))
      compiled = grad.lower(on_chip(variables), on_chip(x), on_chip(x)).compile()
      r = report.analyze(compiled, targets.memory_bytes(target))
      flops = "—" if r["flops"] is None else f"{r['flops'] / 1e9:.3f}"
      print(f"| {steps} | {name} | {r['bytes']['total'] / 2**20:.1f} "
            f"({r['bytes']['temp'] / 2**20:.1f}) | {'yes' if r['fits'] else 'no'} | {flops} |",
            flush=True)


def linear_section(args) -> None:
  """The linear recurrences, parallel against stepwise, and our GRU (module docstring)."""
  shape, lengths = args.linear_shape, args.lengths
  ratios = linear_timings(shape, lengths, args.linear_repeats, args.linear_pause,
                         args.linear_layers)
  print()
  for layer, (goal, steps) in LINEAR_GOALS.items():
    if layer not in args.linear_layers:
      continue
    steps = steps or lengths[-1]
    if steps in ratios[layer]:
      met = "met" if ratios[layer][steps] >= goal else "not met"
      print(f"Goal {layer}: stepwise / parallel >= {goal} at T = {steps}: {met} "
            f"({ratios[layer][steps]:.2f})")
  if args.compile_target:
    linear_compiled(shape, args.compile_lengths, args.compile_target)


def linear_host_bytes(shape: tuple[int, int, int], steps: int) -> int:
  """A low estimate of the host memory of the linear section's largest step at T = `steps`
  for B, H, N = `shape`: x, the cotangent, the outputs and dx ([B, T, H] float32 each),
  the states the backward pass keeps and their cotangents (the largest: Mamba's parallel
  form, [B, T, 2H, 16] float32 each; LRU's and S5's [B, T, N] complex64), and the largest
  layer's parameters with their gradients (the GRU's six H × H matrices, LRU's and S5's
  two N × H complex projections)."""
  batch, width, states = shape
  kept = max(8 * states, 4 * 2 * width * 16)
  activations = 4 * batch * steps * 4 * width + batch * steps * 2 * kept
  return activations + 2 * max(4 * 6 * width * width, 8 * 2 * states * width)


def linear_shape(text: str) -> tuple[int, int, int]:
  """B,H,N: three positive integers."""
  values = text.split(",")
  if len(values) != 3 or not all(v.strip().isdigit() and int(v) >= 1 for v in values):
    raise argparse.ArgumentTypeError(f"must be B,H,N, three positive integers, got {text!r}")
  return tuple(int(v) for v in values)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  """The arguments (defaults follow JAX's backend); the --compile_target's toolchain is
  checked too when the linear section runs (a table of refusals is no measurement)."""
  with jax_start.held_back():   # JAX's backends start: the plugins log
    defaults = DEFAULTS.get(jax.default_backend(), DEFAULTS["cpu"])
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--section", default="cells", choices=("cells", "linear", "all"),
                      help="the RNN / LSTM / GRU table against peers, the linear recurrences', "
                           "or both (default: %(default)s)")
  parser.add_argument("--shapes", type=cli.names_of(SHAPES, every="all"),
                      default=defaults["shapes"],
                      help=f"comma list of {list(SHAPES)}, or all (default here: %(default)s)")
  parser.add_argument("--cells", type=cli.names_of(CELLS), default=defaults["cells"],
                      help=f"comma list of {list(CELLS)} (default here: %(default)s)")
  parser.add_argument("--dtypes", type=cli.names_of(DTYPES), default=defaults["dtypes"],
                      help=f"comma list of {list(DTYPES)} (default here: %(default)s)")
  parser.add_argument("--peers", type=cli.names_of(PEERS), default=",".join(PEERS),
                      help=f"comma list of {list(PEERS)}: the peers timed beside ours "
                           "(default: %(default)s)")
  parser.add_argument("--repeats", type=cli.positive_int, default=defaults["repeats"])
  parser.add_argument("--pause", type=cli.non_negative_float, default=defaults["pause"],
                      help="seconds idle before each timed call (default here: %(default)s)")
  parser.add_argument("--linear_shape", type=linear_shape, default="1,32,32",
                      help="linear section: B,H,N, batch, width and states (default: %(default)s)")
  parser.add_argument("--linear_layers", type=cli.names_of(LINEAR_LAYERS),
                      default=",".join(LINEAR_LAYERS),
                      help="linear section: comma list of the layers timed beside the GRU "
                           "(default: %(default)s)")
  parser.add_argument("--lengths", type=cli.positive_ints, default="1024,4096,16384",
                      help="linear section: comma list of T (default: %(default)s)")
  parser.add_argument("--linear_repeats", type=cli.positive_int, default=9,
                      help="linear section: interleaved rounds per T (default: %(default)s)")
  parser.add_argument("--linear_pause", type=cli.non_negative_float, default=0.0,
                      help="linear section: seconds idle before each timed call (default: %(default)s)")
  parser.add_argument("--compile_target", type=cli.name_of(targets.TARGETS, allow_empty=True),
                      default="tpu-v5e-1",
                      help="linear section: the research.aot target to compile for, or '' for "
                           "none (default: %(default)s)")
  parser.add_argument("--compile_lengths", type=cli.positive_ints, default="16384",
                      help="linear section: comma list of T compiled for the target "
                           "(default: %(default)s)")
  return cli.parse(parser, argv, check_linear_section)


def check_linear_section(parser: cli.Parser, args: argparse.Namespace) -> None:
  """Where the linear section runs, refuses a --linear_shape and --lengths whose step would
  not fit the host's memory and a --compile_target this machine cannot compile for (the
  cells section's shapes are SHAPES: fixed, small)."""
  if args.section == "cells":
    return
  steps = max(args.lengths)
  cli.check_memory(parser, linear_host_bytes(args.linear_shape, steps),
                   f"--linear_shape={','.join(map(str, args.linear_shape))} and --lengths up "
                   f"to {steps}", "the inputs, states and parameters of a step")
  if args.compile_target:
    try:
      targets.devices_of(targets.get(args.compile_target))
    except targets.TargetUnavailable as error:
      parser.error(f"argument --compile_target: {error}; or --compile_target='' to leave it out")


def main():
  args = parse_arguments()
  backend = jax.default_backend()

  device = torch.device("cuda" if backend == "gpu" and torch.cuda.is_available() else "cpu")
  torch.set_num_threads(os.cpu_count())
  if args.section in ("cells", "all"):
    cells_section(args, backend, device)
  if args.section == "all":
    print()
  if args.section in ("linear", "all"):
    linear_section(args)


if __name__ == "__main__":
  cli.run(main)
