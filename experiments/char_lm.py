"""char_lm: a byte-level language model of the Python standard library's own source files.

  python launch.py --config experiments/char_lm.py --workdir runs/char_lm

The corpus is the running interpreter's library (sysconfig's "stdlib": every .py file but
site-packages and build-generated ones, test packages included; see
research/data/python_corpus.py), split 90 / 5 / 5 by a hash of each file's path; its
manifest (Python version, each split's files, bytes, digests) is printed and written as
corpus_manifest.json. Training windows are 128 random bytes; the report scores every byte
of the whole test split, files read whole with the recurrent state carried through them
(research/experiments/char_lm.py), next to zlib -9 and xz -9e of the same bytes, and writes
samples.txt (4 continuations of "def ", temperature 0.8).

Expected (CPython 3.11.7, test split of 95 files, 1 843 688 bytes), the default GRU
(1 layer of 256, 0.33M parameters, 3000 steps of batch 32 × 128 bytes = 12 MB read):

  test/bits_per_byte 1.693, test/zlib_bits_per_byte 1.703, test/xz_bits_per_byte 1.377
  (eval/bits_per_byte on 256 validation windows, from a cold start each: 1.759)

in 5 min 4 s on a 2-core CPU otherwise idle (10.7 steps/s: training 4 min 41 s, the test
split 16 s, start-up, validation and samples the rest). The goal was at most 2.0 bits per
byte within 10 minutes of training; eval/bits_per_byte is 1.93 at step 1000 (1.6 minutes).

The variants, each alone on the same machine (training steps; test bits per byte; steps/s;
wall time of the whole run):

  python launch.py --config experiments/char_lm.py:model=lstm --workdir runs/char_lm_lstm
  python launch.py --config experiments/char_lm.py:model=transformer --workdir runs/char_lm_tf
  python launch.py --config experiments/char_lm.py:model=lru --workdir runs/char_lm_lru

  gru (default)   3000 steps   1.693   10.7   5 min 4 s
  lstm            3000 steps   1.743    8.8   6 min 10 s
  transformer     2000 steps   1.906    5.5   7 min 9 s
  lru             2000 steps   1.899    8.9   4 min 27 s
  s5              2000 steps   2.225    9.2   4 min 23 s

(lru and s5: the transformer's blocks and budget, a causal linear recurrence of 64 complex
states in attention's place; measured in the notebook's run, which shared the CPU with
nothing but the notebook.) The selective recurrences, in the same blocks with the same
budget, from the latest execution of the notebook (CPython 3.11.7; the GRU 1.701 there):

  mamba           2000 steps   1.801    1.4   27.6 min
  mamba2          2000 steps   1.766    2.5   15.2 min
  gla             2000 steps   2.039    3.6   11.1 min
  deltanet        2000 steps   1.872    2.9   12.7 min

(two runs at a time on 2 cores, so steps/s and minutes are not a run's alone;
docs/results/char_lm.md).

Other Python versions read other libraries (the manifest says which): the compressor rows
are computed in the same run on the same bytes, so compare against them. On a CPU the
recurrent models win: per byte, a step of the 2-block transformer (width 128) costs about
twice the GRU's, and it reads the test split in overlapping windows (stride 64).
config.data.test_bytes > 0 scores only the test split's first bytes (a random sample of
files; the compressors then see exactly those bytes).

The transformer's causal self-attention is config.model.attention, "full" by default or
any of research.models.CAUSAL_ATTENTIONS (the self-attentions of listops but linformer and
memory_compressed, which mix later bytes in), with listops' keys (window, block_size,
num_features, num_hashes), e.g. --config.model.attention=local for a window of
config.model.window bytes before each byte.

Variant arguments (comma-separated key=value):
  model   lstm | gru | transformer | lru | s5 | linear_cell | mamba | mamba2 | gla |
          deltanet                                  (default gru)
"""

import ml_collections

from research.models.recurrent_mixer import LINEAR_RECURRENT, recurrence_defaults
from research.training.config import base_config, parse_variants

