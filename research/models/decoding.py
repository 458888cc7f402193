"""Greedy and beam-search decoding of an encoder–decoder, batched and under `jit`.

Both work with any flax module exposing `Seq2Seq`'s `encode` and `decode_step` (see
`greedy_decode`), compile once per model and shape, and return tokens [B, max_len] holding
the hypothesis up to and including EOS, then 0 (pad). Beam search ranks hypotheses with
GNMT's length penalty (Wu et al. 2016), as fairseq keeps them.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
NEG_INF = -1.0e9  # log-probability of an impossible hypothesis (finite: no inf − inf)


@functools.partial(jax.jit, static_argnames=("model", "bos_id", "eos_id", "max_len"))
def greedy_decode(model: nn.Module, params, source: Array, source_lengths: Array, *,
                  bos_id: int, eos_id: int, max_len: int) -> tuple[Array, Array]:
  """The most likely token at every step, y_t = argmax_v p(v | y_<t, x).

  `model` is any flax module exposing the two methods of `Seq2Seq`:

    encode(source [B, S], source_lengths [B]) -> (memory, state)
    decode_step(memory, state, token [B]) -> (state, logits [B, V], weights [B, S])

  where memory and state are pytrees whose leaves all have the batch as leading axis
  (beam search repeats and reorders them along it). `params` is the parameter tree
  (`variables["params"]`). Each function is jitted with the model, the token ids, max_len
  and beam_size static: it compiles once per model and shape.

  Args:
    model: the encoder–decoder (above); params: its parameters.
    source: [B, S] int tokens; source_lengths: [B].
    bos_id: the first decoder input; eos_id: ends a hypothesis; max_len: steps.

  Returns:
    tokens [B, max_len] int32 (0 after EOS) and attention weights [B, max_len, S]
    (zero after EOS).
  """
  variables = {"params": params}
  memory, state = model.apply(variables, source, source_lengths, method="encode")
  batch = source.shape[0]

  def step(carry, _):
    state, token, finished = carry
    state, logits, weights = model.apply(variables, memory, state, token, method="decode_step")
    token = jnp.where(finished, 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
    weights = jnp.where(finished[:, None], 0.0, weights)
    return (state, token, finished | (token == eos_id)), (token, weights)

  start = (state, jnp.full((batch,), bos_id, jnp.int32), jnp.zeros((batch,), bool))
  _, (tokens, weights) = jax.lax.scan(step, start, length=max_len)
  return tokens.T, jnp.swapaxes(weights, 0, 1)


def gnmt_length_penalty(length: Array, alpha: Array | float) -> Array:
  """lp = ((5 + length) / 6)^α of Wu et al. 2016."""
  return ((5.0 + length) / 6.0) ** alpha


def _take(x: Array, index: Array) -> Array:
  """x [B, N, ...] gathered along axis 1 by index [B, M] -> [B, M, ...]."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "bos_id", "eos_id", "max_len"))
def beam_search(model: nn.Module, params, source: Array, source_lengths: Array, *,
                beam_size: int, bos_id: int, eos_id: int, max_len: int,
                length_penalty: float = 0.6) -> tuple[Array, Array]:
  """The best hypothesis of a beam search with GNMT's length penalty.

  Beam search (Wu et al. 2016, GNMT) ranks a hypothesis Y by
    score(Y) = log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6)^α,
  with |Y| the number of generated tokens, EOS included. Every step expands the K alive
  hypotheses and keeps the 2K best continuations by log P, so that at least K of them do
  not end in EOS. Those among the K best that end in EOS join the finished pool, which
  keeps its K best scores (as in fairseq; with K = 1 and α = 0 this is greedy decoding),
  and the K best that do not end in EOS stay alive. After max_len steps the best
  finished hypothesis is returned, or, for a batch row where none finished, the best
  alive one scored with |Y| = max_len. A finished hypothesis is preferred to an
  unfinished one whatever their scores.

  Args:
    model, params, source [B, S], source_lengths [B], bos_id, eos_id, max_len: as in
      `greedy_decode`.
    beam_size: K, hypotheses kept per batch row.
    length_penalty: α of lp(Y) = ((5 + |Y|) / 6)^α (0: rank by log P(Y | X)).

  Returns:
    tokens [B, max_len] int32 (0 after EOS) and their scores log P(Y | X) / lp(Y) [B].
  """
  variables = {"params": params}
  batch, k = source.shape[0], beam_size
  memory, state = model.apply(variables, source, source_lengths, method="encode")
  # Every batch row becomes K consecutive rows b·K + i.
  memory, state = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), (memory, state))

  def step(carry, t):
    state, last, alive, alive_lp, finished, finished_score = carry
    state, logits, _ = model.apply(variables, memory, state, last.reshape(-1), method="decode_step")
    log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(batch, k, -1)
    vocab = log_p.shape[-1]
    candidate_lp, index = jax.lax.top_k((alive_lp[:, :, None] + log_p).reshape(batch, -1), 2 * k)
    parent, new_token = index // vocab, (index % vocab).astype(jnp.int32)    # [B, 2K]
    candidates = _take(alive, parent).at[:, :, t].set(new_token)             # [B, 2K, L]
    ends = new_token == eos_id
    # An EOS continuation finishes a hypothesis only if it ranks among the K best.
    finishes = ends & (jnp.arange(2 * k) < k) & (candidate_lp > NEG_INF / 2)

    alive_lp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, candidate_lp), k)
    alive, parent, last = _take(candidates, keep), _take(parent, keep), _take(new_token, keep)
    rows = (jnp.arange(batch)[:, None] * k + parent).reshape(-1)
    state = jax.tree.map(lambda x: x[rows], state)

    score = candidate_lp / gnmt_length_penalty(t + 1, length_penalty)
    pool_score = jnp.concatenate([finished_score, jnp.where(finishes, score, NEG_INF)], 1)
    finished_score, best = jax.lax.top_k(pool_score, k)                      # of [B, 3K]
    finished = _take(jnp.concatenate([finished, candidates], axis=1), best)
    return (state, last, alive, alive_lp, finished, finished_score), None

  sequences = jnp.zeros((batch, k, max_len), jnp.int32)
  # The K start hypotheses are the same: only the first is alive.
  alive_lp = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF), (batch, k))
  start = (state, jnp.full((batch, k), bos_id, jnp.int32), sequences, alive_lp, sequences,
           jnp.full((batch, k), NEG_INF))
  (_, _, alive, alive_lp, finished, finished_score), _ = jax.lax.scan(
      step, start, jnp.arange(max_len))
  any_finished = finished_score[:, 0] > NEG_INF / 2
  alive_score = alive_lp[:, 0] / gnmt_length_penalty(max_len, length_penalty)
  tokens = jnp.where(any_finished[:, None], finished[:, 0], alive[:, 0])
  return tokens, jnp.where(any_finished, finished_score[:, 0], alive_score)
