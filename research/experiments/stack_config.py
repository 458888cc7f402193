"""The config.model keys of a stack of blocks (research/models/block_stack.py's StackFields),
checked alike by every experiment whose model is made of them (sequence_tasks, char_lm,
listops, lra, mqar): each key means the same in all of them (`check_stack_keys`), and the
sizes are bounded by what the model can use and by memory (`check_stack_sizes`).
"""

import ml_collections

from research.attention import implementation_names
from research.attention.reformer import check_lsh_sizes
from research.errors import ConfigError
from research.models.block_stack import POSITIONS
from research.models.recurrent_mixer import (
  LINEAR_RECURRENT,
  SELECTIVE,
  check_recurrence,
  linear_recurrence,
  recurrence_defaults,
  recurrence_parameters,
)
from research.models.remat import REMAT
from research.models.self_attention import SELF_ATTENTIONS, check_attention
from research.models.transformer_block import MIXER_GATES
from research.training.config import (
  COMPUTE_DTYPES,
  check_choice,
  check_divides,
  check_host_memory,
  check_int,
  check_positive,
  check_rate,
  check_with,
)

POSITION_KEYS = {"local": "window", "longformer": "window", "sparse": "block_size",
                 "bigbird": "block_size", "sinkhorn": "block_size", "reformer": "block_size",
                 "linformer": "proj_len", "memory_compressed": "compression"}
SIZES = ("model.hidden_size", "model.num_layers", "model.num_heads", "model.mlp_size",
         "model.window", "model.proj_len", "model.compression", "model.block_size",
         "model.num_features", "model.num_hashes", "model.state_size")


def check_stack_keys(config, *, causal: bool) -> None:
  """ConfigError naming the first bad key of the stack's (a causal model: `causal`). Each key
  means the same in every experiment:

    hidden_size, num_layers, num_heads   the blocks' width F, depth and attention heads
    mlp_size                             the MLP's hidden width (absolute, not a ratio; 0: none)
    attention                            one of SELF_ATTENTIONS (CAUSAL_ATTENTIONS for a
                                         causal model: char_lm has no proj_len and
                                         compression), kind "transformer"
    window                               local / longformer half-width
    proj_len, compression                linformer's k, memory_compressed's stride c
    block_size                           sparse / bigbird / sinkhorn block, reformer's chunk
    num_features, num_hashes             performer's features per head, reformer's rounds
    state_size, recurrence               kinds "lru" / "s5": states per block; "mamba" /
                                         "mamba2": per channel / head; "linear_cell", "gla",
                                         "deltanet": each head's size; the layers' options
    mixer_gate                           none | glu | half_glu after each mixer
                                         (transformer_block.py)
    dropout_rate                         embeddings, both branches, the MLP's hidden units
    implementation, dtype                research.attention implementation, products' dtype
    remat                                blocks (recurrent kinds: layers) recomputed in the
                                         backward pass: one of research/models/remat.py's REMAT
  """
  m = config.model
  check_choice(config, "model.attention", SELF_ATTENTIONS)
  check_choice(config, "model.implementation", implementation_names())
  check_choice(config, "model.dtype", COMPUTE_DTYPES)
  if "remat" in m:        # absent from the config.json of a run before it: "none"
    check_choice(config, "model.remat", REMAT)
  if "positions" in m:    # absent from sequence_tasks' config.json before it: "sinusoidal"
    check_choice(config, "model.positions", POSITIONS)
  if "mixer_gate" in m:   # absent from a config.json before it: "none"
    check_choice(config, "model.mixer_gate", MIXER_GATES)
  sizes = [key for key in SIZES if key.split(".")[1] in m]   # char_lm: no linformer keys
  check_positive(config, *(key for key in sizes if key != "model.mlp_size"))
  check_positive(config, "model.mlp_size", allow_zero=True)   # 0: no MLP
  check_int(config, *sizes)
  check_rate(config, "model.dropout_rate")
  check_with(config, "model.recurrence",
             lambda options: check_recurrence(options, m.state_size, m.kind))
  if m.kind == "linear_cell":                                # heads of state_size
    check_divides(config, "model.state_size", "model.hidden_size")
  if m.kind in SELECTIVE:        # heads that divide the width (GLA, DeltaNet, Mamba-2)
    layer = linear_recurrence(m.kind, m.state_size, m.recurrence)
    check_with(config, "model.hidden_size", layer.check_width)
  if m.kind == "transformer":
    check_divides(config, "model.num_heads", "model.hidden_size")
    check_with(config, "model.attention",
               lambda name: check_attention(name, window=m.window, causal=causal))


