"""The config.model keys of a stack of blocks (research/models/block_stack.py's StackFields),
checked alike by every experiment whose model is made of them: sequence_tasks, char_lm and
listops. Each key means the same in all three:

  hidden_size, num_layers, num_heads   the blocks' width F, depth and attention heads
  mlp_size                             the MLP's hidden width (absolute, not a ratio)
  attention                            one of SELF_ATTENTIONS (CAUSAL_ATTENTIONS for a
                                       causal model: char_lm has no proj_len and
                                       compression), kind "transformer"
  window                               local / longformer half-width
  proj_len, compression                linformer's k, memory_compressed's stride c
  block_size                           sparse / bigbird / sinkhorn block, reformer's chunk
  num_features, num_hashes             performer's features per head, reformer's rounds
  state_size, recurrence               kinds "lru" / "s5": states per block, the layers'
                                       options
  dropout_rate                         embeddings, both branches, the MLP's hidden units
  implementation, dtype                research.attention implementation, products' dtype
"""

from research.attention import implementation_names
from research.models.recurrent_mixer import check_recurrence
from research.models.self_attention import SELF_ATTENTIONS, check_attention
from research.training.validation import (
  COMPUTE_DTYPES,
  check_choice,
  check_divides,
  check_int,
  check_positive,
  check_rate,
  check_with,
)

SIZES = ("model.hidden_size", "model.num_layers", "model.num_heads", "model.mlp_size",
         "model.window", "model.proj_len", "model.compression", "model.block_size",
         "model.num_features", "model.num_hashes", "model.state_size")


def check_stack_keys(config, *, causal: bool) -> None:
  """ConfigError naming the first bad key of the stack's (a causal model: `causal`)."""
  m = config.model
  check_choice(config, "model.attention", SELF_ATTENTIONS)
  check_choice(config, "model.implementation", implementation_names())
  check_choice(config, "model.dtype", COMPUTE_DTYPES)
  sizes = [key for key in SIZES if key.split(".")[1] in m]   # char_lm: no linformer keys
  check_positive(config, *sizes)
  check_int(config, *sizes)
  check_rate(config, "model.dropout_rate")
  check_with(config, "model.recurrence", lambda options: check_recurrence(options, m.state_size))
  if m.kind == "transformer":
    check_divides(config, "model.num_heads", "model.hidden_size")
    check_with(config, "model.attention",
               lambda name: check_attention(name, window=m.window, causal=causal))


def parameter_keys(config, *length_keys: str) -> tuple[str, ...]:
  """The keys that size the stack's parameters (`parameter_count`), with those of the
  experiment that set the inputs' length."""
  extra = {"linformer": ("model.proj_len",),
           "memory_compressed": ("model.compression",)}.get(config.model.attention, ())
  return ("model.num_layers", "model.hidden_size", "model.mlp_size", *extra, *length_keys)


def parameter_count(config, max_length: int) -> int:
  """About how many parameters the stack of config.model has for inputs up to max_length:
  per block the attention's 4 F² and the MLP's 2 F·mlp_size, with linformer's projections
  2 max_length·proj_len or memory_compressed's convolutions 2 compression·F²; positions
  (learned, and a CLS vector) (max_length + 1)·F."""
  m = config.model
  attention = (2 * max_length * m.proj_len if m.attention == "linformer" else
               2 * m.compression * m.hidden_size**2 if m.attention == "memory_compressed" else 0)
  per_layer = 4 * m.hidden_size**2 + 2 * m.hidden_size * m.mlp_size + attention
  return m.num_layers * per_layer + (max_length + 1) * m.hidden_size
