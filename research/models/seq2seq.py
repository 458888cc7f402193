"""Encoder–decoder with attention (Bahdanau et al. 2015; Luong et al. 2015).

A recurrent encoder and an attention decoder in Bahdanau's or Luong's style, with any of
`DECODER_ATTENTIONS` (a score function, Luong's local attention, hard attention, or none:
the fixed-length bottleneck); nmt_dates trains it, and `decoding.py` decodes with it.
"""

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.attention import (
  SCORE_FUNCTIONS,
  HardAttention,
  LocalAttention,
  attend,
  make_score,
  padding_mask,
)
from research.errors import check_choice
from research.models.remat import REMAT, remat
from research.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, SimpleRNNCell

Array = jax.Array
LAYERS = {"rnn": RNN, "lstm": LSTM, "gru": GRU}
CELLS = {"rnn": SimpleRNNCell, "lstm": LSTMCell, "gru": GRUCell}
PATTERNS = ("local_m", "local_p", "hard")
DECODER_ATTENTIONS = ("none", *SCORE_FUNCTIONS, *PATTERNS)
STYLES = ("bahdanau", "luong")
HARD_TRAINING = {"gumbel": "gumbel", "reinforce": "sample"}


class Memory(NamedTuple):
  """What the decoder attends to; every leaf is batch-major."""
  states: Array        # h̄_s [B, S, hidden_size], zero at padded positions
  lengths: Array       # [B] source lengths

  @property
  def mask(self) -> Array:
    """[B, S] bool, True at real (non-padded) source positions."""
    return padding_mask(self.lengths, self.states.shape[1])


class DecoderState(NamedTuple):
  """The decoder's carry between steps; every leaf is batch-major."""
  cell: Any            # the cell's carry: h [B, H], or (c, h) for LSTM
  feed: Array | None   # h̃_{t-1} [B, H] for Luong input feeding, else None
  step: Array          # [B] int32, the index t of the next target position


def cell_output(carry: Any) -> Array:
  """The hidden state h [B, H] of a cell carry (h, or LSTM's (c, h))."""
  return carry[1] if isinstance(carry, tuple) else carry


class Encoder(nn.Module):
  """source [B, S] int, source_lengths [B] -> (Memory with h̄_s [B, S, H], the decoder
  cell's initial carry: h [B, H], or (c, h) for LSTM, from the top layer).

  An embedding, then a `research.recurrent` RNN / LSTM / GRU stack over the source with
  packed-sequence lengths. A bidirectional encoder gives each direction hidden_size / 2
  units, so the source states h̄_s always have hidden_size features, the size of the
  decoder state: every score is size-compatible with any encoder (dot and scaled_dot need
  d_q = d_k, which holds by construction; general, additive and concat allow any sizes;
  location needs max_source_length ≥ S). The decoder starts from the top encoder layer's
  final state (h, and c for LSTM), the forward and backward halves concatenated when
  bidirectional.
  """
  vocab_size: int          # source vocabulary
  embed_size: int          # embedding features
  hidden_size: int         # features of h̄_s (each direction has half when bidirectional)
  kind: str = "lstm"       # "rnn", "lstm" or "gru"
  num_layers: int = 1      # stacked recurrent layers
  bidirectional: bool = False  # add a reverse-time direction to every layer
  dropout_rate: float = 0.0  # on the embeddings and between layers, training only
  dtype: Any = None        # dtype of the matrix products (None: float32)
  remat: str = "none"      # each layer recomputed in the backward pass: one of REMAT

  @nn.compact
  def __call__(self, source: Array, source_lengths: Array, *,
               train: bool = False) -> tuple[Memory, Any]:
    directions = 2 if self.bidirectional else 1
    x = nn.Embed(self.vocab_size, self.embed_size, dtype=self.dtype, name="embed")(source)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    layer = LAYERS[self.kind](self.hidden_size // directions, num_layers=self.num_layers,
                              bidirectional=self.bidirectional, dropout=self.dropout_rate,
                              dtype=self.dtype,
                              remat_layer=functools.partial(remat, value=self.remat), name="rnn")
    states, final = layer(x, seq_lengths=source_lengths, train=train)
    h_n, c_n = final if self.kind == "lstm" else (final, None)
    top = lambda s: jnp.concatenate(list(s[-directions:]), axis=-1)   # [K, B, h] -> [B, H]
    carry = (top(c_n), top(h_n)) if self.kind == "lstm" else top(h_n)
    return Memory(states, source_lengths), carry


