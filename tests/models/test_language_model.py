"""LanguageModel: carried state equals one pass, the transformer is causal (and windowed),
greedy sampling takes the argmax of whole passes computed here, top-k limits the draws; tied
embeddings equal flax's Dense head holding the embedding, and logits read at given
positions equal the whole pass's rows there."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import LanguageModel
from research.models.language_model import sample

pytestmark = pytest.mark.usefixtures("highest_precision")


@functools.cache
def make(kind: str):
  """A small two-layer model of `kind` and its parameters (shared by the tests)."""
  model = LanguageModel(kind=kind, hidden_size=16, num_layers=2, embed_size=8, num_heads=2)
  return model, jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]


def byte_tokens(batch: int, length: int, seed: int = 0) -> jnp.ndarray:
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (batch, length)), jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_chunks_with_carried_state_equal_one_pass(kind):
  model, params = make(kind)
  apply = jax.jit(model.apply)
  tokens = byte_tokens(3, 30)
  whole, final = apply({"params": params}, tokens)                 # carry None: zeros
  assert whole.shape == (3, 30, 256) and whole.dtype == jnp.float32
  carry, parts = model.initial_carry(3), []
  for start in (0, 10, 20):
    logits, carry = apply({"params": params}, tokens[:, start:start + 10], carry)
    parts.append(logits)
  np.testing.assert_allclose(jnp.concatenate(parts, axis=1), whole, rtol=1e-5, atol=1e-5)
  assert jax.tree.structure(carry) == jax.tree.structure(model.initial_carry(3))
  for ours, theirs in zip(jax.tree.leaves(carry), jax.tree.leaves(final), strict=True):
    assert ours.shape == (2, 3, 16)                                 # [layers, batch, hidden]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 3])
def test_the_transformer_is_causal_and_windowed(window):
  model, params = make("transformer")
  model = model.clone(attention="local" if window else "full", window=window)   # no parameters
                                              # of its own: the same ones
  tokens, j = byte_tokens(2, 24), 10
  both, carry = jax.jit(model.apply)({"params": params}, jnp.concatenate(
      [tokens, tokens.at[:, j].set((tokens[:, j] + 1) % 256)]))     # as given, byte j changed
  assert both.shape == (4, 24, 256) and both.dtype == jnp.float32 and carry is None
  difference = np.abs(np.asarray(both[2:] - both[:2])).max(axis=(0, 2))   # per position
  assert np.all(difference[:j] == 0)                                      # earlier: untouched
  assert np.all(difference[j:j + 1] > 1e-4)
  # Two blocks with a window of w: position i sees bytes i − 2w … i.
  reach = len(difference) if window == 0 else j + 2 * window + 1
  assert np.all(difference[j:reach] > 0)
  assert np.all(difference[reach:] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lru", "s5"])
def test_linear_recurrence_blocks_are_causal_with_no_carry(kind):
  """lru / s5 blocks run the recurrence forward only: changing byte j leaves the logits
  before j untouched and changes every one from j on (the state carries it)."""
  model, params = make(kind)
  tokens, j = byte_tokens(2, 16), 6
  both, carry = jax.jit(model.apply)({"params": params}, jnp.concatenate(
      [tokens, tokens.at[:, j].set((tokens[:, j] + 1) % 256)]))
  assert carry is None and model.initial_carry(2) is None
  difference = np.abs(np.asarray(both[2:] - both[:2])).max(axis=(0, 2))
  assert np.all(difference[:j] == 0) and np.all(difference[j:] > 0)


@pytest.mark.slow
@pytest.mark.parametrize("kind,context", [("lstm", 64), ("transformer", 6)])
def test_greedy_sampling_takes_the_argmax_of_a_whole_pass_over_its_window(kind, context):
  """Drawn byte t + 1 is the argmax of the logits at t of one pass over the `context`
  bytes ending at t (the first `context` bytes while t < context: by causality the same
  as the bytes up to t). The recurrent model reads everything before it."""
  model, params = make(kind)
  prompt, length = byte_tokens(1, 4, seed=1), 12
  drawn = sample(model, params, prompt, jax.random.key(0), length=length, temperature=0.0,
                 context=context)
  assert drawn.shape == (1, length)
  sequence = np.concatenate([prompt[0], drawn[0]])
  positions = np.arange(prompt.shape[1] - 1, len(sequence) - 1)          # t of each draw
  if kind == "transformer":
    starts = np.clip(positions - context + 1, 0, None)
    windows = np.stack([sequence[s:s + context] for s in starts])
    logits, _ = model.apply({"params": params}, jnp.asarray(windows))
    expected = np.argmax(logits[np.arange(len(starts)), positions - starts], axis=-1)
  else:
    logits, _ = model.apply({"params": params}, jnp.asarray(sequence)[None])
    expected = np.argmax(logits[0, positions], axis=-1)
  np.testing.assert_array_equal(drawn[0], expected)


def test_sampling_is_seeded_and_top_k_limits_the_bytes():
  model, params = make("gru")
  prompt = jnp.tile(byte_tokens(1, 3), (64, 1))
  draw = jax.jit(lambda params, rng: sample(model, params, prompt, rng, length=1,
                                            temperature=1.0, top_k=3))
  first, again = draw(params, jax.random.key(1)), draw(params, jax.random.key(1))
  np.testing.assert_array_equal(first, again)
  logits, _ = model.apply({"params": params}, prompt[:1])
  allowed = set(np.argsort(np.asarray(logits[0, -1]))[-3:].tolist())
  assert set(np.asarray(first[:, 0]).tolist()) <= allowed
  assert len(set(np.asarray(first[:, 0]).tolist())) > 1                # it does sample


def test_an_unknown_kind_and_a_transformer_carry_are_refused():
  with pytest.raises(ValueError, match="kind must be one of"):
    LanguageModel(kind="xl", hidden_size=8).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))
  model, params = make("transformer")
  with pytest.raises(ValueError, match="no carry"):
    model.apply({"params": params}, byte_tokens(1, 4), jnp.zeros((2, 1, 16)))


@pytest.mark.parametrize("kind", ["transformer", "gru",
                                  pytest.param("linear_cell", marks=pytest.mark.long)])
def test_tied_logits_are_a_dense_head_holding_the_embedding_read_at_the_positions(kind):
  vocab = 40
  tied = LanguageModel(kind=kind, hidden_size=16, num_layers=2, embed_size=16, num_heads=2,
                       state_size=8, vocab_size=vocab, tie_embeddings=True)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, vocab, (3, 12)), jnp.int32)
  params = tied.init(jax.random.key(0), tokens)["params"]
  assert "head" not in params
  embedding = (params["embed"] if kind == "gru" else params["stack"]["embed"])["embedding"]
  head = {"kernel": embedding.T, "bias": jnp.zeros(vocab)}
  whole, _ = tied.apply({"params": params}, tokens)
  untied, _ = tied.clone(tie_embeddings=False).apply({"params": {**params, "head": head}},
                                                     tokens)
  assert whole.shape == (3, 12, vocab)
  np.testing.assert_allclose(whole, untied, rtol=1e-5, atol=1e-5)
  positions = np.array([[0, 5], [11, 3], [7, 7]])
  at, _ = tied.apply({"params": params}, tokens, logit_positions=jnp.asarray(positions))
  np.testing.assert_allclose(at, np.asarray(whole)[np.arange(3)[:, None], positions],
                             rtol=1e-6, atol=1e-6)
