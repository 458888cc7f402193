"""sequence_tasks: RNN vs LSTM vs GRU vs attention as the dependency distance T grows.

Tasks (research/experiments/sequence_tasks.py): copy and reverse (copy memory: K symbols, T
blanks, a delimiter, then the K symbols to output), adding (Hochreiter & Schmidhuber's
adding problem of length T: MSE, accuracy = fraction with |error| < 0.04; always
answering 1 scores MSE ≈ 0.167) and recall (K key-value pairs, T blanks, a query key).

  python launch.py --config experiments/sequence_tasks.py:task=adding,model=lstm
  python launch.py --config experiments/sequence_tasks.py:model=transformer \
      --config.model.attention=local --config.model.window=8

(`model.attention` takes any of the 12 self-attentions of listops, with the same keys:
window, proj_len, compression, block_size, num_features, num_hashes.)

Expected: eval/mse ≈ 0.002 (the constant 1 scores 0.167), eval/accuracy ≈ 0.67, in about
40 s on a 2-core CPU (2000 steps of batch 64). A vanilla RNN (model=rnn) stays at 0.16.

The sweep, the adding problem at T = 10, 50, 100 for each model (run it on the default
config: variant arguments change the base of every point):

  python launch.py --config experiments/sequence_tasks.py --sweep --workdir runs/seq_sweep

took 92 minutes on a 2-core CPU with `--workers 2` (one core each; each point 4-1870 s, the
selective recurrences most: Mamba, 16 states per channel, 31 minutes at T = 100). LRU, S5
and the selective kinds (mamba, mamba2, gla, deltanet) take the transformer's blocks, 2 of
3000 steps. Measured eval/mse (eval/accuracy), 2026-11-30:

  T     rnn            lstm           gru            transformer (300 steps)
  10    0.0024 (0.60)  0.0000 (1.00)  0.0000 (1.00)  0.0001 (1.00)
  50    0.16   (0.08)  0.0004 (0.97)  0.0000 (1.00)  0.0002 (0.98)
  100   0.16   (0.07)  0.0013 (0.78)  0.0001 (1.00)  0.0005 (0.91)

  T     lru            s5             mamba          mamba2         gla            deltanet
  10    0.0000 (1.00)  0.0000 (1.00)  0.0000 (1.00)  0.0000 (1.00)  0.0000 (1.00)  0.0000 (1.00)
  50    0.0001 (1.00)  0.0000 (1.00)  0.0001 (1.00)  0.0000 (1.00)  0.0000 (1.00)  0.0000 (1.00)
  100   0.16   (0.07)  0.0000 (1.00)  0.0000 (1.00)  0.0001 (1.00)  0.0000 (1.00)  0.0001 (1.00)

The RNN learns T = 10 but not 50 (its gradient through T tanh steps vanishes); the gated
cells, attention, S5 and the selective recurrences learn every T, the LSTM (with PyTorch's
initialisation) more slowly than the GRU. The LRU stayed on the constant answer's plateau
at T = 100 in this sweep: with seeds 1 and 2 it leaves it (0.010 and 0.0002; seed 0's
initialisation does not within 3 000 steps: docs/results/sequence_tasks.md).

The other tasks at their default T = 10: eval/accuracy[/eval/exact_match], wall time:

             rnn             lstm            gru             transformer
  copy       0.89/0.48  8 s  0.12/0.00 16 s  0.99/0.93 12 s  1.00/1.00 11 s
  reverse    0.68/0.04 11 s  0.62/0.01 19 s  0.99/0.93 16 s  1.00/1.00 16 s
  recall     0.13      20 s  0.82      38 s  0.80      29 s  0.44      83 s

(K = 8 symbols for copy, K = 4 pairs for recall, chance 1/8.) On recall the transformer
sits on a plateau where it answers with one of the K values present (≈ 0.4; the row above
is the earlier 4 000-step recipe), leaves it near step 5 000 and reaches 0.99 at step
20 000 of its recipe's 40 000 (docs/results/sequence_tasks.md#associative-recall).

The linear recurrences take the transformer's blocks (`--config.model.kind=lru` or `s5`,
`model.recurrence.lru.*` / `s5.*` their options, `model.causal=True` the forward state
alone). On the adding problem they wait on the constant answer's plateau longer than the
gated cells (at T = 100 the LRU leaves it between steps 500 and 1000 of its 3000), the longer
the more T grows: at T = 1000 a causal 2-block LRU (ring [0.999, 0.99999], phases below
0.001, batch 32, peak rate 3e-3) had not left it after 7 000 steps at width 32, nor after
10 000 at width 64 on 2 cores. On one H200 shared by 12 runs, with batch 256 and a
12 000-step schedule, the bidirectional blocks with the layers' own initialisation leave it
after 4 000-5 000 steps: S5 then reaches eval/mse 0.00005 (1.00), the LRU was at 0.0625 and
descending at step 11 644 when the run was stopped; the tanh RNN stays at 0.165. What slows
the LRU is, it seems, its phases: at T = 100, --config.model.recurrence.lru.max_phase=0.314
(phases in [0, π/10)) takes eval/mse to 0.0011 by step 1 500 and 0.0002 at 3 000, against
0.065 and 0.0007 with the default [0, 2π). All of these are exploratory runs (stopped, or
sharing a device): results/exploratory/adding_1000/ and adding_100_phase/.

Variant arguments (comma-separated key=value):
  task    copy | reverse | adding | recall                 (default adding)
  model   rnn | lstm | gru | transformer | lru | s5 | linear_cell | mamba | mamba2 | gla |
          deltanet                                          (default lstm)
  length  T, a positive int                                (default: the task's, below)
"""

