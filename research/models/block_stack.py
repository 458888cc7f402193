"""The stack of blocks that SequenceModel, LanguageModel and EncoderClassifier are made of:
its fields declared once (`StackFields`, which the three models inherit, so that
model.hidden_size, model.mlp_size, model.attention, … mean the same in every experiment)
and one assembly of it (`BlockStack`, the models' submodule "stack").
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.errors import check_choice
from research.models.kinds import BLOCK_KINDS
from research.models.positions import sinusoidal_positions
from research.models.recurrent_mixer import block_mixer
from research.models.remat import remat
from research.models.self_attention import SELF_ATTENTIONS, check_attention, self_attention
from research.models.transformer_block import MIXER_GATES, NORMS, TransformerBlock

Array = jax.Array
POSITIONS = ("learned", "sinusoidal", "none")
MLP_RATIO = 4                       # mlp_size None: MLP_RATIO · hidden_size (Vaswani et al.)


class StackFields(nn.Module, kw_only=True):
  """The fields of a stack of blocks (`BlockStack`), keyword-only.

  A model made of blocks inherits them and passes `stack_fields()` to its BlockStack;
  they are its config.model keys. The recurrent kinds (rnn, lstm, gru) read hidden_size,
  num_layers and dropout_rate too.
  """
  hidden_size: int                 # F, the blocks' width (recurrent kinds: the state's)
  num_layers: int = 1              # blocks (recurrent kinds: layers)
  num_heads: int = 1               # attention heads, dividing hidden_size
  mlp_size: int | None = None      # the MLP's hidden width (None: MLP_RATIO · hidden_size;
                                   # 0: no MLP, a block is its mixer alone)
  attention: str = "full"          # kind "transformer": one of SELF_ATTENTIONS
  window: int = 0                  # local / longformer half-width (> 0 there)
  proj_len: int = 256              # linformer's projected length k
  compression: int = 4             # memory_compressed's stride c
  block_size: int = 64             # sparse / bigbird / sinkhorn block, reformer's chunk
  num_features: int = 256          # performer's random features per head
  num_hashes: int = 2              # reformer's hash rounds
  max_length: int | None = None    # longest input (learned positions, linformer, synthesizer,
                                   # sinkhorn); the experiment sets it from its data
  state_size: int = 64             # kinds "lru" / "s5": complex states N per block
  recurrence: Any = None           # kinds "lru" / "s5": {kind: {option: value}}
                                   # (recurrent_mixer.OPTIONS; None: the layers' defaults)
  positions: str = "sinusoidal"    # "learned", "sinusoidal" or "none"
  norm: str = "pre"                # "pre" or "post" (the original Transformer's, LRA's)
  mixer_gate: str = "none"         # after each mixer: "none", "glu" (the LRU paper's) or
                                   # "half_glu" (S5's): transformer_block.py
  dropout_rate: float = 0.0        # on the embeddings, both branches, the MLP's hidden units
  implementation: str = "auto"     # research.attention implementation of full / local /
                                   # longformer / sparse / bigbird / memory_compressed
  dtype: Any = "float32"           # dtype of the matrix products ("float32", "bfloat16", "float16")
  remat: str = "none"              # each block (recurrent kinds: layer) recomputed in the
                                   # backward pass: one of remat.REMAT

  def stack_fields(self) -> dict[str, Any]:
    """{field: value} of the fields above (a BlockStack's keyword arguments)."""
    return {field.name: getattr(self, field.name) for field in dataclasses.fields(StackFields)
            if field.name not in ("parent", "name")}

  @nn.nowrap
  def remat_layer(self) -> Callable[[Callable], Callable]:
    """What the recurrent kinds' layer (research.recurrent's RNN / LSTM / GRU) wraps each
    of its layers (and directions) in: `remat` with this model's choice, so that each
    layer's pass is recomputed in the backward pass from its inputs."""
    return functools.partial(remat, value=self.remat)

  def check_names(self) -> None:
    """ValueError naming a field whose name is not one of its allowed values."""
    for name, allowed in (("attention", SELF_ATTENTIONS), ("positions", POSITIONS),
                          ("norm", NORMS), ("mixer_gate", MIXER_GATES)):
      check_choice(name, getattr(self, name), allowed)


class BlockStack(StackFields):
  """inputs [B, L] int or [B, L, D] float, key lengths [B] or None -> [B, L (+ 1), F]:

    inputs: tokens [B, L] int (vocab_size given) or floats [B, L, D] (vocab_size None)
      -> embed: Embed(vocab_size, F) or Dense(F)
      -> cls: a learned vector [F] before position 0 (with `cls`: [B, L + 1, F])
      -> + positions: learned [max_length (+ 1), F], sinusoidal (Vaswani et al.) or none (a
         recurrence knows the order; the LRU and S5 papers add none)
      -> Dropout(dropout_rate)
      -> block0 … block{num_layers − 1}: TransformerBlocks (pre- or post-norm; dropout_rate
         on both branches and on the MLP's hidden units, mlp_size of them), each mixing the
         positions with `block_mixer`: kind "transformer" the self-attention `attention`
         (self_attention.py) built with layer=i, so that Performer's features, Reformer's
         rotations and BigBird's random blocks are drawn per layer; kinds "lru" / "s5" a
         linear recurrence (recurrent_mixer.py); with `remat` (remat.py) each block is
         run again in the backward pass, its input kept and (per the policy) its matrix
         products, the rest recomputed
      -> final_norm: LayerNorm (pre-norm only)
      -> features [B, L (+ 1), F]

  With `causal`, position i reads positions ≤ i only: causal self-attention (one of
  CAUSAL_ATTENTIONS) or the forward recurrence alone. Key lengths [B] (or None: none)
  mask the padding, keys t ≥ length, in every block. Matrix products run in `dtype` with
  float32 parameters.
  """
  kind: str = "transformer"        # the blocks' mixer: one of BLOCK_KINDS
  vocab_size: int | None = None    # token inputs; None: float inputs [B, L, D]
  causal: bool = False             # position i reads positions ≤ i only
  cls: bool = False                # a learned vector before the first position

  @nn.compact
  def __call__(self, inputs: Array, lengths: Array | None = None, *,
               train: bool = False) -> Array:
    check_choice("kind", self.kind, BLOCK_KINDS)
    self.check_names()
    if self.kind == "transformer":
      check_attention(self.attention, window=self.window, causal=self.causal)
    dtype, features = jnp.dtype(self.dtype), self.hidden_size
    if self.vocab_size is None:
      x = nn.Dense(features, dtype=dtype, name="embed")(inputs)
    else:
      x = nn.Embed(self.vocab_size, features, dtype=dtype, name="embed")(inputs)
    if self.cls:
      cls = self.param("cls", nn.initializers.normal(0.02), (features,))
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), x[:, :1].shape), x], axis=1)
      lengths = None if lengths is None else lengths + 1
    max_length = None if self.max_length is None else self.max_length + self.cls
    if self.positions == "learned":
      if max_length is None:
        raise ValueError("positions 'learned' need max_length (the longest input)")
      table = self.param("positions", nn.initializers.normal(0.02), (max_length, features))
      x = x + table[:x.shape[1]].astype(x.dtype)
    elif self.positions == "sinusoidal":
      x = x + sinusoidal_positions(x.shape[1], features).astype(x.dtype)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    for layer in range(self.num_layers):
      mixer = block_mixer(self.kind, functools.partial(
          self_attention, self.attention, num_heads=self.num_heads, features=features,
          window=self.window, max_length=max_length, proj_len=self.proj_len,
          compression=self.compression, block_size=self.block_size,
          num_features=self.num_features, num_hashes=self.num_hashes, layer=layer,
          implementation=self.implementation, dtype=dtype),
                          state_size=self.state_size, dtype=dtype, recurrence=self.recurrence)
      mlp_size = MLP_RATIO * features if self.mlp_size is None else self.mlp_size
      block = TransformerBlock(mixer, mlp_size, norm=self.norm, is_causal=self.causal,
                               mixer_gate=self.mixer_gate, dropout_rate=self.dropout_rate,
                               activation_dropout_rate=self.dropout_rate, dtype=dtype,
                               name=f"block{layer}")
      x = remat(lambda block, x, lengths: block(x, lengths, train=train), self.remat)(
          block, x, lengths)
    return nn.LayerNorm(name="final_norm")(x) if self.norm == "pre" else x
