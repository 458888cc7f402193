"""listops: Long Range Arena's ListOps (Tay et al., ICLR 2021) with every attention variant.

  python launch.py --config experiments/listops.py:preset=cpu                 # 2 CPU cores
  python launch.py --config experiments/listops.py:preset=cpu,attention=linformer
  python launch.py --config experiments/listops.py:preset=cpu --sweep --workdir runs/listops_cpu
  python launch.py --config experiments/listops.py --sweep --workdir runs/listops_lra   # a GPU
  python launch.py --config experiments/listops.py:preset=s5 --workdir runs/listops_s5  # a GPU

Presets:
  lra   LRA's Transformer-base: its data (trees of length 500–2000, 96 000 / 2 000 /
        2 000), 6 post-norm layers of width 512, 8 heads, MLP 2048, dropout 0.1, learned
        positions, CLS pooling, inputs up to 2000 tokens, batch 32, 5 000 steps of Adam
        (β₂ 0.98, weight decay 0.1) at LRA's rate 0.05 · linear warm-up 1 000 · rsqrt
        decay (a peak of 0.05 / √1000 ≈ 1.6e-3 at step 1 000). Generating the data takes
        about 4 minutes, once. Block-based attentions use blocks of 64. LRA Table 1:
        Transformer 36.37%, Local 15.82%, Sparse Trans. 17.07%, Longformer 35.63%,
        Linformer 35.70%, Reformer 37.27%, Sinkhorn 33.67%, Synthesizer 36.99%, BigBird
        36.05%, Linear Trans. 16.13%, Performer 18.01% test accuracy (the majority class
        is about 17%).
  cpu   the same recipe with shorter trees (length 100–300, 20 000 / 1 000 / 2 000,
        generated in about 90 s, once), inputs up to 255 tokens (with the CLS token 256
        keys, where "auto" still runs dense attention on a CPU, 2× faster there than
        chunked), 2 pre-norm layers of width 64, 2 heads, MLP 128, no dropout, batch 32,
        3 000 steps at a peak of 1e-3 (warm-up 300, rsqrt decay), blocks of 16.
  s5    S5's own recipe (lindermanlab/S5, bin/run_experiments/run_lra_listops.sh) on LRA's
        data: 8 pre-norm blocks of width 128, each a bidirectional S5 of 16 states in 8
        HiPPO-N blocks followed by S5's half-GLU (no MLP), no positions, mean pooling, no
        dropout; batch 50, 40 epochs (76 800 steps), AdamW at 3e-3 with weight decay 0.04
        and the S5 parameters (Λ, the time step) and the norms at 1e-3 without decay, a
        one-epoch warm-up, cosine decay. LayerNorm where S5 uses BatchNorm (the loop carries
        no batch statistics). S5's paper: 62.15% test accuracy. Sized for a GPU.
  lru   the LRU's (minimal-LRU's ListOps command, NicolasZucchet/minimal-LRU: the LRU
        paper's layer in JAX, its run_train.py's defaults with --epochs 40): 4 pre-norm
        blocks of width 256, each a bidirectional LRU of 128 states (|λ| in [0, 1], phases
        in [0, 2π)) followed by the paper's GLU, mean pooling, dropout 0.1; batch 64, 40
        epochs (60 000 steps) at 1e-3 with weight decay 0.05, the LRU's own parameters at
        5e-4, cosine decay; LayerNorm where it uses BatchNorm. The LRU paper: 60.2%.
  (s5 and lru set model.kind: one model each, not a sweep of the attentions.)

Expected (cpu preset, 2-core CPU, data already generated): full attention 36.30% test
accuracy in about 9 minutes (3 000 steps at 6.0 steps/s on one core); the sweep with
`--workers 2`, every attention and the LRU / S5 blocks 33.0–38.6% in 4–15 minutes each, 62
minutes in all (docs/results/listops.md, runs committed in
results/listops_cpu/); in an exploratory sweep (12 runs sharing one H200,
results/exploratory/listops_h200/) LRU / S5 with mean pooling, other rates or rings, and
20 000-step runs stayed at 33–35% test accuracy. Data files are written once to
`<data.dir>/listops*/` (data.dir defaults to ./data) and read back on later runs;
`--config.data.files=DIR` reads your own LRA TSV files instead.

Variant arguments (comma-separated key=value):
  preset     lra | cpu | s5 | lru                                       (default lra)
  attention  full | local | longformer | sparse | bigbird | linformer | memory_compressed |
             linear | performer | synthesizer | sinkhorn | reformer    (default full)
  kind       transformer | lru | s5: the blocks' mixer, self-attention or a bidirectional
             linear recurrence in its place (default transformer)
"""

import ml_collections

from research.experiments.stack_config import classifier_model_config
from research.models.kinds import BLOCK_KINDS
from research.models.self_attention import SELF_ATTENTIONS
from research.training.config import base_config, parse_variants

