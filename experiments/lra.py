"""lra: Long Range Arena's Text, Retrieval, Image and Pathfinder tasks (Tay et al., ICLR 2021)
with every attention variant and the LRU / S5 blocks (ListOps: experiments/listops.py).

  python launch.py --config experiments/lra.py:task=pathfinder,preset=cpu        # generated
  python launch.py --config experiments/lra.py:task=pathfinder,preset=cpu,kind=lru
  python launch.py --config experiments/lra.py:task=pathfinder,preset=cpu --sweep \\
      --workdir runs/pathfinder_cpu
  python launch.py --config experiments/lra.py:task=text --config.data.files=PATH/aclImdb
  python launch.py --config experiments/lra.py:task=retrieval \\
      --config.data.files=PATH/lra_release/tsv_data
  python launch.py --config experiments/lra.py:task=image \\
      --config.data.files=PATH/cifar-10-batches-py
  python launch.py --config experiments/lra.py:task=pathfinder,preset=path_x \\
      --config.data.files=PATH/lra_release            # LRA's pathfinder128 folder

Data: Text, Retrieval and Image read the user's copy of IMDB (aclImdb_v1.tar.gz), LRA's AAN
pairs (lra_release.gz: tsv_data/) and CIFAR-10 (cifar-10-python.tar.gz); nothing is
downloaded. Pathfinder reads LRA's released folders (data.files: the folder holding
pathfinder32/ …) or, with data.files='', generates data.examples images once into
<data.dir>/pathfinder-n<examples>-seed<seed>/ in LRA's layout.

Presets (LRA's hyperparameters: lra_benchmarks/*/configs in google-research/long-range-arena):
  lra     text: 4 pre-norm layers of width 256, 4 heads, MLP 1024, dropout 0.1, sinusoidal
          positions, CLS pooling, bytes up to 4 000 (the paper's 4K; LRA's released config
          has 1 000), batch 32, 20 000 steps of Adam (β₂ 0.98, weight decay 0.1) at LRA's
          0.05 · linear warm-up 8 000 · rsqrt decay.
          retrieval: the same recipe at width 128, MLP 512, 4 000 bytes per document, 5 000
          steps (LRA's warm-up of 8 000 steps is never completed: the rate peaks at 5/8 of
          0.05/√8000).
          image: 1 layer of width 32, 1 head, MLP 64, dropout 0.3, learned positions, CLS
          pooling, batch 256, 200 epochs of 45 000 (35 000 steps) at 5e-4 with a warm-up of
          one epoch and cosine decay, no weight decay.
          pathfinder: 32 × 32, LRA's hardest set (contour length 14), 200 000 images split
          160 000 / 20 000 / 20 000; 1 layer of width 128, 4 heads, MLP 128, dropout 0.2,
          sinusoidal positions, mean pooling, batch 512, 200 epochs (62 400 steps) at 1e-3,
          warm-up one epoch, cosine decay, no weight decay.
          Block-based attentions: blocks of 64, windows of 128, Linformer's k 256.
  path_x  pathfinder only: 128 × 128 (16 384 pixels), LRA's pathfinder128 recipe: 1 layer of
          width 32, 2 heads, MLP 32, dropout 0.1, learned positions, mean pooling, batch 64,
          200 epochs (500 000 steps) at 1e-3, gradients clipped at norm 1.
  cpu     2-core CPU recipes: text and retrieval at 1 000 bytes (per document), 2 pre-norm
          layers of width 64, 2 heads, MLP 128, 3 000 steps of batch 32 at 1e-3 (warm-up
          300, cosine decay); image the same; pathfinder at 32 × 32 on 20 000 generated
          images of the easiest set (contour length 6), one layer of width 32 (MLP 64, mean
          pooling), 2 000 steps (full attention over 1 024 pixels: 2.4 steps/s on 2 cores).
          No dropout, blocks of 16, windows of 32, Linformer's k 64.
Pathfinder's lru blocks start on the LRU paper's ring in every preset: |λ| in [0.9, 0.999]
(Path-X: [0.999, 0.9999]) with phases within π/10; Path-X's S5 time steps start at 1e-4.
Our blocks' queries, keys and values have the blocks' width (LRA's pathfinder models use half
of it, qkv_dim = emb_dim / 2), and our heads are one Dense layer (LRA's: an MLP).

Expected: LRA's Table 1 (test accuracy, %; research/experiments/lra.py: LRA_TABLE_1):
Transformer text 64.27, retrieval 57.46, image 42.44, pathfinder 71.40, Path-X fails (50).
The cpu presets: docs/results/lra.md.

Variant arguments (comma-separated key=value):
  task       text | retrieval | image | pathfinder                  (default pathfinder)
  preset     lra | cpu | path_x (pathfinder only)                    (default lra)
  attention  full | local | longformer | sparse | bigbird | linformer | memory_compressed |
             linear | performer | synthesizer | sinkhorn | reformer    (default full)
  kind       transformer | lru | s5: the blocks' mixer, self-attention or a bidirectional
             linear recurrence in its place (default transformer)
"""