import ml_collections

from research.models.recurrent_mixer import LINEAR_RECURRENT, recurrence_defaults
from research.training.config import ConfigError, base_config, parse_variants

# Per task: the default distance T, the items K (symbols to copy, key-value pairs; unused
# by the adding problem) and the depth (recall needs two transformer blocks: one to bind
# each key to its value, one to match the query).
TASKS = {
    "copy": dict(length=10, num_items=8, num_layers=1),
    "reverse": dict(length=10, num_items=8, num_layers=1),
    "adding": dict(length=100, num_items=8, num_layers=1),
    "recall": dict(length=10, num_items=4, num_layers=2),
}
# (Steps, peak learning rate) per task and model: on a CPU a transformer step costs several
# recurrent steps and attention needs far fewer of them, except on recall, where it waits
# through a plateau (one answer per sequence to learn from: 20 000 steps to 0.99) and needs
# a lower rate.
TRAIN = {
    "copy": dict(rnn=(2000, 1e-2), lstm=(2000, 1e-2), gru=(2000, 1e-2),
                 transformer=(300, 1e-2)),
    "reverse": dict(rnn=(2000, 1e-2), lstm=(2000, 1e-2), gru=(2000, 1e-2),
                    transformer=(300, 1e-2)),
    "adding": dict(rnn=(2000, 1e-2), lstm=(2000, 1e-2), gru=(2000, 1e-2),
                   transformer=(300, 1e-2)),
    "recall": dict(rnn=(4000, 1e-2), lstm=(4000, 1e-2), gru=(4000, 1e-2),
                   transformer=(40000, 3e-3)),
}
# The linear recurrences (LRU, S5 in the transformer's blocks) share one recipe on every
# task, and take two blocks at least: a block is linear in its inputs up to the MLP after
# the recurrence, so a sum of products (the adding problem's) needs one block's MLP to
# form the products before the next block's recurrence sums them.
LINEAR_RECURRENT_TRAIN = (3000, 3e-3)
LINEAR_RECURRENT_MIN_LAYERS = 2
# model.state_size where a kind's differs from the config's 64: Mamba's states per channel,
# the paper's N = 16 (with 64, a step at T = 100 took about 1.3 s on 2 cores)
STATE_SIZE = {"mamba": 16}
for recipes in TRAIN.values():
  recipes.update(dict.fromkeys(LINEAR_RECURRENT, LINEAR_RECURRENT_TRAIN))
VARIANTS = {"task": "adding", "model": "lstm", "length": ""}
SWEEP_LENGTHS = (10, 50, 100)
SWEEP_MODELS = ("rnn", "lstm", "gru", "transformer", "lru", "s5", "mamba", "mamba2", "gla",
                "deltanet")   # (linear_cell: not swept)