# LRA's ListOps (96 000 trees of 500-2 000 tokens), as LRA, S5 and the LRU train on it
LRA_DATA = dict(min_tree_length=500, max_tree_length=2000, train_examples=96_000,
                eval_examples=2_000, test_examples=2_000, max_length=2000)
PRESETS = {
    "lra": dict(
        train=dict(num_steps=5000, batch_size=32, learning_rate=0.05 / 1000 ** 0.5,
                   warmup_steps=1000, weight_decay=0.1, eval_every=500),
        data=LRA_DATA,
        model=dict(num_layers=6, hidden_size=512, num_heads=8, mlp_size=2048, norm="post",
                   dropout_rate=0.1, window=128, proj_len=256, block_size=64)),
    "cpu": dict(
        train=dict(num_steps=3000, batch_size=32, learning_rate=1e-3, warmup_steps=300,
                   weight_decay=0.1, eval_every=500),
        data=dict(min_tree_length=100, max_tree_length=300, train_examples=20_000,
                  eval_examples=1_000, test_examples=2_000, max_length=255),
        model=dict(num_layers=2, hidden_size=64, num_heads=2, mlp_size=128, norm="pre",
                   dropout_rate=0.0, window=32, proj_len=64, block_size=16)),
    # S5's bin/run_experiments/run_lra_listops.sh (lindermanlab/S5; its run_train.py's
    # defaults for the rest: pre-norm, dt in [0.001, 0.1], cosine decay after the warm-up)
    "s5": dict(
        train=dict(num_steps=40 * 96_000 // 50, batch_size=50, learning_rate=3e-3,
                   recurrence_learning_rate=1e-3, warmup_steps=96_000 // 50, weight_decay=0.04,
                   schedule="cosine", adam_b2=0.999, eval_every=96_000 // 50),
        data=LRA_DATA,
        model=dict(kind="s5", num_layers=8, hidden_size=128, num_heads=1, mlp_size=0,
                   state_size=16, mixer_gate="half_glu", norm="pre", pooling="mean",
                   positions="none", dropout_rate=0.0, window=128, proj_len=256, block_size=64),
        recurrence=dict(s5=dict(blocks=8))),
    # minimal-LRU's ListOps command (NicolasZucchet/minimal-LRU: `run_train.py --dataset
    # listops-classification --epochs 40`, its defaults): the LRU paper's layer, norm ->
    # LRU -> GELU -> GLU -> skip, its ring r in [0, 1], phases in [0, 2π)
    "lru": dict(
        train=dict(num_steps=40 * 96_000 // 64, batch_size=64, learning_rate=1e-3,
                   recurrence_learning_rate=5e-4, warmup_steps=0, weight_decay=0.05,
                   schedule="cosine", adam_b2=0.999, eval_every=96_000 // 64),
        data=LRA_DATA,
        model=dict(kind="lru", num_layers=4, hidden_size=256, num_heads=1, mlp_size=0,
                   state_size=128, mixer_gate="glu", norm="pre", pooling="mean",
                   positions="none", dropout_rate=0.1, window=128, proj_len=256, block_size=64),
        recurrence=dict(lru=dict(r_min=0.0, r_max=1.0))),
}
VARIANTS = {"preset": "lra", "attention": "full", "kind": "transformer"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variants(arg, VARIANTS, {"preset": tuple(PRESETS),
                                           "attention": SELF_ATTENTIONS, "kind": BLOCK_KINDS})
  preset = PRESETS[variant["preset"]]
  config = base_config()
  config.experiment = "listops"
  config.train.schedule = "rsqrt"
  config.train.adam_b2 = 0.98
  config.train.grad_clip_norm = 0.0      # LRA (and S5, the LRU) do not clip
  config.train.log_every = 100
  config.train.checkpoint_every = 500
  config.train.update(preset["train"])

  config.data = ml_collections.ConfigDict()
  config.data.dir = "data"               # generated splits go to <dir>/listops*/
  config.data.files = ""                 # or a directory with your LRA train/val/test TSVs
  config.data.seed = 0                   # the generator's seed (LRA's files: seed 0 here)
  config.data.brackets = False           # LRA's tokens (False) or with "[MAX" … "]" kept
  config.data.length_buckets = 4         # batches bucketed by length (1: pad all to max)
  config.data.update(preset["data"])

  config.model = classifier_model_config(variant["kind"], variant["attention"],
                                         positions="learned", norm="post")
  config.model.update(preset["model"])
  for kind, options in preset.get("recurrence", {}).items():
    config.model.recurrence[kind].update(options)
  return config


def get_sweep() -> list[dict]:
  """Every attention, then the LRU and S5 in its place, on the config's preset."""
  return [*({"model.attention": attention} for attention in SELF_ATTENTIONS),
          *({"model.kind": kind} for kind in ("lru", "s5"))]