import math

import ml_collections

from research.experiments.stack_config import classifier_model_config
from research.models.kinds import BLOCK_KINDS
from research.models.self_attention import SELF_ATTENTIONS
from research.training.config import base_config, parse_variants

TASKS = ("text", "retrieval", "image", "pathfinder")
LRA_BLOCKS = dict(window=128, proj_len=256, block_size=64)
CPU_MODEL = dict(num_layers=2, hidden_size=64, num_heads=2, mlp_size=128, dropout_rate=0.0,
                 window=32, proj_len=64, block_size=16, positions="sinusoidal")
# config.model.recurrence of Pathfinder and Path-X: the LRU paper's ring (|λ| in [0.9, 0.999],
# Path-X [0.999, 0.9999], phases within π/10) and S5's Path-X time steps from 1e-4 (its
# paper's): slow modes for long paths.
PATHFINDER_RECURRENCE = {"lru": dict(r_min=0.9, r_max=0.999, max_phase=math.pi / 10)}
PATH_X_RECURRENCE = {"lru": dict(r_min=0.999, r_max=0.9999, max_phase=math.pi / 10),
                     "s5": dict(dt_min=1e-4)}
CPU_TRAIN = dict(num_steps=3000, batch_size=32, learning_rate=1e-3, warmup_steps=300,
                 weight_decay=0.0, eval_every=500, schedule="cosine")


def _rsqrt_train(num_steps: int) -> dict:
  """LRA's text recipe: Adam at 0.05 · linear warm-up 8 000 · rsqrt decay, batch 32."""
  return dict(num_steps=num_steps, batch_size=32, learning_rate=0.05 / 8000 ** 0.5,
              warmup_steps=8000, schedule="rsqrt", weight_decay=0.1, eval_every=1000)


def _epochs_train(batch_size: int, train_examples: int, learning_rate: float) -> dict:
  """LRA's image recipe: 200 epochs, a warm-up of one, cosine decay, no weight decay."""
  epoch = train_examples // batch_size
  return dict(num_steps=200 * epoch, batch_size=batch_size, learning_rate=learning_rate,
              warmup_steps=epoch, schedule="cosine", weight_decay=0.0, eval_every=10 * epoch)


