"""The encoder classifier: padding never matters, each attention variant sees what its
paper says (a local window's receptive field grows by the window per layer; Longformer's
global CLS token and full attention see everything), and bad names are refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.encoder_classifier import EncoderClassifier

pytestmark = pytest.mark.usefixtures("highest_precision")

SMALL = dict(vocab_size=20, num_classes=10, max_length=24, num_layers=2, hidden_size=16,
             num_heads=2, mlp_size=32, window=2, proj_len=8, compression=2, block_size=4,
             num_features=16, dropout_rate=0.0, norm="post", positions="learned")


# Sinkhorn sorts the padded length's blocks and Reformer hashes into (padded length / chunk)
# buckets, as in their papers: the amount of padding changes their outputs, its content not.
PADDED_LENGTH_MATTERS = ("sinkhorn", "reformer")


def _model(**overrides):
  return EncoderClassifier(**{**SMALL, **overrides})


def _tokens(seed, batch, length):
  return jnp.asarray(np.random.default_rng(seed).integers(1, 20, (batch, length)), jnp.int32)


# Every attention ignores padded keys in a block (test_transformer_block.py); here, the model
# around them: CLS and mean pooling, both norms, both positions, an attention of each family
# (dense, windowed, global tokens, a projection over the length, hashing) and the recurrences.
@pytest.mark.slow
@pytest.mark.parametrize("attention,pooling,norm,positions", [
    *((attention, "cls", "post", "learned")
      for attention in ("full", "longformer", "linformer", "reformer")),
    ("local", "mean", "pre", "sinusoidal"), ("lru", "mean", "pre", "learned"),
    ("s5", "cls", "post", "learned")])
def test_padding_changes_nothing(attention, pooling, norm, positions):
  kind = attention if attention in ("lru", "s5") else "transformer"
  model = _model(attention="full" if kind != "transformer" else attention, kind=kind,
                 pooling=pooling, norm=norm, positions=positions, num_layers=1, state_size=4)
  tokens, lengths = _tokens(0, 2, 13), jnp.array([13, 9])
  padded = jnp.pad(tokens, ((0, 0), (0, 11))).at[1, 9:].set(0)          # more padding
  garbage = padded.at[:, 13:].set(7).at[1, 9:].set(5)                     # padding's content
  params = jax.jit(model.init)(jax.random.key(0), padded, lengths)
  apply = jax.jit(model.apply)
  expected = apply(params, padded, lengths)
  if attention not in PADDED_LENGTH_MATTERS:
    np.testing.assert_allclose(apply(params, tokens, lengths), expected, atol=2e-5)
  np.testing.assert_allclose(apply(params, garbage, lengths), expected, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("attention,sees_far_tokens", [
    ("local", False), ("longformer", True), ("full", True)])
def test_the_cls_token_sees_what_the_pattern_lets_it(attention, sees_far_tokens):
  """With window w and n layers the CLS token (position 0) reads positions ≤ n·w under a
  sliding window; a global CLS token and full attention read every position."""
  model = _model(attention=attention)
  tokens, lengths = _tokens(1, 1, 20), jnp.array([20])
  params = jax.jit(model.init)(jax.random.key(1), tokens, lengths)
  reach = SMALL["num_layers"] * SMALL["window"]            # in positions, CLS at 0
  apply = jax.jit(model.apply)
  base = apply(params, tokens, lengths)
  near = apply(params, tokens.at[0, reach - 1].set(3 + tokens[0, reach - 1] % 10), lengths)
  far = apply(params, tokens.at[0, reach + 2].set(3 + tokens[0, reach + 2] % 10), lengths)
  assert np.abs(near - base).max() > 1e-4
  assert (np.abs(far - base).max() > 1e-4) == sees_far_tokens


@pytest.mark.slow
def test_bfloat16_products_give_float32_logits_close_to_float32():
  tokens, lengths = _tokens(2, 2, 16), jnp.array([16, 11])
  params = jax.jit(_model(num_layers=1).init)(jax.random.key(2), tokens, lengths)
  full = jax.jit(_model(num_layers=1).apply)(params, tokens, lengths)
  half = jax.jit(_model(num_layers=1, dtype="bfloat16").apply)(params, tokens, lengths)
  assert half.dtype == jnp.float32
  np.testing.assert_allclose(half, full, atol=0.1)


@pytest.mark.parametrize("field,value", [("attention", "routing"), ("positions", "rotary"),
                                         ("norm", "sandwich"), ("pooling", "max")])
def test_bad_names_list_the_allowed_ones(field, value):
  tokens = _tokens(3, 1, 8)
  with pytest.raises(ValueError, match=f"{field} must be one of"):
    _model(**{field: value}).init(jax.random.key(0), tokens, jnp.array([8]))