def check_stack_sizes(config, length: int, length_keys: str) -> None:
  """ConfigError naming the first size of config.model that a model whose inputs have up
  to `length` positions cannot use; `length_keys` says what sets that length, e.g.
  "config.data.max_length=255 and the CLS token".

  Sizes are bounded by what the model can use and by memory, once the inputs' length is
  known: a size counted in positions (POSITION_KEYS: the window, a block, Linformer's k, the
  compression stride) at most the longest input, which a larger one could only pad
  (Sinkhorn's blocks padded a 256-token input to 2³¹ positions); Reformer's sort keys within
  int32; S5's HiPPO-N initialisation (a NumPy eigendecomposition of an (N/J) × (N/J) matrix)
  within the host's memory; the parameters (`parameter_count`, a recurrence's with its state
  size) within it too, as each experiment checks; and the compiled step within the device's
  memory, as the compiler reports it (performer's num_features, say:
  research/training/compile.py).
  """
  m = config.model
  if m.kind == "transformer":
    key = POSITION_KEYS.get(m.attention)
    if key is not None and m[key] > length:
      raise ConfigError(f"config.model.{key}={m[key]} must be at most the longest input, "
                        f"{length} positions ({length_keys}), with config.model.attention="
                        f"{m.attention!r}: 1 … {length}")
    if m.attention == "reformer":
      check_with(config, "model.num_hashes",
                 lambda rounds: check_lsh_sizes(length, m.block_size, rounds))
  if m.kind == "s5":
    layer = linear_recurrence("s5", m.state_size, m.recurrence)
    block = m.state_size // layer.blocks
    check_host_memory(config, ("model.state_size", "model.recurrence.s5.blocks"),
                      layer.init_host_bytes(), f"S5's HiPPO-N initialisation (a NumPy "
                      f"eigendecomposition of a {block} × {block} matrix)")


def parameter_keys(config, *length_keys: str) -> tuple[str, ...]:
  """The keys that size the stack's parameters (`parameter_count`), with those of the
  experiment that set the inputs' length."""
  m = config.model
  extra = ("model.state_size",) if m.kind in LINEAR_RECURRENT else {
      "linformer": ("model.proj_len",), "memory_compressed": ("model.compression",)}.get(
          m.attention, ())
  return ("model.num_layers", "model.hidden_size", "model.mlp_size", *extra, *length_keys)


def parameter_count(config, max_length: int) -> int:
  """About how many parameters the stack of config.model has for inputs up to max_length:
  per block the mixer's, the attention's 4 F² (with linformer's projections
  2 max_length·proj_len or memory_compressed's convolutions 2 compression·F²) or a linear
  recurrence's (`recurrence_parameters`: about 6 F per state), and the MLP's
  2 F·mlp_size; positions (learned, and a CLS vector) (max_length + 1)·F."""
  m = config.model
  if m.kind in LINEAR_RECURRENT:
    mixer = recurrence_parameters(m.kind, m.state_size, m.hidden_size, m.recurrence)
  else:
    mixer = 4 * m.hidden_size**2 + (
        2 * max_length * m.proj_len if m.attention == "linformer" else
        2 * m.compression * m.hidden_size**2 if m.attention == "memory_compressed" else 0)
  per_layer = mixer + 2 * m.hidden_size * m.mlp_size
  return m.num_layers * per_layer + (max_length + 1) * m.hidden_size


def classifier_model_config(kind: str, attention: str, *, positions: str,
                            norm: str) -> ml_collections.ConfigDict:
  """config.model of a classifier made of the stack (EncoderClassifier, DualEncoderClassifier:
  listops, lra): every key, the sizes 0 for the experiment's preset to set."""
  model = ml_collections.ConfigDict()
  model.kind = kind                      # transformer | lru | s5 (a linear recurrence per block)
  model.attention = attention            # one of SELF_ATTENTIONS
  model.num_layers = 0
  model.hidden_size = 0
  model.num_heads = 0
  model.mlp_size = 0                     # the MLP's hidden width (Retrieval's head's too)
  model.window = 0                       # local / longformer half-width
  model.proj_len = 0                     # linformer's projected length k
  model.compression = 4                  # memory_compressed's stride c
  model.block_size = 0                   # sparse / bigbird / sinkhorn block, reformer's chunk
  model.num_features = 256               # performer's random features per head
  model.num_hashes = 2                   # reformer's hash rounds
  model.state_size = 64                  # lru / s5: complex states N per block
  model.recurrence = ml_collections.ConfigDict(recurrence_defaults())  # lru.r_min, s5.dt_min, …
  model.positions = positions            # learned | sinusoidal
  model.norm = norm                      # pre | post (the original Transformer's)
  model.mixer_gate = "none"              # none | glu | half_glu after each mixer
  model.pooling = "cls"                  # cls | mean
  model.dropout_rate = 0.0               # embeddings, both branches, the MLP's hidden units
  model.implementation = "auto"          # auto | dense | chunked | banded | cudnn | pallas_gpu | pallas_tpu
  model.dtype = "float32"                # dtype of matrix products: float32 | bfloat16 | float16
  model.remat = "none"                   # blocks recomputed in the backward pass: none | block |
                                         # dots_saveable | dots_with_no_batch_dims_saveable
  return model
