"""Greedy and beam-search decoding: beam size 1 is greedy, greedy agrees with the
teacher-forced model, beam search escapes a greedy trap and applies GNMT's length
penalty, and each function compiles once per shape."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.decoding import beam_search, greedy_decode
from research.models.seq2seq import Seq2Seq

# Greedy decoding against the teacher-forced pass (weights within 1e-6): full float32
# products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

BOS, EOS = 1, 2
SOURCE = np.array([[3, 4, 5, 6], [5, 3, 0, 0], [6, 6, 4, 0], [4, 0, 0, 0]], np.int32)
LENGTHS = np.array([4, 2, 3, 1], np.int32)
MAX_LEN = 6


@pytest.fixture(scope="module")
def random_model():
  """A small GRU model with Bahdanau attention and large random parameters (peaked
  distributions, so EOS comes at different steps in different rows)."""
  model = Seq2Seq(source_vocab_size=7, target_vocab_size=5, embed_size=6, hidden_size=8,
                  kind="gru", attention="additive", style="bahdanau", input_feeding=False)
  shapes = jax.eval_shape(model.init, jax.random.key(0), SOURCE, LENGTHS, SOURCE)["params"]
  rng = np.random.default_rng(6)
  params = jax.tree.map(lambda s: jnp.asarray(rng.uniform(-1.5, 1.5, s.shape), s.dtype), shapes)
  return model, params


@pytest.mark.slow
def test_greedy_follows_the_teacher_forced_argmax(random_model):
  model, params = random_model
  tokens, weights = greedy_decode(model, params, SOURCE, LENGTHS, bos_id=BOS, eos_id=EOS,
                                  max_len=MAX_LEN)
  assert tokens.shape == (4, MAX_LEN) and tokens.dtype == jnp.int32
  assert weights.shape == (4, MAX_LEN, 4)
  tokens, weights = np.asarray(tokens), np.asarray(weights)
  ended = np.cumsum(tokens == EOS, axis=1) - (tokens == EOS) > 0     # strictly after EOS
  assert ended.any() and not ended.all()
  np.testing.assert_array_equal(tokens[ended], 0)
  np.testing.assert_array_equal(weights[ended], 0.0)
  padded = np.arange(4)[None, None, :] >= LENGTHS[:, None, None]
  np.testing.assert_array_equal(np.where(padded, weights, 0.0), 0.0)

  target_in = np.concatenate([np.full((4, 1), BOS, np.int32), tokens[:, :-1]], axis=1)
  logits, teacher_weights = jax.jit(model.apply)({"params": params}, SOURCE, LENGTHS, target_in)
  np.testing.assert_array_equal(np.argmax(logits, -1)[~ended], tokens[~ended])
  np.testing.assert_allclose(teacher_weights[~ended], weights[~ended], atol=1e-6)


def test_beam_size_one_is_greedy(random_model):
  model, params = random_model
  greedy, _ = greedy_decode(model, params, SOURCE, LENGTHS, bos_id=BOS, eos_id=EOS,
                            max_len=MAX_LEN)
  beam, score = beam_search(model, params, SOURCE, LENGTHS, beam_size=1, bos_id=BOS,
                            eos_id=EOS, max_len=MAX_LEN, length_penalty=0.0)
  np.testing.assert_array_equal(beam, greedy)
  assert score.shape == (4,) and np.all(score <= 0)


@pytest.mark.slow
def test_decoding_compiles_once_per_shape(random_model):
  model, params = random_model
  decode = lambda source, lengths: (
      greedy_decode(model, params, source, lengths, bos_id=BOS, eos_id=EOS, max_len=MAX_LEN),
      beam_search(model, params, source, lengths, beam_size=2, bos_id=BOS, eos_id=EOS,
                  max_len=MAX_LEN, length_penalty=0.6))
  decode(SOURCE, LENGTHS)
  sizes = greedy_decode._cache_size(), beam_search._cache_size()
  decode(SOURCE[::-1], LENGTHS[::-1])
  beam_search(model, params, SOURCE, LENGTHS, beam_size=2, bos_id=BOS, eos_id=EOS,
              max_len=MAX_LEN, length_penalty=1.0)
  assert (greedy_decode._cache_size(), beam_search._cache_size()) == sizes


# A hand-made decoder over tokens 0 pad, 1 BOS, 2 EOS, 3 A, 4 B, whose first choice is
# a trap: P(A) = 0.6 then at best 0.34 (P(AA·) = 0.204), P(B) = 0.4 then P(EOS) = 0.9.
# Every hypothesis ends with EOS at its third token.
TRAP = {
    "first": [0, 0, 0, 0.6, 0.4],
    "after A": [0, 0, 0.321, 0.34, 0.339],
    "after B": [0, 0, 0.9, 0.05, 0.05],
    "third": [0, 0, 1, 0, 0],
}


class TrapModel(nn.Module):
  """The `Seq2Seq` decoding interface with fixed next-token probabilities."""

  def encode(self, source, source_lengths):
    batch = source.shape[0]
    return source, jnp.zeros((batch,), jnp.int32)          # memory, state = step t

  def decode_step(self, memory, step, token):
    table = jnp.log(jnp.maximum(jnp.array(list(TRAP.values())), 1e-9))
    row = jnp.where(step == 0, 0, jnp.where(step == 1, jnp.where(token == 3, 1, 2), 3))
    return step + 1, table[row], jnp.zeros(memory.shape, jnp.float32)


def test_beam_search_escapes_the_greedy_trap():
  model, source, lengths = TrapModel(), np.zeros((2, 3), np.int32), np.full((2,), 3, np.int32)
  greedy, _ = greedy_decode(model, {}, source, lengths, bos_id=BOS, eos_id=EOS, max_len=5)
  np.testing.assert_array_equal(greedy, [[3, 3, 2, 0, 0]] * 2)
  search = lambda alpha: beam_search(model, {}, source, lengths, beam_size=2, bos_id=BOS,
                                     eos_id=EOS, max_len=5, length_penalty=alpha)
  tokens, score = search(0.0)
  np.testing.assert_array_equal(tokens, [[4, 2, 0, 0, 0]] * 2)
  np.testing.assert_allclose(score, math.log(0.4 * 0.9), rtol=1e-5)
  # A strong length penalty, ((5 + |Y|) / 6)^α, favours the longer finished hypothesis.
  alpha = 5.0
  tokens, score = search(alpha)
  np.testing.assert_array_equal(tokens, [[3, 3, 2, 0, 0]] * 2)
  np.testing.assert_allclose(score, math.log(0.6 * 0.34) / (8 / 6) ** alpha, rtol=1e-5)
  assert math.log(0.4 * 0.9) / (7 / 6) ** alpha < score[0]
