"""Long Range Arena's Table 2 on our machines: each attention's training step against full's.

    python3 project.py bench lra_efficiency                     # CPU, 1K-4K, a TPU v4 chip
    python benchmarks/lra_efficiency.py --lengths 1024,4096 --attentions full,linformer

The model is ListOps' `lra` preset (`experiments/listops.py`: 6 post-norm layers, width
512, 8 heads, MLP 2048, LRA's windows and projections), one per attention of
`research.models.self_attention.SELF_ATTENTIONS`, on token inputs of length L. The baseline,
"full (dense)", is LRA's vanilla Transformer: the [L, L] weights materialised. "full" is
the same attention as `implementation="auto"` runs it (on a CPU `chunked`, exact in O(n)
memory; on a TPU splash attention), so it is an efficient variant of its own. Its training step
is the gradient of the mean cross-entropy of the 10-way logits with respect to every
parameter (`jit(grad(loss))`, float32), on a batch of `--batch` sequences (the same for
every attention). For each length it prints, relative to full (dense) at that length:

  speed     steps/s on this machine (medians of interleaved rounds, `timing.py`)
  memory    XLA's buffers for the compiled step on this machine (arguments + outputs +
            temporaries, `memory_analysis()`)
  v4 chip   the same compiled for one TPU v4 chip (deviceless, `research.aot`) with
            `--tpu_batch` sequences, at `--tpu_lengths` (default 4K: each compile takes
            about a minute on 2 cores): per-chip bytes, and whether it fits the chip's HBM
            (where XLA refuses the step, "over:" what it needs and the chip has); without
            the chip's toolchain (the `aot` extra) the run is refused before it starts,
            `--tpu ''` leaves the column out, and a compile that fails for another reason
            ends the run with exit status 1 after the table

and at `--memory_lengths` (compiled, not run) each attention's memory at the longest
length over its memory at the shortest, the O(n) check (linear: the ratio of the lengths).
Numbers are medians and ratios measured in one run: compare those, not the absolute times
of a noisy machine. LRA's Table 2 (TPU v3, 4K) for comparison: Performer 5.7× full's speed
at 11% of its memory, Linear Trans. 5.6× at 10%, BigBird 1.2× at 31%, Reformer 0.8× at 24%.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cli  # noqa: E402

from research import jax_start  # noqa: E402

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  jax_start.cpu_unless_accelerators()
  import jax
  import jax.numpy as jnp
  import optax
  from timing import median_ms

  from research.aot import report, targets
  from research.models import EncoderClassifier
  from research.models.self_attention import SELF_ATTENTIONS
  from research.training.config import load_config

VOCAB, CLASSES = 32, 10


BASELINE = "full (dense)"


def preset_model():
  """config.model of the listops `lra` preset."""
  return load_config(os.path.join(ROOT, "experiments", "listops.py"))[0].model


def model_of(variant: str, length: int) -> EncoderClassifier:
  """The listops `lra` preset's model with the attention `variant` (an entry of SELF_ATTENTIONS
  or BASELINE), for inputs of `length` tokens."""
  fields = preset_model().to_dict()
  fields["attention"] = "full" if variant == BASELINE else variant
  if variant == BASELINE:
    fields["implementation"] = "dense"
  return EncoderClassifier(**fields, vocab_size=VOCAB, num_classes=CLASSES, max_length=length)


def step_host_bytes(model, batch: int, length: int, dense: bool) -> int:
  """A low estimate of the host memory of the training step of `model` (a preset's
  config.model) on `batch` sequences of `length` tokens: the parameters and their gradients
  (per layer 4 width² of attention and 2 width · mlp_size of MLP), the activations each
  layer keeps for the backward pass (per token q, k, v, the attention's output and the
  MLP's hidden units: 4 width + mlp_size floats) and, with full (dense) among the
  attentions (`dense`), each layer's [B, heads, L, L] weights; float32 throughout."""
  width, layers = model.hidden_size, model.num_layers
  parameters = layers * (4 * width * width + 2 * width * model.mlp_size)
  per_layer = batch * length * (4 * width + model.mlp_size)
  per_layer += batch * model.num_heads * length * length if dense else 0
  return 4 * (2 * parameters + layers * per_layer)


def train_step(model: EncoderClassifier):
  """grad of the mean cross-entropy with respect to the parameters (dropout on)."""
  def loss(params, tokens, lengths, labels, rng):
    logits = model.apply({"params": params}, tokens, lengths, train=True,
                         rngs={"dropout": rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return jax.grad(loss)


def abstract_inputs(model: EncoderClassifier, batch: int, length: int, sharding=None):
  """ShapeDtypeStructs of (params, tokens, lengths, labels, rng) for lowering."""
  tokens = jnp.zeros((batch, length), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens,
                                             jnp.full((batch,), length))["params"])
  put = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  rng = jax.eval_shape(lambda: jax.random.key(0))
  return (jax.tree.map(put, params), put(tokens), put(jnp.zeros((batch,), jnp.int32)),
          put(jnp.zeros((batch,), jnp.int32)), put(rng))


def compiled_bytes(attention: str, batch: int, length: int, device=None) -> int:
  """Per-device bytes of the compiled training step (on `device`, a compile-only one)."""
  model = model_of(attention, length)
  sharding = None if device is None else jax.sharding.SingleDeviceSharding(device)
  lowered = jax.jit(train_step(model)).trace(
      *abstract_inputs(model, batch, length, sharding)).lower(
          lowering_platforms=None if device is None else (device.platform,))
  return report.memory(lowered.compile())["total"]


def compiled_step(attention: str, batch: int, length: int):
  """The step compiled once on concrete inputs: (a no-argument call for `median_ms`, the
  executable's bytes on this machine)."""
  model = model_of(attention, length)
  keys = jax.random.split(jax.random.key(0), 3)
  tokens = jax.random.randint(keys[0], (batch, length), 1, VOCAB)
  lengths = jnp.full((batch,), length)
  labels = jax.random.randint(keys[1], (batch,), 0, CLASSES)
  params = jax.jit(model.init)(keys[2], tokens, lengths)["params"]
  arguments = (params, tokens, lengths, labels, keys[2])
  step = jax.jit(train_step(model)).lower(*arguments).compile()
  return (lambda: jax.block_until_ready(step(*arguments)),
          report.memory(step)["total"])


def refusal(error: Exception) -> str:
  """The table's cell for a compile the chip refused: what XLA says the step needs and the
  chip has when it ran out of HBM, else the error's first line."""
  over = re.search(r"Used (\S+) of (\S+) hbm|temporaries \((\S+)\) exceeds available HBM "
                   r"\((\S+)\)", str(error))
  if over:
    needs, has = filter(None, over.groups())
    return f"over: needs {needs}, has {has}"
  return f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"


TPUS = [name for name, target in targets.TARGETS.items() if target.platform == "tpu"]


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  """The arguments, checked (a column of refusals is no measurement)."""
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=cli.positive_ints, default="1024,2048,3072,4096")
  parser.add_argument("--memory_lengths", type=cli.positive_ints, default="4096,16384",
                      help="two lengths, shorter first: the memory ratio's O(n) check")
  parser.add_argument("--attentions", type=cli.names_of((BASELINE, *SELF_ATTENTIONS)),
                      default=",".join((BASELINE, *SELF_ATTENTIONS)))
  parser.add_argument("--batch", type=cli.positive_int, default=1)
  parser.add_argument("--tpu", type=cli.name_of(TPUS, allow_empty=True),
                      default="tpu-v4-1", help="compile-only target ('' to skip)")
  parser.add_argument("--tpu_batch", type=cli.positive_int, default=32)
  parser.add_argument("--tpu_lengths", type=cli.positive_ints, default="4096",
                      help="lengths of --lengths compiled for the chip (about a minute each on "
                           "2 cores)")
  parser.add_argument("--repeats", type=cli.positive_int, default=3)
  return cli.parse(parser, argv, check_lengths_and_chip)


def check_lengths_and_chip(parser: cli.Parser, args: argparse.Namespace) -> None:
  """Refuses --memory_lengths that are not two lengths, the shorter first, --tpu_lengths
  outside --lengths, a --batch and --lengths whose step would not fit the host's memory
  (--memory_lengths and the chip's are compiled, not run) and a --tpu chip this machine
  cannot compile for."""
  if len(args.memory_lengths) != 2 or args.memory_lengths[0] >= args.memory_lengths[1]:
    parser.error(f"argument --memory_lengths: must be two lengths, the shorter first, got "
                 f"{','.join(map(str, args.memory_lengths))}")
  if args.tpu and (others := [n for n in args.tpu_lengths if n not in args.lengths]):
    parser.error(f"argument --tpu_lengths: {', '.join(map(str, others))} not among --lengths "
                 f"({','.join(map(str, args.lengths))})")
  dense, length = BASELINE in args.attentions, max(args.lengths)
  cli.check_memory(parser, step_host_bytes(preset_model(), args.batch, length, dense),
                   f"--batch={args.batch} and --lengths up to {length}",
                   "a training step" + (" with full (dense)'s [L, L] weights" if dense else ""))
  if args.tpu:
    try:
      targets.devices_of(targets.get(args.tpu))
    except targets.TargetUnavailable as error:
      parser.error(f"argument --tpu: {error}; or --tpu='' to leave the chip out")


def main():
  args = parse_arguments()
  attentions, tpu_lengths = args.attentions, set(args.tpu_lengths)
  device = targets.devices_of(targets.get(args.tpu))[0] if args.tpu else None
  gib = lambda n: f"{n / 2**30:.2f} GiB"

  print(f"Training step, batch {args.batch} here, {args.tpu_batch} on the {args.tpu or '-'} "
        "chip; ratios against full (dense) at the same length\n")
  print("| L | attention | speed | memory | steps/s | memory here | v4 chip | fits |")
  print("|---|---|---|---|---|---|---|---|")
  cpu_bytes = {}   # (attention, length) -> bytes of the step compiled here
  failed = []      # chip compiles that failed for another reason than the chip's HBM
  for length in args.lengths:
    steps = {}
    for name in attentions:
      steps[name], cpu_bytes[name, length] = compiled_step(name, args.batch, length)
    here = {name: cpu_bytes[name, length] for name in attentions}
    ms = median_ms(steps, args.repeats, pause=0.2)
    for name in attentions:
      chip = fits = "-"
      if device is not None and length in tpu_lengths:
        try:
          chip_bytes = compiled_bytes(name, args.tpu_batch, length, device)
          chip = gib(chip_bytes)
          fits = "yes" if chip_bytes <= targets.memory_bytes(targets.get(args.tpu)) else "no"
        except Exception as error:  # noqa: BLE001 - XLA refuses what exceeds the chip's HBM
          chip, fits = refusal(error), "no"
          if not chip.startswith("over:"):
            failed.append(f"{name} at L = {length}")
      speed = ms.get(BASELINE, float("nan")) / ms[name]
      memory = here[name] / here[BASELINE] if BASELINE in here else float("nan")
      print(f"| {length} | {name} | {speed:.2f}× | {memory:.0%} | {1e3 / ms[name]:.2f} | "
            f"{gib(here[name])} | {chip} | {fits} |", flush=True)

  short, long = args.memory_lengths
  print(f"\nMemory of the compiled step here at L = {long} over L = {short} (linear: "
        f"{long / short:.0f}×)\n")
  print(f"| attention | {short} | {long} | ratio |")
  print("|---|---|---|---|")
  for name in attentions:
    sizes = [cpu_bytes.get((name, n)) or compiled_bytes(name, args.batch, n)
             for n in (short, long)]
    print(f"| {name} | {gib(sizes[0])} | {gib(sizes[1])} | {sizes[1] / sizes[0]:.1f}× |",
          flush=True)
  if failed:   # a table with failed cells is no result (project.py keeps the committed one)
    sys.exit(f"error: the {args.tpu} compile failed for {', '.join(failed)} (see the table)")


if __name__ == "__main__":
  cli.run(main)
