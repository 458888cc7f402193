"""nmt_dates: translate dates written in 24 locales and 8 formats into ISO YYYY-MM-DD.

The default main job (`python3 project.py main`; results in docs/results/nmt_dates.md). Run
it, or a variant, with

  python launch.py                                        # the default config below
  python launch.py --config experiments/nmt_dates.py:attention=none,cell=gru
  python launch.py --config experiments/nmt_dates.py --sweep --workdir runs/nmt_sweep

Default: bidirectional LSTM encoder, Bahdanau decoder with additive attention.
Expected: ≥ 99% exact match on held-out test dates (greedy and beam), in about
2.5 minutes on a 2-core CPU: measured 100% greedy and beam exact match on 2000 test dates,
145 s in all (train-step compile 4.0 s, 1000 steps of batch 128 at 8.3 steps/s). Every
variant side by side (1500 steps each): notebooks/nmt_attention_ablation.ipynb.

Variant arguments (comma-separated key=value):
  attention  none | dot | scaled_dot | general | additive | concat | location
             | local_m | local_p | hard                    (default additive)
  cell       rnn | lstm | gru: model.kind                  (default lstm)
  style      bahdanau | luong                              (default bahdanau)
  input_feeding  true | false    (Luong only; default false)
A user's own parallel corpus: --config.data.corpus=path/to/pairs.tsv [--config.data.level=word]
(pairs with a side longer than --config.data.max_length tokens are skipped, with a count).
"""

import ml_collections

from research.training.config import base_config, parse_variants

VARIANTS = {"attention": "additive", "cell": "lstm", "style": "bahdanau", "input_feeding": "false"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variants(arg, VARIANTS, {"input_feeding": ("true", "false")})
  config = base_config()
  config.experiment = "nmt_dates"
  config.train.num_steps = 1000
  config.train.batch_size = 128
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 100
  config.train.log_every = 50
  config.train.eval_every = 250
  config.train.checkpoint_every = 250

  config.data = ml_collections.ConfigDict()
  config.data.corpus = ""                 # '' = generated dates; else a source<TAB>target file
  config.data.level = "char"              # tokens of a corpus: "char" or "word"
  config.data.locales = "all"             # or a comma-separated subset, e.g. "en,fr,zh"
  config.data.train_examples = 50_000
  config.data.eval_examples = 1_000       # validation split (periodic evaluation)
  config.data.test_examples = 2_000       # test split (final report)
  config.data.max_length = 200            # a corpus's pairs with a longer side are left out

  config.model = ml_collections.ConfigDict()   # research.models.Seq2Seq's fields
  config.model.kind = variant["cell"]     # rnn | lstm | gru: the encoder's and decoder's
  config.model.attention = variant["attention"]   # one of research.models.DECODER_ATTENTIONS
  config.model.style = variant["style"]
  config.model.input_feeding = variant["input_feeding"] == "true"
  config.model.embed_size = 64
  config.model.hidden_size = 128
  config.model.encoder_layers = 1
  config.model.bidirectional = True
  config.model.score = "general"          # inside local_m / local_p / hard
  config.model.window = 5                 # D, the half-width of local_m / local_p
  config.model.hard_training = "gumbel"   # or "reinforce"
  config.model.dropout_rate = 0.0         # on the embeddings, between layers, before the output
  config.model.dtype = "float32"          # dtype of matrix products: float32 | bfloat16 | float16
  config.model.remat = "none"             # encoder layers recomputed in the
                                          # backward pass: none | block | dots_saveable |
                                          # dots_with_no_batch_dims_saveable

  config.decode = ml_collections.ConfigDict()
  config.decode.beam_size = 5
  config.decode.length_penalty = 0.6

  config.report = ml_collections.ConfigDict()
  config.report.num_predictions = 200     # rows of predictions.tsv
  config.report.num_heatmaps = 6          # attention PNGs, one per script first
  return config


def get_sweep() -> list[dict]:
  """No attention vs each score / pattern (Bahdanau), Luong with and without input
  feeding, and the cells."""
  points = [{"model.attention": a} for a in ("none", "additive", "dot", "general", "concat",
                                             "location", "local_m", "local_p", "hard")]
  points += [{"model.style": "luong", "model.attention": "general", "model.input_feeding": f}
             for f in (False, True)]
  points += [{"model.kind": c} for c in ("rnn", "gru")]
  return points
