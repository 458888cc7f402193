"""Byte-level language models: a recurrent stack or a causal stack of blocks.

  rnn | lstm | gru   bytes [B, L] -> Embed(256, embed_size) -> research.recurrent layer
                     (num_layers × hidden_size, dropout_rate between layers), its state
                     carried in and out -> Dense(256): logits [B, L, 256]
  transformer        bytes [B, L] -> the causal stack (block_stack.py): Embed(256,
  lru | s5           hidden_size) + positions -> num_layers blocks (pre-norm by default:
                     x += Mixer(LN(x)); x += MLP(LN(x))) whose mixer reads earlier bytes
                     only (causal self-attention `attention`, one of CAUSAL_ATTENTIONS, or
                     the forward linear recurrence) -> LayerNorm -> Dense(256): logits
                     [B, L, 256]

The recurrent model's `carry` is the layer's state, h [num_layers, B, hidden_size] for
rnn / gru and (h, c) for lstm: evaluating a long text in chunks, each chunk starting
from the previous chunk's carry, gives the same logits as one pass over the whole text.
The blocks have no carry (they return None): their context is the bytes they are given
(at most `max_length` where the attention or learned positions need it), and a long text
is scored with a sliding window (research/experiments/char_lm.py).

`sample` draws continuations of a prompt (temperature, top-k) from either kind.
Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters; logits are float32.
With `remat` (remat.py) each block, or each layer of the recurrent stack, is recomputed in
the backward pass instead of keeping its activations.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.models.block_stack import BlockStack, StackFields, check_choice
from research.models.kinds import BLOCK_KINDS, KINDS, RECURRENT

Array = jax.Array
VOCAB_SIZE = 256                 # bytes


class LanguageModel(StackFields):
  """bytes [B, L] (ints 0 … 255) -> (logits [B, L, 256], carry); see the module docstring.

  The blocks' fields are StackFields' (block_stack.py): hidden_size, num_layers,
  mlp_size, attention, window, …, dropout_rate (the recurrent kinds' too).
  """
  kind: str                      # one of KINDS: "rnn", "lstm", "gru", "transformer", "lru", "s5"
  embed_size: int = 64           # recurrent: byte embedding size (blocks: hidden_size)

  def initial_carry(self, batch_size: int) -> Any:
    """The zero state of the recurrent kinds for batch_size texts (None for the blocks)."""
    if self.kind in BLOCK_KINDS:
      return None
    h = jnp.zeros((self.num_layers, batch_size, self.hidden_size), jnp.float32)
    return (h, h) if self.kind == "lstm" else h

  @nn.compact
  def __call__(self, tokens: Array, carry: Any = None, *, train: bool = False
               ) -> tuple[Array, Any]:
    """tokens [B, L]; carry from `initial_carry` or a previous call (None: zeros).

    Returns logits [B, L, 256] for the byte after each position, and the carry after the
    last position (None for the blocks).
    """
    check_choice("kind", self.kind, KINDS)
    self.check_names()
    if self.kind in BLOCK_KINDS:
      if carry is not None:
        raise ValueError(f"the {self.kind} blocks have no carry; pass carry=None")
      x = BlockStack(**self.stack_fields(), kind=self.kind, vocab_size=VOCAB_SIZE, causal=True,
                     name="stack")(tokens, train=train)
    else:
      x = nn.Embed(VOCAB_SIZE, self.embed_size, dtype=self.dtype, name="embed")(tokens)
      x, carry = RECURRENT[self.kind](self.hidden_size, self.num_layers,
                                      dropout=self.dropout_rate, dtype=self.dtype,
                                      remat_layer=self.remat_layer(),
                                      name="recurrent")(x, initial_state=carry, train=train)
    logits = nn.Dense(VOCAB_SIZE, dtype=self.dtype, name="head")(x).astype(jnp.float32)
    return logits, carry


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
