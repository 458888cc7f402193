"""Seq2Seq with attention: every attention × style runs and masks padding; Luong's
attentional state with input feeding and Bahdanau's previous-state query against the
papers' equations written out in NumPy; hard attention's two training modes; a short
training run on a reversal task lowers the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.models.seq2seq import Seq2Seq

# Compared with the papers' equations in NumPy within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

SOURCE = np.array([[3, 4, 5, 6, 3], [5, 3, 4, 0, 0], [6, 6, 0, 0, 0]], np.int32)
LENGTHS = np.array([5, 3, 2], np.int32)
TARGET_IN = np.array([[1, 3, 4, 5], [1, 6, 5, 4], [1, 4, 4, 3]], np.int32)
TINY = dict(source_vocab_size=7, target_vocab_size=8, embed_size=5, hidden_size=6)


def random_params(model, seed=0, scale=0.5):
  """Parameters of the model's shapes drawn U(−scale, scale) in NumPy (no init compile)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), SOURCE, LENGTHS, TARGET_IN)["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.uniform(-scale, scale, s.shape), s.dtype), shapes)


def forward_and_encode(model, params):
  """Teacher-forced (logits, weights) and encode's (memory, state), in one compiled call."""
  def both(params):
    variables = {"params": params}
    return (model.apply(variables, SOURCE, LENGTHS, TARGET_IN),
            model.apply(variables, SOURCE, LENGTHS, method="encode"))
  return jax.jit(both)(params)


def softmax(x, axis=-1):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def masked_softmax(scores, lengths):
  """scores [B, S] -> softmax over s < lengths[b], 0 beyond."""
  valid = np.arange(scores.shape[1])[None] < lengths[:, None]
  return np.where(valid, softmax(np.where(valid, scores, -np.inf)), 0.0)


def rnn_cell(p, h, x):
  """PyTorch's tanh RNN: h' = tanh(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)."""
  return np.tanh(x @ p["kernel_ih"] + p["bias_ih"] + h @ p["kernel_hh"] + p["bias_hh"])