PRESETS = {   # (task, preset) -> {"train": …, "data": …, "model": …}
    ("text", "lra"): dict(
        train=_rsqrt_train(20_000), data=dict(max_length=4000),
        model=dict(num_layers=4, hidden_size=256, num_heads=4, mlp_size=1024, dropout_rate=0.1,
                   positions="sinusoidal", **LRA_BLOCKS)),
    ("retrieval", "lra"): dict(
        train=_rsqrt_train(5000), data=dict(max_length=4000),
        model=dict(num_layers=4, hidden_size=128, num_heads=4, mlp_size=512, dropout_rate=0.1,
                   positions="sinusoidal", **LRA_BLOCKS)),
    ("image", "lra"): dict(
        train=_epochs_train(256, 45_000, 5e-4), data={},
        model=dict(num_layers=1, hidden_size=32, num_heads=1, mlp_size=64, dropout_rate=0.3,
                   positions="learned", **LRA_BLOCKS)),
    ("pathfinder", "lra"): dict(
        train=_epochs_train(512, 160_000, 1e-3),
        data=dict(resolution=32, difficulty="hard", examples=200_000),
        model=dict(num_layers=1, hidden_size=128, num_heads=4, mlp_size=128, dropout_rate=0.2,
                   positions="sinusoidal", pooling="mean", recurrence=PATHFINDER_RECURRENCE,
                   **LRA_BLOCKS)),
    ("pathfinder", "path_x"): dict(
        train={**_epochs_train(64, 160_000, 1e-3), "grad_clip_norm": 1.0},
        data=dict(resolution=128, difficulty="hard", examples=200_000),
        model=dict(num_layers=1, hidden_size=32, num_heads=2, mlp_size=32, dropout_rate=0.1,
                   positions="learned", pooling="mean", recurrence=PATH_X_RECURRENCE,
                   **LRA_BLOCKS)),
    ("text", "cpu"): dict(train=CPU_TRAIN, data=dict(max_length=1000), model=CPU_MODEL),
    ("retrieval", "cpu"): dict(train=CPU_TRAIN, data=dict(max_length=1000), model=CPU_MODEL),
    ("image", "cpu"): dict(train=CPU_TRAIN, data={}, model=CPU_MODEL),
    ("pathfinder", "cpu"): dict(   # LRA's one layer, narrower: full attention ≤ 15 minutes
        train={**CPU_TRAIN, "num_steps": 2000, "warmup_steps": 200},
        data=dict(resolution=32, difficulty="easy", examples=20_000),
        model={**CPU_MODEL, "num_layers": 1, "hidden_size": 32, "mlp_size": 64,
               "pooling": "mean", "recurrence": PATHFINDER_RECURRENCE}),
}
VARIANTS = {"task": "pathfinder", "preset": "lra", "attention": "full", "kind": "transformer"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variants(arg, VARIANTS, {
      "task": TASKS, "preset": ("lra", "cpu", "path_x"), "attention": SELF_ATTENTIONS,
      "kind": BLOCK_KINDS})
  task = variant["task"]
  if (task, variant["preset"]) not in PRESETS:
    raise ValueError(f"preset={variant['preset']!r} is Pathfinder's (Path-X) alone; the "
                     f"{task} task's presets: lra, cpu")
  preset = PRESETS[task, variant["preset"]]
  config = base_config()
  config.experiment = "lra"
  config.train.adam_b2 = 0.98
  config.train.grad_clip_norm = 0.0      # LRA does not clip (but on Path-X)
  config.train.update(preset["train"])
  config.train.log_every = 100
  config.train.checkpoint_every = 1000

  config.data = ml_collections.ConfigDict()
  config.data.task = task                # text | retrieval | image | pathfinder
  config.data.files = ""                 # the folder holding the task's files (see above)
  if task in ("text", "retrieval"):
    config.data.max_length = 0           # bytes kept per document
    config.data.length_buckets = 4       # batches bucketed by length (1: pad all to max)
  if task == "pathfinder":
    config.data.dir = "data"             # generated images go to <dir>/pathfinder-…/
    config.data.resolution = 0           # 32 | 64 | 128 (Path-X) | 256
    config.data.difficulty = ""          # easy | intermediate | hard (contour length 6, 9, 14)
    config.data.examples = 0             # images generated (split 80 / 10 / 10 %, as LRA's)
    config.data.seed = 0                 # the generator's seed
  config.data.update(preset["data"])

  config.model = classifier_model_config(variant["kind"], variant["attention"],
                                         positions="sinusoidal", norm="pre")
  config.model.update(preset["model"])
  return config


def get_sweep() -> list[dict]:
  """Every attention, then the linear recurrences in its place, on the config's task and
  preset."""
  return [*({"model.attention": attention} for attention in SELF_ATTENTIONS),
          *({"model.kind": kind} for kind in ("lru", "s5"))]