class DecoderAttention(nn.Module):
  """One query per batch row against the memory: (context [B, H], weights [B, S],
  log p(choice) [B], zero except for hard attention).

  `attention` is a score name of `research.attention.SCORE_FUNCTIONS` (softmax over the
  non-padded source positions), "local_m" / "local_p" (Luong's window of half-width
  D = `window` around p_t = t or the predicted p_t, with the `score` field's function), or
  "hard" (one source position, chosen with the `score` field's function). Hard attention
  picks the argmax at evaluation; in training, hard_training "gumbel" uses the
  straight-through Gumbel-softmax (gradients reach the score), and "reinforce" samples
  s ~ softmax and returns log p(s_t) for a REINFORCE surrogate
  (`research.attention.reinforce_surrogate` with reward −NLL). Hard attention draws from
  the PRNG stream "attention".
  """
  attention: str                   # a score name, "local_m", "local_p" or "hard"
  score: str = "general"           # score function of local_m / local_p / hard
  features: int = 64               # a, width of additive / concat / local-p layers
  max_source_length: int | None = None  # S of the location score
  window: int = 10                 # D, the half-width of local_m / local_p
  hard_training: str = "gumbel"    # "gumbel" or "reinforce"
  dtype: Any = None                # dtype of the score's matrix products (None: float32)

  @nn.compact
  def __call__(self, query: Array, memory: Memory, step: Array, *,
               train: bool = False) -> tuple[Array, Array, Array]:
    name = self.score if self.attention in PATTERNS else self.attention
    kwargs = {"additive": {"features": self.features}, "concat": {"features": self.features},
              "location": {"source_length": self.max_source_length}}.get(name, {})
    score = make_score(name, name="score", dtype=self.dtype, **kwargs)
    q, keys = query[:, None, :], memory.states                  # [B, 1, H], [B, S, H]
    log_prob = jnp.zeros(query.shape[:1], jnp.float32)
    if self.attention in SCORE_FUNCTIONS:
      context, weights = attend(score(q, keys), keys, memory.mask[:, None, :])
    elif self.attention == "hard":
      hard = HardAttention(score, mode=HARD_TRAINING[self.hard_training], name="hard")
      context, weights, log_prob = hard(q, keys, keys, mask=memory.mask[:, None, :], train=train)
      log_prob = log_prob[:, 0]
    else:
      monotonic = self.attention == "local_m"
      local = LocalAttention(score, mode="monotonic" if monotonic else "predictive",
                             half_window=self.window, features=self.features,
                             name="local")
      context, weights = local(q, keys, keys, kv_lengths=memory.lengths,
                               query_positions=step[:, None] if monotonic else None)
    return context[:, 0], weights[:, 0], log_prob


