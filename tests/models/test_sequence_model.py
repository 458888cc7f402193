"""SequenceModel: the recurrent path is research.recurrent's layer plus a Dense head; the
transformer encoder's shapes, positions and non-causal attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.positions import sinusoidal_positions
from research.models.sequence_model import SequenceModel
from research.recurrent import GRU, LSTM, RNN

# Compared with the layer and a NumPy head within 1e-6: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

B, L, V = 3, 9, 7     # batch, length, vocabulary


def tokens(seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(V, size=(B, L)), jnp.int32)


def floats(seed=0):
  return jnp.asarray(np.random.default_rng(seed).uniform(size=(B, L, 2)), jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("kind, layer, head, token_inputs", [
    ("rnn", RNN, "per_position", True), ("lstm", LSTM, "last", False),
    ("gru", GRU, "per_position", False)])
def test_recurrent_model_is_the_recurrent_layer_and_a_dense_head(kind, layer, head, token_inputs):
  model = SequenceModel(kind=kind, hidden_size=6, num_layers=2, num_outputs=5, head=head,
                        vocab_size=V if token_inputs else None)
  x = tokens() if token_inputs else floats()
  params = jax.jit(model.init)(jax.random.key(0), x)["params"]
  features = jax.nn.one_hot(x, V) if token_inputs else x
  outputs, _ = jax.jit(layer(6, 2).apply)({"params": params["recurrent"]}, features)
  if head == "last":
    outputs = outputs[:, -1]
  expected = outputs @ params["head"]["kernel"] + params["head"]["bias"]
  np.testing.assert_allclose(jax.jit(model.apply)({"params": params}, x), expected, rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("head, shape, token_inputs", [("per_position", (B, L, 5), True),
                                                       ("last", (B, 5), False)])
def test_transformer_output_shapes(head, shape, token_inputs):
  model = SequenceModel(kind="transformer", hidden_size=8, num_layers=2, num_outputs=5,
                        head=head, vocab_size=V if token_inputs else None, num_heads=2)
  x = tokens() if token_inputs else floats()
  params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
  assert jax.eval_shape(model.apply, {"params": params}, x).shape == shape
  assert set(params) == {"stack", "head"}
  assert {f"block{i}" for i in range(2)} <= set(params["stack"])


@pytest.mark.slow
@pytest.mark.parametrize("attention, window, reaches", [("full", 0, True), ("local", 2, False)])
def test_transformer_first_position_reads_the_last_input_unless_windowed(attention, window,
                                                                         reaches):
  """Self-attention is not causal: output 0 changes when only input L - 1 changes, except
  with a sliding window narrower than L - 1 (one block reaches `window` positions)."""
  model = SequenceModel(kind="transformer", hidden_size=8, num_layers=1, num_outputs=5,
                        vocab_size=V, num_heads=2, attention=attention, window=window)
  x = tokens()
  changed = x.at[:, -1].set((x[:, -1] + 1) % V)
  params = jax.jit(model.init)(jax.random.key(0), x)["params"]
  apply = jax.jit(model.apply)
  before, after = (apply({"params": params}, inputs) for inputs in (x, changed))
  change = np.abs(before[:, 0] - after[:, 0]).max(-1)
  assert np.all(change > 1e-4) if reaches else np.all(change == 0)
  assert np.all(np.abs(before[:, -1] - after[:, -1]).max(-1) > 1e-4)


def test_sinusoidal_positions_follow_the_formula():
  length, features = 11, 7
  expected = np.zeros((length, features))
  for p in range(length):
    for i in range(features):
      angle = p / 10000 ** (2 * (i // 2) / features)
      expected[p, i] = np.sin(angle) if i % 2 == 0 else np.cos(angle)
  np.testing.assert_allclose(sinusoidal_positions(length, features), expected, atol=1e-5)


@pytest.mark.parametrize("field, value", [("kind", "hyena"), ("head", "first"),
                                          ("attention", "routing"), ("norm", "sandwich")])
def test_unknown_kind_head_or_attention_is_rejected(field, value):
  model = SequenceModel(**{"kind": "lstm", "hidden_size": 4, "num_layers": 1, "num_outputs": 2,
                           field: value})
  with pytest.raises(ValueError, match=f"{field} must be one of"):
    model.init(jax.random.key(0), floats())


@pytest.mark.slow
def test_recurrence_options_reach_each_blocks_layer():
  """`recurrence` sets the LRU's ring: every |λ| = exp(−exp(ν_log)) of both blocks lies in
  [r_min, r_max] (the paper's parametrisation), which the default ring [0, 1] would not
  give; an option the layer does not take is refused, naming the allowed ones."""
  ring = {"lru": {"r_min": 0.9, "r_max": 0.95, "max_phase": 0.1}}
  model = SequenceModel(kind="lru", hidden_size=8, num_layers=2, num_outputs=1, head="last",
                        state_size=16, recurrence=ring)
  params = jax.jit(model.init)(jax.random.key(0), floats())["params"]
  for block in ("block0", "block1"):
    layer = params["stack"][block]["attention"]["recurrence"]
    magnitude = np.exp(-np.exp(np.asarray(layer["nu_log"])))
    assert (magnitude >= 0.9 - 1e-6).all() and (magnitude <= 0.95 + 1e-6).all()
    assert (np.exp(np.asarray(layer["theta_log"])) <= 0.1 + 1e-6).all()
  bad = SequenceModel(kind="lru", hidden_size=8, num_layers=1, num_outputs=1,
                      recurrence={"lru": {"dt_min": 0.01}})
  with pytest.raises(ValueError, match="lru.dt_min is not an option of lru; its options are "
                                       "r_min, r_max, max_phase, mode, chunk_size"):
    bad.init(jax.random.key(0), floats())