# Per model: its config.model fields, and (steps, peak learning rate), chosen so that each
# trains for 4½–6 minutes on a 2-core CPU (batch 32 of 128-byte windows).
MODELS = {
    "lstm": dict(hidden_size=256, num_layers=1, embed_size=64),
    "gru": dict(hidden_size=256, num_layers=1, embed_size=64),
    "transformer": dict(hidden_size=128, num_layers=2, num_heads=4, mlp_size=512),
}
TRAIN = {"lstm": (3000, 5e-3), "gru": (3000, 5e-3), "transformer": (2000, 2e-3)}
# The linear recurrences take the transformer's blocks (width, depth, MLP) and its training
# budget, a causal recurrence in attention's place with the layer's own state size: the LRU
# and S5 64 complex states, Mamba the paper's 16 per channel, the headed ones heads of 64.
for kind, layer in LINEAR_RECURRENT.items():
  MODELS[kind] = {**MODELS["transformer"], "state_size": layer.state_size}
  TRAIN[kind] = TRAIN["transformer"]
VARIANTS = {"model": "gru"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = parse_variants(arg, VARIANTS, {"model": tuple(MODELS)})
  config = base_config()
  config.experiment = "char_lm"
  config.train.num_steps, config.train.learning_rate = TRAIN[variant["model"]]
  config.train.batch_size = 32
  config.train.warmup_steps = 100
  config.train.log_every = 50
  config.train.eval_every = 500
  config.train.checkpoint_every = 500

  config.data = ml_collections.ConfigDict()
  config.data.stdlib = ""                 # the library directory; "": this interpreter's
  config.data.include_tests = True        # keep its test packages (test/, tests/, idle_test/)
  config.data.context = 128               # bytes per training window (+ 1 target)
  config.data.eval_windows = 256          # validation windows of the periodic evaluation
  config.data.test_bytes = 0              # 0: the whole test split; n: its first n bytes
  config.data.test_lanes = 12             # test files are read in this many parallel lanes
  config.data.test_chunk = 1024           # recurrent: bytes per call, the state carried over
  config.data.test_stride = 0             # transformer: bytes scored per window (0: context/2)

  config.model = ml_collections.ConfigDict()   # LanguageModel's fields (the stack's keys:
                                               # research/experiments/stack_config.py)
  config.model.kind = variant["model"]    # lstm | gru | transformer | a linear recurrence
  config.model.hidden_size = 256          # recurrent state / blocks' features
  config.model.num_layers = 1             # recurrent layers / blocks
  config.model.embed_size = 64            # recurrent: byte embedding size
  config.model.num_heads = 4              # attention heads
  config.model.mlp_size = 1024            # the MLP's hidden width
  config.model.attention = "full"         # causal self-attention: one of
                                          # research.models.CAUSAL_ATTENTIONS
  config.model.window = 64                # local / longformer half-width (bytes before)
  config.model.block_size = 32            # sparse / bigbird / sinkhorn block, reformer's chunk
  config.model.num_features = 64          # performer's random features per head
  config.model.num_hashes = 2             # reformer's hash rounds
  config.model.state_size = 64            # a linear recurrence's states (per channel, head) or
                                          # heads' size: see docs/running.md
  config.model.recurrence = ml_collections.ConfigDict(recurrence_defaults())  # lru.r_min, s5.dt_min, …
  config.model.implementation = "auto"    # research.attention implementation: auto | dense | chunked | banded | cudnn | pallas_gpu | pallas_tpu
  config.model.dropout_rate = 0.0         # between recurrent layers; the blocks' embeddings,
                                          # branches and MLP hidden units
  config.model.dtype = "float32"          # dtype of matrix products: float32 | bfloat16 | float16
  config.model.remat = "none"             # blocks (recurrent: layers) recomputed in the
                                          # backward pass: none | block | dots_saveable |
                                          # dots_with_no_batch_dims_saveable
  config.model.update(MODELS[variant["model"]])

  config.sample = ml_collections.ConfigDict()
  config.sample.prompt = "def "           # read as the start of a file
  config.sample.num_samples = 4
  config.sample.length = 400              # bytes drawn after the prompt
  config.sample.temperature = 0.8         # 0: the most likely byte
  config.sample.top_k = 0                 # 0: every byte
  return config