class Decoder(nn.Module):
  """The attention decoder: `step` is one target position, `__call__` scans them all.

  One step t (y_{t-1}: embedded previous target token; cell: the RNN cell):

    bahdanau   query s_{t-1};  a_t = attention(s_{t-1}, h̄),  c_t = Σ_s a_t(s) h̄_s
               s_t = cell(s_{t-1}, [y_{t-1}; c_t])
               t̃_t = U_o [s_t; c_t; y_{t-1}] + b_o          (2·hidden_size units)
               o_t = maxout(t̃_t): max of consecutive pairs   (the paper's deep output)
               logits = W_o o_t + b
    luong      h_t = cell(h_{t-1}, [y_{t-1}; h̃_{t-1}])     (h̃_{t-1} only with
                                                             input_feeding, h̃_0 = 0)
               a_t = attention(h_t, h̄),  c_t = Σ_s a_t(s) h̄_s
               h̃_t = tanh(W_c [c_t; h_t])
               logits = W_s h̃_t + b

  Bahdanau's output follows the paper's eq. (4), p(y_t | y_<t, x) = g(y_{t-1}, s_t, c_t),
  with the deep output of its appendix A.2.2 (which writes U_o s_{t-1}; we use s_t as in
  eq. 4); its initial state is the encoder's final state (`Encoder`), not tanh(W_s h̄_1).
  With attention "none" the context terms are dropped: the encoder's final state is the
  only link (the fixed-length bottleneck). Dropout (training only) acts on the embeddings
  and on o_t / h̃_t.
  """
  vocab_size: int                  # target vocabulary V
  embed_size: int                  # embedding features
  hidden_size: int                 # H, features of the cell state
  kind: str = "lstm"               # "rnn", "lstm" or "gru"
  attention: str = "general"       # "none", a score name, "local_m", "local_p" or "hard"
  style: str = "luong"             # "bahdanau" or "luong"
  input_feeding: bool = True       # Luong: feed h̃_{t-1} with the next input
  score: str = "general"           # score function of local_m / local_p / hard
  attention_features: int | None = None  # a of additive / concat / local-p (None: H)
  max_source_length: int | None = None   # S of the location score
  window: int = 10                 # D, the half-width of local_m / local_p
  hard_training: str = "gumbel"    # "gumbel" or "reinforce"
  dropout_rate: float = 0.0        # on the embeddings and before the output layer
  dtype: Any = None                # dtype of the matrix products (None: float32)

  def setup(self):
    self.embed = nn.Embed(self.vocab_size, self.embed_size, dtype=self.dtype)
    self.rnn = CELLS[self.kind](self.hidden_size, dtype=self.dtype)
    if self.attention != "none":
      self.attend = DecoderAttention(self.attention, self.score,
                                     self.attention_features or self.hidden_size,
                                     self.max_source_length, self.window,
                                     self.hard_training, self.dtype)
    if self.style == "bahdanau":
      self.pre_output = nn.Dense(2 * self.hidden_size, dtype=self.dtype)           # U_o, b_o
    else:
      self.combine = nn.Dense(self.hidden_size, use_bias=False, dtype=self.dtype)  # W_c
    self.output = nn.Dense(self.vocab_size, dtype=self.dtype)                      # W_o or W_s, b
    self.drop = nn.Dropout(self.dropout_rate)

  def initial_state(self, carry: Any) -> DecoderState:
    """The state before the first target token, from the encoder's final carry (kept in
    float32 whatever the compute dtype, as the cells keep theirs)."""
    carry = jax.tree.map(lambda x: x.astype(jnp.float32), carry)
    h = cell_output(carry)
    feed = jnp.zeros_like(h) if self.style == "luong" and self.input_feeding else None
    return DecoderState(carry, feed, jnp.zeros(h.shape[:1], jnp.int32))

  def _attend(self, query: Array, memory: Memory, step: Array,
              train: bool) -> tuple[Array | None, Array, Array]:
    if self.attention == "none":
      batch, source_len = memory.states.shape[:2]
      return None, jnp.zeros((batch, source_len), jnp.float32), jnp.zeros((batch,), jnp.float32)
    return self.attend(query, memory, step, train=train)

  def step(self, memory: Memory, state: DecoderState, token: Array, *,
           train: bool = False) -> tuple[DecoderState, tuple[Array, Array, Array]]:
    """token [B] int -> (next state, (logits [B, V], weights [B, S], log p(choice) [B]))."""
    with_context = lambda *xs: jnp.concatenate([x for x in xs if x is not None], axis=-1)
    y = self.drop(self.embed(token), deterministic=not train)
    if self.style == "bahdanau":
      context, weights, log_prob = self._attend(cell_output(state.cell), memory, state.step, train)
      carry, s = self.rnn(state.cell, with_context(y, context))
      pre = self.pre_output(with_context(s, context, y))
      out, feed = jnp.max(pre.reshape(*pre.shape[:-1], self.hidden_size, 2), axis=-1), None
    else:
      carry, h = self.rnn(state.cell, with_context(y, state.feed))
      context, weights, log_prob = self._attend(h, memory, state.step, train)
      out = jnp.tanh(self.combine(with_context(context, h)))
      feed = out if self.input_feeding else None
    logits = self.output(self.drop(out, deterministic=not train)).astype(jnp.float32)
    return DecoderState(carry, feed, state.step + 1), (logits, weights, log_prob)

  def __call__(self, memory: Memory, state: DecoderState, target_in: Array, *,
               train: bool = False) -> tuple[Array, Array]:
    """Teacher forcing: target_in [B, T] -> logits [B, T, V], weights [B, T, S]."""
    def body(decoder, state, memory, token):
      return decoder.step(memory, state, token, train=train)

    scan = nn.scan(body, variable_broadcast="params", variable_axes={"intermediates": 1},
                   split_rngs={"params": False, "dropout": True, "attention": True},
                   in_axes=(nn.broadcast, 1), out_axes=1)
    _, (logits, weights, log_prob) = scan(self, state, memory, target_in)
    if self.attention == "hard":
      self.sow("intermediates", "attention_log_prob", log_prob)
    return logits, weights


