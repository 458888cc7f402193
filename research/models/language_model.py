"""Byte-level language models: a recurrent stack or a causal transformer decoder.

  rnn | lstm | gru   bytes [B, L] -> Embed(256, embed_size) -> research.recurrent layer
                     (num_layers × hidden_size), its state carried in and out ->
                     Dense(256): logits [B, L, 256]
  transformer        bytes [B, L] -> Embed(256, hidden_size) + sinusoidal positions ->
                     num_layers pre-norm TransformerBlocks (x += MHA(LN(x)); x += MLP(LN(x)))
                     with causal self-attention (query i sees keys j ≤ i, or i − window … i with
                     a window) -> LayerNorm -> Dense(256): logits [B, L, 256]

The recurrent model's `carry` is the layer's state, h [num_layers, B, hidden_size] for
rnn / gru and (h, c) for lstm: evaluating a long text in chunks, each chunk starting
from the previous chunk's carry, gives the same logits as one pass over the whole text.
The transformer has no carry (it returns None): its context is the bytes it is given,
and a long text is scored with a sliding window (research/experiments/char_lm.py).

`sample` draws continuations of a prompt (temperature, top-k) from either kind.
Matrix products run in `dtype` (e.g. bfloat16) with float32 parameters; logits are float32.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.models.kinds import BLOCK_KINDS, KINDS, RECURRENT
from research.models.positions import sinusoidal_positions
from research.models.recurrent_mixer import block_mixer
from research.models.self_attention import self_attention
from research.models.transformer_block import TransformerBlock

Array = jax.Array
VOCAB_SIZE = 256                 # bytes


class LanguageModel(nn.Module):
  """bytes [B, L] (ints 0 … 255) -> (logits [B, L, 256], carry); see the module docstring."""
  kind: str                      # one of KINDS: "rnn", "lstm", "gru", "transformer", "lru", "s5"
  hidden_size: int               # recurrent state / transformer features F
  num_layers: int = 1            # recurrent layers / transformer blocks
  embed_size: int = 64           # recurrent: byte embedding size (transformer: hidden_size)
  num_heads: int = 4             # transformer: attention heads, dividing hidden_size
  mlp_ratio: int = 4             # transformer: MLP width / hidden_size
  window: int = 0                # transformer: 0 attends to every earlier byte; w > 0 to the
                                 # w bytes before (sliding window)
  implementation: str = "auto"   # transformer: research.attention implementation
  dropout: float = 0.0           # between recurrent layers / on transformer branches (train)
  state_size: int = 64           # lru / s5: complex states N of each block's (causal) recurrence
  recurrence: Any = None         # lru / s5: {kind: {option: value}} (recurrent_mixer.OPTIONS)
  dtype: Any = "float32"         # dtype of the matrix products ("float32", "bfloat16")

  def initial_carry(self, batch_size: int) -> Any:
    """The zero state of the recurrent kinds for batch_size texts (None for the transformer)."""
    if self.kind in BLOCK_KINDS:
      return None
    h = jnp.zeros((self.num_layers, batch_size, self.hidden_size), jnp.float32)
    return (h, h) if self.kind == "lstm" else h

  @nn.compact
  def __call__(self, tokens: Array, carry: Any = None, *, train: bool = False
               ) -> tuple[Array, Any]:
    """tokens [B, L]; carry from `initial_carry` or a previous call (None: zeros).

    Returns logits [B, L, 256] for the byte after each position, and the carry after the
    last position (None for the transformer).
    """
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
    if self.kind in BLOCK_KINDS:
      if carry is not None:
        raise ValueError(f"the {self.kind} blocks have no carry; pass carry=None")
      x = self.decode(tokens, train=train)
    else:
      x = nn.Embed(VOCAB_SIZE, self.embed_size, dtype=self.dtype, name="embed")(tokens)
      x, carry = RECURRENT[self.kind](self.hidden_size, self.num_layers, dropout=self.dropout,
                                      dtype=self.dtype, name="recurrent")(
          x, initial_state=carry, train=train)
    logits = nn.Dense(VOCAB_SIZE, dtype=self.dtype, name="head")(x).astype(jnp.float32)
    return logits, carry

  def decode(self, tokens: Array, *, train: bool) -> Array:
    """The transformer decoder: tokens [B, L] -> features [B, L, hidden_size]."""
    x = nn.Embed(VOCAB_SIZE, self.hidden_size, dtype=self.dtype, name="embed")(tokens)
    x = x + sinusoidal_positions(tokens.shape[1], self.hidden_size).astype(x.dtype)
    x = nn.Dropout(self.dropout, deterministic=not train)(x)
    mixer = block_mixer(self.kind, functools.partial(self_attention,
        "local" if self.window else "full", num_heads=self.num_heads,
        features=self.hidden_size, window=self.window, implementation=self.implementation,
        dtype=self.dtype), state_size=self.state_size, dtype=self.dtype,
                        recurrence=self.recurrence)
    for layer in range(self.num_layers):
      x = TransformerBlock(mixer, self.mlp_ratio * self.hidden_size, is_causal=True,
                           dropout_rate=self.dropout, dtype=self.dtype,
                           name=f"block{layer}")(x, train=train)
    return nn.LayerNorm(name="final_norm")(x)


def sample(model: LanguageModel, params, prompt: Array, rng: Array, *, length: int,
           temperature: float = 1.0, top_k: int = 0, context: int = 256) -> Array:
  """Continues prompt [B, P] (P ≥ 1) by `length` bytes drawn one at a time: [B, length].

  Each byte is drawn from softmax(logits / temperature) restricted to the top_k most likely
  bytes (top_k = 0: all 256); temperature 0 takes the most likely byte. The recurrent kinds
  read the prompt once and then carry their state; the transformer reads the last `context`
  bytes before each draw (the window it was trained on). Pure: jit it with the keyword
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

  # The transformer: a buffer of prompt + drawn bytes; the byte at position t + 1 is drawn
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