def parse_variant(arg: str | None) -> dict:
  """'task=copy,model=gru,length=50' -> {'task': 'copy', 'model': 'gru', 'length': 50}."""
  chosen = parse_variants(arg, VARIANTS, {"task": tuple(TASKS), "model": tuple(TRAIN["adding"])})
  length = chosen["length"] or str(TASKS[chosen["task"]]["length"])
  if not length.isdigit() or int(length) < 1:
    raise ConfigError(f"variant length={length!r} must be a positive int")
  return {**chosen, "length": int(length)}


def layers(task: str, model: str) -> int:
  """The depth of `model` on `task`: the task's, two blocks at least for LRU and S5."""
  depth = TASKS[task]["num_layers"]
  return max(depth, LINEAR_RECURRENT_MIN_LAYERS) if model in LINEAR_RECURRENT else depth


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variant(arg)
  task = TASKS[variant["task"]]
  config = base_config()
  config.experiment = "sequence_tasks"
  config.train.num_steps, config.train.learning_rate = TRAIN[variant["task"]][variant["model"]]
  config.train.batch_size = 64
  config.train.warmup_steps = 100
  config.train.log_every = 100
  config.train.eval_every = 500
  config.train.checkpoint_every = 1000

  config.data = ml_collections.ConfigDict()
  config.data.task = variant["task"]      # copy | reverse | adding | recall
  config.data.length = variant["length"]  # T: blanks between the items and the answer (adding: all)
  config.data.num_symbols = 8             # n: alphabet of copy / reverse; keys and values of recall
  config.data.num_items = task["num_items"]  # K: symbols to copy, key-value pairs to recall
  config.data.eval_examples = 1000        # fixed evaluation examples

  config.model = ml_collections.ConfigDict()   # SequenceModel's fields (the stack's keys:
                                               # research/experiments/stack_config.py)
  config.model.kind = variant["model"]    # rnn | lstm | gru | transformer, or a linear recurrence
  config.model.hidden_size = 64           # recurrent state / blocks' features
  config.model.num_layers = layers(variant["task"], variant["model"])  # recurrent layers / blocks
  config.model.num_heads = 4              # attention heads
  config.model.mlp_size = 256             # the MLP's hidden width
  config.model.attention = "full"         # one of research.models.SELF_ATTENTIONS (causal:
                                          # CAUSAL_ATTENTIONS)
  config.model.window = 8                 # local / longformer half-width
  config.model.proj_len = 32              # linformer's projected length k
  config.model.compression = 4            # memory_compressed's stride c
  config.model.block_size = 16            # sparse / bigbird / sinkhorn block, reformer's chunk
  config.model.num_features = 64          # performer's random features per head
  config.model.num_hashes = 2             # reformer's hash rounds
  config.model.state_size = STATE_SIZE.get(variant["model"], 64)   # lru | s5: complex states per
                                          # block; the selective kinds': the stack's (stack_config)
  config.model.recurrence = ml_collections.ConfigDict(recurrence_defaults())  # lru.r_min, s5.dt_min, …
  config.model.causal = False             # blocks: position i reads positions <= i only
  config.model.positions = "sinusoidal"   # blocks: sinusoidal | learned | none
  config.model.mixer_gate = "none"        # blocks: none | glu | half_glu after the mixer
  config.model.dropout_rate = 0.0         # between recurrent layers; the blocks' embeddings,
                                          # branches and MLP hidden units
  config.model.implementation = "auto"    # research.attention implementation: auto | dense | chunked | banded | cudnn | pallas_gpu | pallas_tpu
  config.model.dtype = "float32"          # dtype of matrix products: float32 | bfloat16 | float16
  config.model.remat = "none"             # blocks (recurrent: layers) recomputed in the
                                          # backward pass: none | block | dots_saveable |
                                          # dots_with_no_batch_dims_saveable
  return config


def get_sweep() -> list[dict]:
  """Each model at each T (10 × 3 runs) of the default config's task, the adding problem,
  with the model's recipe (steps, peak rate), depth and (Mamba) state size."""
  return [{"model.kind": kind, "data.length": length, "model.num_layers": layers("adding", kind),
           "train.num_steps": TRAIN["adding"][kind][0],
           "train.learning_rate": TRAIN["adding"][kind][1],
           **({"model.state_size": STATE_SIZE[kind]} if kind in STATE_SIZE else {})}
          for kind in SWEEP_MODELS for length in SWEEP_LENGTHS]
