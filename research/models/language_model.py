"""Language models over V tokens (bytes by default, V = 256): a recurrent stack or a causal
stack of blocks.

`LanguageModel` predicts each next token with a research.recurrent layer (its state carried
from chunk to chunk of a long text) or with the causal blocks of block_stack.py (any causal
self-attention or linear recurrence); `sample` draws continuations of a prompt.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.errors import check_choice
from research.models.block_stack import BlockStack, StackFields
from research.models.kinds import BLOCK_KINDS, KINDS, RECURRENT

Array = jax.Array
VOCAB_SIZE = 256                 # bytes


class LanguageModel(StackFields):
  """tokens [B, L] (ints 0 … V − 1) -> (logits [B, L, V], carry).

    rnn | lstm | gru   tokens [B, L] -> Embed(V, embed_size) -> research.recurrent layer
                       (num_layers × hidden_size, dropout_rate between layers), its state
                       carried in and out -> Dense(V): logits [B, L, V]
    transformer        tokens [B, L] -> the causal stack (block_stack.py): Embed(V,
    lru | s5 | …       hidden_size) + positions -> num_layers blocks (pre-norm by default:
                       x += Mixer(LN(x)); x += MLP(LN(x))) whose mixer reads earlier tokens
                       only (causal self-attention `attention`, one of CAUSAL_ATTENTIONS, or
                       the forward linear recurrence) -> LayerNorm -> Dense(V): logits
                       [B, L, V]

  The blocks' fields are StackFields' (block_stack.py): hidden_size, num_layers,
  mlp_size, attention, window, …, dropout_rate (the recurrent kinds' too).

  With `tie_embeddings` the output layer is the input embedding E [V, F] read backwards,
  logits = features · Eᵀ (Press & Wolf 2017; Zoology's models), and there is no Dense head
  (the recurrent kinds need embed_size = hidden_size). Given `logit_positions` [B, K] the
  logits are computed at those K positions of each sequence alone, [B, K, V]: where a loss
  reads a few positions (associative recall's queries) the output layer, L·V products per
  feature, shrinks to K·V.

  The recurrent model's `carry` is the layer's state, h [num_layers, B, hidden_size] for
  rnn / gru and (h, c) for lstm: evaluating a long text in chunks, each chunk starting
  from the previous chunk's carry, gives the same logits as one pass over the whole text.
  The blocks have no carry (they return None): their context is the bytes they are given
  (at most `max_length` where the attention or learned positions need it), and a long text
  is scored with a sliding window (research/experiments/char_lm.py).

  Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters; logits are
  float32. With `remat` (remat.py) each block, or each layer of the recurrent stack, is
  recomputed in the backward pass instead of keeping its activations.
  """
  kind: str                      # one of KINDS: "rnn", "lstm", "gru", "transformer", "lru", "s5"
  embed_size: int = 64           # recurrent: token embedding size (blocks: hidden_size)
  vocab_size: int = VOCAB_SIZE   # V: tokens 0 … V − 1 (bytes)
  tie_embeddings: bool = False   # logits = features · Eᵀ, no Dense head

  def initial_carry(self, batch_size: int) -> Any:
    """The zero state of the recurrent kinds for batch_size texts (None for the blocks)."""
    if self.kind in BLOCK_KINDS:
      return None
    h = jnp.zeros((self.num_layers, batch_size, self.hidden_size), jnp.float32)
    return (h, h) if self.kind == "lstm" else h

  @nn.compact
  def __call__(self, tokens: Array, carry: Any = None, *, train: bool = False,
               logit_positions: Array | None = None) -> tuple[Array, Any]:
    """tokens [B, L]; carry from `initial_carry` or a previous call (None: zeros);
    logit_positions [B, K] int or None.

    Returns logits [B, L, V] for the token after each position ([B, K, V]: after each of
    logit_positions), and the carry after the last position (None for the blocks).
    """
    check_choice("kind", self.kind, KINDS)
    self.check_names()
    if self.tie_embeddings and self.kind not in BLOCK_KINDS and self.embed_size != self.hidden_size:
      raise ValueError(f"tie_embeddings needs embed_size = hidden_size, got {self.embed_size} "
                       f"and {self.hidden_size}")
    if self.kind in BLOCK_KINDS:
      if carry is not None:
        raise ValueError(f"the {self.kind} blocks have no carry; pass carry=None")
      stack = BlockStack(**self.stack_fields(), kind=self.kind, vocab_size=self.vocab_size,
                         causal=True, name="stack")
      x = stack(tokens, train=train)
      embedding = stack.variables["params"]["embed"]["embedding"]
    else:
      embed = nn.Embed(self.vocab_size, self.embed_size, dtype=self.dtype, name="embed")
      x, carry = RECURRENT[self.kind](self.hidden_size, self.num_layers,
                                      dropout=self.dropout_rate, dtype=self.dtype,
                                      remat_layer=self.remat_layer(),
                                      name="recurrent")(embed(tokens), initial_state=carry,
                                                        train=train)
      embedding = embed.embedding
    if logit_positions is not None:
      x = jnp.take_along_axis(x, logit_positions[..., None], axis=1)
    if self.tie_embeddings:
      logits = jnp.einsum("...f,vf->...v", x, embedding.astype(x.dtype))
    else:
      logits = nn.Dense(self.vocab_size, dtype=self.dtype, name="head")(x)
    return logits.astype(jnp.float32), carry


def sample(model: LanguageModel, params, prompt: Array, rng: Array, *, length: int,
           temperature: float = 1.0, top_k: int = 0, context: int = 256) -> Array:
  """Continues prompt [B, P] (P ≥ 1) by `length` bytes drawn one at a time: [B, length].

  Each byte is drawn from softmax(logits / temperature) restricted to the top_k most likely
  bytes (top_k = 0: all 256); temperature 0 takes the most likely byte. The recurrent kinds
  read the prompt once and then carry their state; the blocks read the last `context`
  bytes before each draw (the window they were trained on, at most max_length). Pure: jit it with the keyword
  arguments static.
  """
  batch, prompt_len = prompt.shape

  def draw(logits: Array, key: Array) -> Array:
    """logits [B, 256] -> bytes [B]."""
    if temperature == 0:
      return jnp.argmax(logits, axis=-1)
    logits = logits / temperature
    if top_k:
      kth = lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1)

  keys = jax.random.split(rng, length)
  apply = lambda tokens, carry: model.apply({"params": params}, tokens, carry)
  if model.kind not in BLOCK_KINDS:
    logits, carry = apply(prompt, model.initial_carry(batch))

    def step(state, key):
      last, carry = state                   # logits [B, 256] of the next byte, the state
      token = draw(last, key)
      logits, carry = apply(token[:, None], carry)
      return (logits[:, -1], carry), token

    _, tokens = lax.scan(step, (logits[:, -1], carry), keys)
    return tokens.T

  # The blocks: a buffer of prompt + drawn bytes; the byte at position t + 1 is drawn
  # from the logits at t of the window of `context` bytes that ends at t (or starts at 0).
  size = max(prompt_len + length, context)
  buffer = jnp.zeros((batch, size), prompt.dtype).at[:, :prompt_len].set(prompt)

  def step(buffer, inputs):
    t, key = inputs
    start = jnp.clip(t - context + 1, 0, size - context)
    window = lax.dynamic_slice_in_dim(buffer, start, context, axis=1)
    logits, _ = apply(window, None)
    token = draw(lax.dynamic_index_in_dim(logits, t - start, axis=1, keepdims=False), key)
    return lax.dynamic_update_index_in_dim(buffer, token.astype(buffer.dtype), t + 1, 1), token

  positions = jnp.arange(prompt_len - 1, prompt_len - 1 + length)
  _, tokens = lax.scan(step, buffer, (positions, keys))
  return tokens.T
