"""The transformer block of every model here: self-attention and an MLP, each a residual
branch, with LayerNorm before the branch (pre-norm) or after the sum (post-norm, as in the
original Transformer and LRA); the attention's place may hold any mixer (a linear
recurrence), optionally followed by the S5 and LRU papers' gated linear unit.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from research.errors import check_choice

Array = jax.Array
NORMS = ("pre", "post")
MIXER_GATES = ("none", "glu", "half_glu")


class TransformerBlock(nn.Module):
  """x [B, L, F], key lengths [B] or None -> [B, L, F]:

    pre:   x ← x + Drop(Attention(LN(x)));   x ← x + Drop(W₂ Drop_a(gelu(W₁ LN(x))))
    post:  x ← LN(x + Drop(Attention(x)));   x ← LN(x + Drop(W₂ Drop_a(gelu(W₁ x))))

  With mlp_size 0 the block is its first branch alone (Zoology's blocks, whose "state
  mixer" is the identity). `mixer_gate` follows the mixer with the gated linear unit of the
  S5 and LRU papers' layers (their only nonlinearity: those layers have no MLP), on the
  mixer's output y:

    glu        W_v Drop_a(gelu(y)) ⊙ σ(W_g Drop_a(gelu(y)))   (the LRU paper's; S5's "full_glu")
    half_glu   y ⊙ σ(W_g Drop_a(gelu(y)))                      (S5's "half_glu2", its LRA recipes)

  W_v ("gate_value") and W_g ("gate") [F, F] with biases. Drop is dropout at `dropout_rate`
  on each branch, Drop_a at `activation_dropout_rate` on the MLP's hidden units and the
  gate's input (train=True only). gelu is flax's (the tanh approximation); W₁ is
  [F, mlp_size], W₂ [mlp_size, F]. A pre-norm stack ends with a final LayerNorm (the
  model's).

  Parameters: attention/… (the attention module's own), attention_norm, mlp_in, mlp_out,
  mlp_norm: the names of `torch.nn.TransformerEncoderLayer`'s parts are self_attn, norm1,
  linear1, linear2, norm2.
  """
  attention: Callable[..., nn.Module]  # the self-attention's constructor (self_attention.py),
                                       # called with name="attention"
  mlp_size: int                        # hidden width of the MLP (0: no MLP branch)
  norm: str = "pre"                    # "pre" or "post"
  is_causal: bool = False              # query i sees keys j ≤ i only
  dropout_rate: float = 0.0            # on each residual branch
  activation_dropout_rate: float = 0.0  # on the MLP's hidden units (and the gate's)
  mixer_gate: str = "none"             # "none", "glu" or "half_glu" after the mixer
  dtype: Any = None                    # dtype of the matrix products (None: float32)

  @nn.compact
  def __call__(self, x: Array, key_value_seq_lengths: Array | None = None, *,
               train: bool = False) -> Array:
    check_choice("norm", self.norm, NORMS)
    check_choice("mixer_gate", self.mixer_gate, MIXER_GATES)
    pre = self.norm == "pre"
    drop = lambda rate, y: nn.Dropout(rate, deterministic=not train)(y)

    def attention(y):
      y = self.attention(name="attention")(
          y, is_causal=self.is_causal, key_value_seq_lengths=key_value_seq_lengths, train=train)
      if self.mixer_gate == "none":
        return y
      dense = lambda name: nn.Dense(x.shape[-1], dtype=self.dtype, name=name)
      g = drop(self.activation_dropout_rate, nn.gelu(y))
      value = y if self.mixer_gate == "half_glu" else dense("gate_value")(g)
      return value * jax.nn.sigmoid(dense("gate")(g))

    def mlp(y):
      y = nn.gelu(nn.Dense(self.mlp_size, dtype=self.dtype, name="mlp_in")(y))
      if self.activation_dropout_rate:   # only where used: the branch's dropout keeps its name
        y = drop(self.activation_dropout_rate, y)
      return nn.Dense(x.shape[-1], dtype=self.dtype, name="mlp_out")(y)

    branches = ((attention, "attention_norm"), (mlp, "mlp_norm"))
    for branch, norm in branches if self.mlp_size else branches[:1]:
      if pre:
        x = x + drop(self.dropout_rate, branch(nn.LayerNorm(name=norm)(x)))
      else:
        x = nn.LayerNorm(name=norm)(x + drop(self.dropout_rate, branch(x)))
    return x
