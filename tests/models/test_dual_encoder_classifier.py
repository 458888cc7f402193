"""The two-tower classifier is LRA's `classifier_head_dual` over one shared stack: each
document encoded alone (its own length, the other's padding unseen), pooled, and
[u, v, u ⊙ v, u − v] through a ReLU MLP, written out here in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.block_stack import BlockStack
from research.models.dual_encoder_classifier import DualEncoderClassifier

pytestmark = pytest.mark.usefixtures("highest_precision")

FIELDS = dict(num_layers=1, hidden_size=8, num_heads=2, mlp_size=12, max_length=10,
              positions="learned", norm="pre")


def test_logits_are_the_dual_head_over_each_document_encoded_alone(pooling="mean"):
  model = DualEncoderClassifier(**FIELDS, vocab_size=9, num_classes=2, pooling=pooling)
  rng = np.random.default_rng(0)
  lengths = np.array([[10, 4], [7, 9], [1, 10]], np.int32)
  tokens = rng.integers(1, 9, (3, 2, 10)).astype(np.int32)
  tokens[np.arange(10) >= lengths[..., None]] = 0
  params = jax.jit(model.init)(jax.random.key(0), tokens, lengths)["params"]
  logits = np.asarray(jax.jit(model.apply)({"params": params}, tokens, lengths))

  stack = BlockStack(**FIELDS, vocab_size=9, cls=pooling == "cls")
  encode = jax.jit(lambda t, n: stack.apply({"params": params["stack"]}, t, n))
  pooled = []
  for document in range(2):    # each document alone: batch 3, its own lengths
    x = np.asarray(encode(tokens[:, document], lengths[:, document]))
    real = np.arange(10)[None, :] < lengths[:, document, None]
    pooled.append(x[:, 0] if pooling == "cls"
                  else (x * real[..., None]).sum(1) / lengths[:, document, None])
  u, v = pooled
  features = np.concatenate([u, v, u * v, u - v], -1)
  hidden = np.maximum(features @ params["mlp"]["kernel"] + params["mlp"]["bias"], 0)
  expected = hidden @ params["head"]["kernel"] + params["head"]["bias"]
  assert logits.dtype == np.float32 and logits.shape == (3, 2)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  swapped = np.asarray(jax.jit(model.apply)({"params": params}, tokens[:, ::-1],
                                            lengths[:, ::-1]))
  assert np.abs(swapped - logits).max() > 1e-4     # u − v: the pair is ordered


def test_a_batch_of_single_documents_is_refused():
  model = DualEncoderClassifier(**FIELDS, vocab_size=9, num_classes=2)
  with pytest.raises(ValueError, match=r"tokens \[B, 2, L\] and lengths \[B, 2\]"):
    model.init(jax.random.key(0), jnp.ones((3, 10), jnp.int32), jnp.full((3,), 10))
