"""mqar: multi-query associative recall (Arora, Eyuboglu et al., "Zoology", ICLR 2024), every
causal sequence mixer of this repository against the model's width.

  python launch.py --config experiments/mqar.py:preset=cpu                  # full attention
  python launch.py --config experiments/mqar.py:preset=cpu,model=lru,width=128
  python launch.py --config experiments/mqar.py:preset=cpu --sweep --workdir runs/mqar_cpu
  python launch.py --config experiments/mqar.py --sweep --workdir runs/mqar_zoology  # a GPU

Each sequence opens with N key-value pairs and then asks for every key once, at a
power-law gap; the loss and the accuracy count the N queries only (research/data/mqar.py).
Models: two layers of one sequence mixer, pre-norm, learned positions, the output layer
tied to the embedding (Zoology's LanguageModel). The mixers (`model`, MODELS below):

  attention   every causal self-attention of research.models (CAUSAL_ATTENTIONS), one head
  linear      linear attention and Performer (attentions), and the linear-attention cell as
              the blocks' recurrence (kind linear_cell, heads of size 16)
  ssm         the LRU and S5 blocks, N = width states
  selective   Mamba (16 states per channel, the paper's), Mamba-2 (64 states per head of
              64 channels), GLA and DeltaNet (one head of the width, as attention's)
  rnn         a two-layer GRU or LSTM of the width, over an embedding of the width

The attention, linear and selective families' blocks are their mixer alone, as in Zoology's
Figure 2 (its "state mixer" is the identity; Mamba's block is its own); the LRU and S5 blocks keep an MLP of 2 × width, their
only nonlinearity (both papers follow the recurrence with one).

Presets:
  zoology   Figure 2 of the paper (zoology/experiments/paper_configs/iclr24_zoology_figure2):
            a vocabulary of 8 192, (length, pairs) (64, 4), (128, 8), (256, 16), (512, 64),
            widths 64, 128, 256, 512, learning rates logspace(−4, −2, 4) for every model,
            100 000 training and 3 000 test sequences, batch 512 (256 at length 256, 128 at
            512), 64 epochs, AdamW (weight decay 0.01, PyTorch's default), cosine decay, no
            warm-up, dropout 0.1. Zoology stops a run at 99% test accuracy; these run to the
            end. Sized for a GPU: 1 216 points.
  cpu       a 2-core CPU: a vocabulary of 512 (Zoology's 8 192 costs N × 8 192 products per
            feature in the output layer, and its rare tokens slow learning), length 64 with
            8 and with 16 pairs (16 fill every query slot: the gaps' power law only orders
            them), widths 64 and 128 (attention at width 32 stayed below 30% in 1 500 steps),
            batch 64, 1 500 steps (1.2 epochs of 80 000 sequences), warm-up 100 then cosine,
            weight decay 0.1, gradients clipped at norm 1, no dropout, and two learning
            rates per family (1e-3 and 3e-3; the GRU and LSTM 3e-3 and 1e-2); 1 000 test
            sequences. 152 points of 1–8 minutes on one core (about 7 core-hours).

Expected (cpu preset, the sweep; docs/results/mqar.md): full attention and BigBird answer
99.9–100% of the queries at both widths and panels; every linear mixer, the LRU and S5 stay
below 15% (at width 64 and 16 pairs 90–99 points below full attention); of the selective
family DeltaNet answers 100% at both widths and panels, Mamba-2 99.0% with 16 pairs at width
64, Mamba and GLA stay near the linear mixers (14% with 8, 9–10% with 16). For scale, the
base config (full attention, width 64, 8 pairs in 64 tokens) leaves the plateau of answering
one of the values present (about 1/8) near step 600 and ends at 99.9% eval/accuracy, in about
a minute on 2 cores.

Variant arguments (comma-separated key=value):
  preset  cpu | zoology                                         (default zoology)
  model   one of MODELS: full | local | … | linear_cell | lru | s5 | mamba | … | deltanet | gru | lstm
                                                                (default full)
  width   the model's width (default: the preset's smallest)

The sweep reads config.sweep (its models, widths, panels and rates), so that an override
such as --config.sweep.widths=(64,) narrows it.
"""