class Seq2Seq(nn.Module):
  """Encoder–decoder with attention; `Encoder`, `Decoder` and `DecoderAttention` give the
  equations.

      model = Seq2Seq(source_vocab_size=V_s, target_vocab_size=V_t, attention="general",
                      style="luong", input_feeding=True)
      variables = model.init(key, source, source_lengths, target_in)
      logits, weights = model.apply(variables, source, source_lengths, target_in)

  Shapes: source [B, S] int, source_lengths [B] int, target_in [B, T] int (the target
  shifted right, starting with BOS); logits [B, T, V_t] float32; weights [B, T, S]. With
  hard attention and hard_training "reinforce", log p(s_t) [B, T] is sown as intermediates
  "attention_log_prob". Dropout (training only, PRNG stream "dropout") acts on the
  embeddings, between encoder layers and on the decoder's output layer. With `remat`
  (remat.py) each encoder layer (and direction) is recomputed in the backward pass from its
  inputs; the decoder, one cell stepped through time, is not.
  """
  source_vocab_size: int           # source vocabulary
  target_vocab_size: int           # target vocabulary V
  embed_size: int = 64             # embedding features (source and target)
  hidden_size: int = 64            # H: decoder state and encoder states h̄_s
  kind: str = "lstm"               # "rnn", "lstm" or "gru", encoder and decoder
  encoder_layers: int = 1          # stacked encoder layers
  bidirectional: bool = False      # bidirectional encoder (hidden_size / 2 per direction)
  attention: str = "general"       # "none", a score name, "local_m", "local_p" or "hard"
  style: str = "luong"             # "bahdanau" (query s_{t-1}) or "luong" (query h_t)
  input_feeding: bool = True       # Luong only: feed h̃_{t-1} with the next input
  window: int = 10                 # D, the half-width of local_m / local_p
  dropout_rate: float = 0.0        # dropout rate, training only
  score: str = "general"           # score function of local_m / local_p / hard
  attention_features: int | None = None  # a of additive / concat / local-p (None: H)
  max_source_length: int | None = None   # S of the location score (needed by it)
  hard_training: str = "gumbel"    # hard attention in training: "gumbel" or "reinforce"
  dtype: Any = None                # dtype of the matrix products, e.g. "bfloat16" (None: float32)
  remat: str = "none"              # each encoder layer recomputed in the backward pass (REMAT)

  def _check_config(self):
    choices = {"kind": (self.kind, tuple(CELLS)),
               "attention": (self.attention, DECODER_ATTENTIONS), "style": (self.style, STYLES),
               "score": (self.score, tuple(SCORE_FUNCTIONS)),
               "hard_training": (self.hard_training, tuple(HARD_TRAINING)),
               "remat": (self.remat, REMAT)}
    for key, (value, allowed) in choices.items():
      check_choice(key, value, allowed)
    if self.bidirectional and self.hidden_size % 2:
      raise ValueError(f"a bidirectional encoder needs an even hidden_size (hidden_size / 2 "
                       f"per direction), got {self.hidden_size}")
    if self.input_feeding and self.style == "bahdanau":
      raise ValueError("input_feeding is for style='luong' (Bahdanau feeds c_t already); "
                       "set input_feeding=False")
    uses_location = "location" in (self.attention, self.score if self.attention in PATTERNS else "")
    if uses_location and self.max_source_length is None:
      raise ValueError("the location score needs max_source_length (its W_a is [H, S])")

  def setup(self):
    self._check_config()
    self.encoder = Encoder(self.source_vocab_size, self.embed_size, self.hidden_size, self.kind,
                           self.encoder_layers, self.bidirectional, self.dropout_rate,
                           self.dtype, self.remat)
    self.decoder = Decoder(self.target_vocab_size, self.embed_size, self.hidden_size, self.kind,
                           self.attention, self.style, self.input_feeding, self.score,
                           self.attention_features, self.max_source_length,
                           self.window, self.hard_training, self.dropout_rate,
                           self.dtype)

  def encode(self, source: Array, source_lengths: Array, *,
             train: bool = False) -> tuple[Memory, DecoderState]:
    """source [B, S] int, source_lengths [B] -> (memory, the decoder's initial state)."""
    memory, carry = self.encoder(source, source_lengths, train=train)
    return memory, self.decoder.initial_state(carry)

  def decode_step(self, memory: Memory, state: DecoderState, token: Array, *,
                  train: bool = False) -> tuple[DecoderState, Array, Array]:
    """One target token [B] int -> (next state, logits [B, V] float32, weights [B, S])."""
    state, (logits, weights, _) = self.decoder.step(memory, state, token, train=train)
    return state, logits, weights

  def __call__(self, source: Array, source_lengths: Array, target_in: Array, *,
               train: bool = False) -> tuple[Array, Array]:
    """Teacher forcing: logits [B, T, V] float32 and attention weights [B, T, S]."""
    memory, state = self.encode(source, source_lengths, train=train)
    return self.decoder(memory, state, target_in, train=train)
