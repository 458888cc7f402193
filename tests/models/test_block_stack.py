"""The one stack of blocks: SequenceModel, LanguageModel and EncoderClassifier hold the same
parameter tree under "stack" (a BlockStack's); in each of them Performer's features,
Reformer's rotations and BigBird's random blocks are drawn per layer (the two layers' draws
are compared); an attention that cannot be causal is refused in a causal model, naming the
ones that can; without positions, attention cannot tell the order of its inputs."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import EncoderClassifier, LanguageModel, SequenceModel
from research.models.block_stack import BlockStack

L = 64                                             # 16 blocks of 4 positions
COMMON = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_size=24, block_size=4,
              num_features=8, implementation="dense", max_length=L)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(1, 256, (1, L)), jnp.int32)


def models(attention: str = "full") -> dict:
  """name: (a 2-block model of each kind with `attention`, its inputs), vocabulary 256."""
  fields = {**COMMON, "attention": attention}
  return {"SequenceModel": (SequenceModel(kind="transformer", num_outputs=3, vocab_size=256,
                                          **fields), (TOKENS,)),
          "LanguageModel": (LanguageModel(kind="transformer", **fields), (TOKENS,)),
          "EncoderClassifier": (EncoderClassifier(vocab_size=256, num_classes=3, pooling="mean",
                                                  **fields), (TOKENS, jnp.array([L])))}


def shapes(tree):
  return jax.tree.map(lambda x: x.shape, tree)


def test_the_three_models_hold_one_stacks_parameters():
  stack = BlockStack(**COMMON, vocab_size=256)
  expected = shapes(jax.eval_shape(stack.init, jax.random.key(0), TOKENS)["params"])
  assert set(expected) == {"embed", "block0", "block1", "final_norm"}
  for name, (model, inputs) in models().items():
    params = jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]
    assert set(params) == {"stack", "head"}, name
    assert shapes(params["stack"]) == expected, name


@pytest.mark.slow
@pytest.mark.parametrize("module, draw", [("performer", "orthogonal_random_features"),
                                          ("reformer", "lsh_rotations")])
@pytest.mark.parametrize("name", ["SequenceModel", "LanguageModel", "EncoderClassifier"])
def test_performer_and_reformer_draw_per_layer(name, module, draw, monkeypatch):
  """Each layer's attention draws its own random projection (Performer's W [m, d]) or
  rotations (Reformer's): the two layers' draws, recorded as the model is initialised,
  differ."""
  source = importlib.import_module(f"research.attention.{module}")
  original, drawn = getattr(source, draw), []
  monkeypatch.setattr(source, draw, lambda *args, **kwargs: drawn.append(
      original(*args, **kwargs)) or drawn[-1])
  model, inputs = models(module)[name]

  def draws(key):            # the draws traced while initialising, returned by the compiled init
    drawn.clear()
    model.init(key, *inputs)
    return list(drawn)

  drawn_values = jax.jit(draws)(jax.random.key(0))
  assert len(drawn_values) == 2 and drawn_values[0].shape == drawn_values[1].shape
  assert not np.allclose(drawn_values[0], drawn_values[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SequenceModel", "LanguageModel", "EncoderClassifier"])
def test_bigbird_draws_its_random_blocks_per_layer(name):
  """The key positions each query sees (the nonzero attention weights, sown by the dense
  implementation) differ between the two layers: their random blocks differ."""
  model, inputs = models("bigbird")[name]
  variables = jax.jit(model.init)(jax.random.key(0), *inputs)
  _, state = jax.jit(lambda v: model.apply(v, *inputs, mutable=["intermediates"]))(variables)
  stack = state["intermediates"]["stack"]
  seen = [np.asarray(stack[f"block{i}"]["attention"]["attention_weights"][0]) > 0
          for i in range(2)]                               # [B, H, L, L] each
  assert seen[0].shape == (1, 2, L, L)
  assert not np.array_equal(seen[0], seen[1])


@pytest.mark.parametrize("model", [
    LanguageModel(kind="transformer", hidden_size=8, attention="linformer", max_length=8),
    SequenceModel(kind="transformer", hidden_size=8, num_outputs=1, vocab_size=256,
                  attention="memory_compressed", causal=True)])
def test_a_causal_model_refuses_an_attention_that_cannot_be(model):
  with pytest.raises(ValueError, match=f"attention '{model.attention}' cannot be causal .*; a "
                                       "causal model takes one of full, local, longformer, "
                                       "sparse, bigbird, linear, performer, synthesizer, "
                                       "sinkhorn, reformer"):
    model.init(jax.random.key(0), TOKENS[:, :8])


@pytest.mark.parametrize("positions", ["none", "sinusoidal"])
def test_without_positions_attention_is_blind_to_the_order(positions):
  """Bidirectional full attention over token embeddings alone is permutation-equivariant:
  permuting the tokens permutes the features. Positions (sinusoidal) break that."""
  stack = BlockStack(**COMMON, vocab_size=256, positions=positions)
  params = stack.init(jax.random.key(0), TOKENS)
  order = np.random.default_rng(1).permutation(L)
  features = stack.apply(params, TOKENS)
  permuted = stack.apply(params, TOKENS[:, order])
  equal = np.allclose(permuted, np.asarray(features)[:, order], atol=1e-5)
  assert equal == (positions == "none")