def numpy_tree(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


VARIANTS = [  # attention, style, cell, bidirectional
    ("none", "luong", "lstm", False),
    ("dot", "bahdanau", "gru", True),
    ("scaled_dot", "luong", "rnn", False),
    ("general", "luong", "lstm", True),
    ("additive", "bahdanau", "lstm", False),
    ("concat", "luong", "gru", False),
    ("location", "bahdanau", "rnn", True),
    ("local_m", "luong", "gru", True),
    ("local_p", "bahdanau", "lstm", False),
    ("hard", "luong", "rnn", False),
]


@pytest.mark.slow
@pytest.mark.parametrize("attention, style, cell, bidirectional", VARIANTS)
def test_every_attention_runs_and_ignores_padding(attention, style, cell, bidirectional):
  model = Seq2Seq(**TINY, kind=cell, bidirectional=bidirectional, attention=attention,
                  style=style, input_feeding=style == "luong", window=1,
                  max_source_length=SOURCE.shape[1])
  params = random_params(model)
  apply = jax.jit(model.apply)
  logits, weights = apply({"params": params}, SOURCE, LENGTHS, TARGET_IN)
  assert logits.shape == (3, 4, 8) and logits.dtype == jnp.float32
  assert weights.shape == (3, 4, 5)
  assert np.all(np.isfinite(logits))
  padded = np.arange(5)[None, None, :] >= LENGTHS[:, None, None]
  np.testing.assert_array_equal(np.where(padded, weights, 0.0), 0.0)
  row_sums = weights.sum(-1)
  if attention == "none":
    np.testing.assert_array_equal(weights, 0.0)
  elif attention.startswith("local"):
    assert np.all(row_sums <= 1 + 1e-6) and np.all(row_sums > 0)
  else:
    np.testing.assert_allclose(row_sums, 1.0, rtol=1e-6)
  # Other tokens at the padded positions change nothing.
  noisy_source = np.where(padded[:, 0], 4, SOURCE)
  noisy_logits, noisy_weights = apply({"params": params}, noisy_source, LENGTHS, TARGET_IN)
  np.testing.assert_allclose(noisy_logits, logits, atol=1e-6)
  np.testing.assert_allclose(noisy_weights, weights, atol=1e-6)


def test_luong_attentional_state_with_input_feeding():
  """h_t = cell(h_{t-1}, [y_{t-1}; h̃_{t-1}]), a_t = softmax_s(h_tᵀ W_a h̄_s),
  h̃_t = tanh(W_c [c_t; h_t]), logits = W_s h̃_t + b; bidirectional start state."""
  model = Seq2Seq(**TINY, kind="rnn", bidirectional=True, attention="general", style="luong",
                  input_feeding=True)
  params = random_params(model, seed=1)
  (logits, weights), (memory, state) = forward_and_encode(model, params)

  # Start state: forward half at each sequence's last step, backward half at step 0.
  states, lengths = np.asarray(memory.states, np.float64), LENGTHS
  last = states[np.arange(3), lengths - 1, :3]
  np.testing.assert_allclose(state.cell, np.concatenate([last, states[:, 0, 3:]], -1), atol=1e-6)

  p = numpy_tree(params["decoder"])
  h, feed = np.asarray(state.cell, np.float64), np.zeros((3, 6))
  for t in range(TARGET_IN.shape[1]):
    y = p["embed"]["embedding"][TARGET_IN[:, t]]
    h = rnn_cell(p["rnn"], h, np.concatenate([y, feed], -1))
    a = masked_softmax(np.einsum("bd,de,bse->bs", h, p["attend"]["score"]["w"], states), lengths)
    c = np.einsum("bs,bsd->bd", a, states)
    feed = np.tanh(np.concatenate([c, h], -1) @ p["combine"]["kernel"])
    expected_logits = feed @ p["output"]["kernel"] + p["output"]["bias"]
    np.testing.assert_allclose(weights[:, t], a, atol=1e-5)
    np.testing.assert_allclose(logits[:, t], expected_logits, atol=1e-5)


def test_luong_without_input_feeding_reads_only_the_embedding():
  model = Seq2Seq(**TINY, attention="dot", style="luong", input_feeding=False)
  shapes = jax.eval_shape(model.init, jax.random.key(0), SOURCE, LENGTHS, TARGET_IN)
  assert shapes["params"]["decoder"]["rnn"]["kernel_ih"].shape == (5, 4 * 6)


def test_bahdanau_queries_the_previous_state():
  """a_t = softmax_s(s_{t-1}ᵀ h̄_s), s_t = cell(s_{t-1}, [y_{t-1}; c_t]),
  logits = W_o maxout(U_o [s_t; c_t; y_{t-1}] + b_o) + b."""
  model = Seq2Seq(**TINY, kind="rnn", attention="dot", style="bahdanau", input_feeding=False)
  params = random_params(model, seed=2, scale=0.8)
  (logits, weights), (memory, state) = forward_and_encode(model, params)
  states = np.asarray(memory.states, np.float64)

  p = numpy_tree(params["decoder"])
  s = np.asarray(state.cell, np.float64)
  for t in range(TARGET_IN.shape[1]):
    y = p["embed"]["embedding"][TARGET_IN[:, t]]
    a = masked_softmax(np.einsum("bd,bsd->bs", s, states), LENGTHS)
    c = np.einsum("bs,bsd->bd", a, states)
    s = rnn_cell(p["rnn"], s, np.concatenate([y, c], -1))
    pre = np.concatenate([s, c, y], -1) @ p["pre_output"]["kernel"] + p["pre_output"]["bias"]
    out = pre.reshape(3, 6, 2).max(-1)
    np.testing.assert_allclose(weights[:, t], a, atol=1e-5)
    np.testing.assert_allclose(logits[:, t], out @ p["output"]["kernel"] + p["output"]["bias"],
                               atol=1e-5)
    with_current_state = masked_softmax(np.einsum("bd,bsd->bs", s, states), LENGTHS)
    assert np.abs(with_current_state - weights[:, t]).max() > 1e-3


@pytest.mark.slow
def test_hard_attention_training_modes():
  """Gumbel straight-through: one-hot weights, and a decoder step's gradient reaches the
  score; REINFORCE: sampled one-hot weights on real positions and log p(s_t) [B, T] sown
  for the surrogate."""
  rngs = {"attention": jax.random.key(3)}
  gumbel = Seq2Seq(**TINY, attention="hard", score="general", hard_training="gumbel")
  params = random_params(gumbel, seed=3)
  memory, state = jax.jit(lambda params: gumbel.apply({"params": params}, SOURCE, LENGTHS,
                                                      method="encode"))(params)

  def step_loss(params):
    _, logits, weights = gumbel.apply({"params": params}, memory, state, TARGET_IN[:, 0],
                                      train=True, rngs=rngs, method="decode_step")
    return jnp.mean(logits**2), weights

  grads, weights = jax.jit(jax.grad(step_loss, has_aux=True))(params)
  np.testing.assert_array_equal(weights.max(-1), 1.0)
  np.testing.assert_array_equal(weights.sum(-1), 1.0)
  assert np.abs(grads["decoder"]["attend"]["score"]["w"]).max() > 0

  reinforce = gumbel.clone(hard_training="reinforce", dropout_rate=0.1)
  rngs["dropout"] = jax.random.key(4)
  run = jax.jit(lambda params: reinforce.apply({"params": params}, SOURCE, LENGTHS, TARGET_IN,
                                               train=True, rngs=rngs, mutable="intermediates"))
  (logits, weights), sown = run(params)
  assert np.all(np.isfinite(logits))
  log_prob = sown["intermediates"]["decoder"]["attention_log_prob"][0]
  assert log_prob.shape == (3, 4) and np.all(log_prob <= 0)
  np.testing.assert_array_equal(weights.sum(-1), 1.0)
  assert np.all(weights.argmax(-1) < LENGTHS[:, None])


def reversal_batch(rng, batch, vocab, max_len):
  """Random strings of symbols 3… (1 = BOS, 2 = EOS, 0 = pad) and their reversals."""
  lengths = rng.integers(2, max_len + 1, batch)
  source = np.zeros((batch, max_len), np.int32)
  target_out = np.zeros((batch, max_len + 1), np.int32)
  for b, n in enumerate(lengths):
    source[b, :n] = rng.integers(3, vocab, n)
    target_out[b, :n + 1] = np.append(source[b, :n][::-1], 2)
  target_in = np.concatenate([np.ones((batch, 1), np.int32), target_out[:, :-1]], axis=1)
  return source, lengths.astype(np.int32), target_in, target_out


@pytest.mark.slow
def test_training_on_reversal_lowers_the_loss():
  source, lengths, target_in, target_out = reversal_batch(np.random.default_rng(0), 32, 8, 5)
  model = Seq2Seq(source_vocab_size=8, target_vocab_size=8, embed_size=16, hidden_size=32,
                  kind="rnn", attention="dot", style="luong")
  params = random_params(model, scale=0.2)
  optimizer = optax.adam(1e-2)

  def loss_fn(params):
    logits, _ = model.apply({"params": params}, source, lengths, target_in)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, target_out)
    mask = (np.arange(6)[None] <= lengths[:, None])
    return jnp.sum(nll * mask) / mask.sum()

  @jax.jit
  def update(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  losses = []
  for _ in range(60):
    params, opt_state, loss = update(params, opt_state)
    losses.append(float(loss))
  assert losses[-1] < 0.25 * losses[0], losses[::10]