import ml_collections
import numpy as np

from research.models.recurrent_mixer import SELECTIVE, recurrence_defaults
from research.models.self_attention import CAUSAL_ATTENTIONS
from research.training.config import ConfigError, base_config, parse_variants

FAMILIES = {
    "attention": tuple(name for name in CAUSAL_ATTENTIONS if name not in ("linear", "performer")),
    "linear": ("linear", "performer", "linear_cell"),
    "ssm": ("lru", "s5"),
    "selective": SELECTIVE,                 # mamba, mamba2, gla, deltanet
    "rnn": ("gru", "lstm"),
}
MODELS = tuple(name for family in FAMILIES.values() for name in family)
MLP_RATIO = {"attention": 0, "linear": 0, "ssm": 2, "selective": 0, "rnn": 0}  # MLP: × width
LINEAR_CELL_HEAD = 16     # linear_cell's head size d: its parallel form keeps d × (d + 1) per
                          # head and step (one head of the width: 2 s a step at width 128)
STATE_SIZE = {"mamba": 16, "mamba2": 64, "linear_cell": LINEAR_CELL_HEAD}   # the rest: width
ZOOLOGY_RATES = tuple(float(rate) for rate in np.logspace(-4, -2, 4))
PRESETS = {
    "zoology": dict(
        train=dict(batch_size=512, num_steps=64 * 100_000 // 512, learning_rate=1e-3,
                   warmup_steps=0, weight_decay=0.01, grad_clip_norm=0.0, eval_every=1000),
        data=dict(length=64, num_pairs=4, vocab_size=8192, train_examples=100_000,
                  eval_examples=3_000),
        model=dict(dropout_rate=0.1),
        sweep=dict(widths=(64, 128, 256, 512),
                   # (length, pairs, batch size, steps: 64 epochs of 100 000 sequences)
                   panels=tuple((length, pairs, batch, 64 * 100_000 // batch)
                                for length, pairs, batch in ((64, 4, 512), (128, 8, 512),
                                                             (256, 16, 256), (512, 64, 128))),
                   rates={family: ZOOLOGY_RATES for family in FAMILIES})),
    "cpu": dict(
        train=dict(batch_size=64, num_steps=1500, learning_rate=3e-3, warmup_steps=100,
                   weight_decay=0.1, grad_clip_norm=1.0, eval_every=250),
        data=dict(length=64, num_pairs=8, vocab_size=512, train_examples=80_000,
                  eval_examples=1_000),
        model=dict(dropout_rate=0.0),
        sweep=dict(widths=(64, 128),
                   panels=((64, 8, 64, 1500), (64, 16, 64, 1500)),
                   rates=dict(attention=(1e-3, 3e-3), linear=(1e-3, 3e-3), ssm=(1e-3, 3e-3),
                              selective=(1e-3, 3e-3), rnn=(3e-3, 1e-2)))),
}
VARIANTS = {"preset": "zoology", "model": "full", "width": ""}


def family(model: str) -> str:
  """The family of one of MODELS."""
  return next(name for name, members in FAMILIES.items() if model in members)


def model_keys(model: str, width: int) -> dict:
  """config.model's overrides that make `model` (one of MODELS) of `width`."""
  if model in FAMILIES["rnn"]:
    return {"model.kind": model, "model.hidden_size": width, "model.embed_size": width}
  kind, attention = ("transformer", model) if model in CAUSAL_ATTENTIONS else (model, "full")
  keys = {"model.kind": kind, "model.attention": attention, "model.hidden_size": width,
          "model.mlp_size": MLP_RATIO[family(model)] * width}
  if kind != "transformer":
    keys["model.state_size"] = STATE_SIZE.get(kind, width)
  return keys


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variants(arg, VARIANTS, {"preset": tuple(PRESETS), "model": MODELS})
  preset = PRESETS[variant["preset"]]
  width = variant["width"] or str(preset["sweep"]["widths"][0])
  if not width.isdigit() or int(width) < 1:
    raise ConfigError(f"variant width={width!r} must be a positive int")
  config = base_config()
  config.experiment = "mqar"
  config.train.update(preset["train"])
  config.train.log_every = 50
  config.train.checkpoint_every = 500

  config.data = ml_collections.ConfigDict()
  config.data.length = 0                  # L, tokens per sequence
  config.data.num_pairs = 0               # N, key-value pairs, each queried once
  config.data.vocab_size = 0              # V: keys 1 … V/2 − 1, values V/2 … V − 1
  config.data.power = 0.01                # α of the gaps' power law (1: uniform)
  config.data.random_non_queries = False  # fill with random tokens instead of 0
  config.data.train_examples = 0          # the training set (reshuffled every epoch)
  config.data.eval_examples = 0           # the evaluation set
  config.data.seed = 0                    # the data's seed (the model's: config.seed)
  config.data.update(preset["data"])

  config.model = ml_collections.ConfigDict()   # LanguageModel's fields (the stack's keys:
                                               # research/experiments/stack_config.py)
  config.model.kind = "transformer"       # transformer | lru | s5 | linear_cell | mamba | mamba2
                                          # | gla | deltanet | gru | lstm | rnn
  config.model.attention = "full"         # one of CAUSAL_ATTENTIONS
  config.model.hidden_size = 0            # the width
  config.model.num_layers = 2
  config.model.num_heads = 1
  config.model.mlp_size = 0               # the blocks' MLP (0: none, Zoology's identity)
  config.model.embed_size = 0             # rnn | lstm | gru: the embedding's width
  config.model.tie_embeddings = True      # the output layer is the embedding (Zoology's)
  config.model.positions = "learned"
  config.model.window = 8                 # local / longformer half-width
  config.model.block_size = 16            # sparse / bigbird / sinkhorn block, reformer's chunk
  config.model.num_features = 64          # performer's random features per head
  config.model.num_hashes = 2             # reformer's hash rounds
  config.model.state_size = 64            # lru | s5 | mamba | mamba2: states (per channel,
                                          # head); linear_cell | gla | deltanet: head size
  config.model.recurrence = ml_collections.ConfigDict(recurrence_defaults())
  config.model.dropout_rate = 0.0         # embeddings, branches, MLP hidden units
  config.model.implementation = "auto"    # research.attention implementation
  config.model.dtype = "float32"          # float32 | bfloat16 | float16
  config.model.remat = "none"             # none | block | dots_saveable | …
  config.model.update(preset["model"])
  for key, value in model_keys(variant["model"], int(width)).items():
    config.model[key.split(".")[1]] = value
  if config.model.embed_size == 0:
    config.model.embed_size = config.model.hidden_size

  config.sweep = ml_collections.ConfigDict()
  config.sweep.models = MODELS            # the sweep's models (MODELS' names)
  config.sweep.widths = preset["sweep"]["widths"]
  config.sweep.panels = preset["sweep"]["panels"]   # (length, pairs, batch size, steps)
  config.sweep.rates = ml_collections.ConfigDict(preset["sweep"]["rates"])  # per family
  length, pairs, batch, steps = config.sweep.panels[0]
  config.data.update(length=length, num_pairs=pairs)
  config.train.update(batch_size=batch, num_steps=steps)
  return config


def get_sweep(config) -> list[dict]:
  """Every model of config.sweep.models at each width, (length, pairs) panel and rate of its
  family: panel by panel, width by width, so that a sweep cut short has whole columns."""
  sweep = config.sweep
  unknown = [model for model in sweep.models if model not in MODELS]
  if unknown:
    raise ConfigError(f"config.sweep.models: {unknown} are not models; choose from "
                      f"{', '.join(MODELS)}")
  return [{**model_keys(model, width), "data.length": length, "data.num_pairs": pairs,
           "train.batch_size": batch, "train.num_steps": steps, "train.learning_rate": rate}
          for length, pairs, batch, steps in sweep.panels for width in sweep.widths
          for model in sweep.models for rate in sweep.rates[family(model)]]
