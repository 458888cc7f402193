"""The mqar experiment: its presets against Zoology's Figure 2 configs, the sweep, one-line
refusals before anything is built, the loss and accuracy against a hand computation over
the whole sequence's logits, and a model of each family learning."""

import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tiers import long_cases

from research import experiments
from research.experiments import mqar
from research.training.config import ConfigError, apply_overrides
from research.training.loop import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import mqar as experiment  # noqa: E402

SMALL = {"data.length": 16, "data.num_pairs": 4, "data.vocab_size": 32,
         "data.train_examples": 256, "data.eval_examples": 20, "train.batch_size": 8}


def small_config(arg="preset=cpu", **overrides):
  return apply_overrides(experiment.get_config(arg), {**SMALL, **overrides})


def test_the_zoology_preset_is_figure_2s_grid():
  """zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py: (128, 8), (64, 4),
  (256, 16) and (512, 64) at batch 512, 512, 256 and 128; d_model 64 … 512; lr
  np.logspace(-4, -2, 4); 100 000 / 3 000 examples of an 8 192-token vocabulary; 64
  epochs; two layers, one attention head."""
  config = experiment.get_config("preset=zoology")
  panels = {(length, pairs): (batch, steps) for length, pairs, batch, steps in config.sweep.panels}
  assert panels == {(64, 4): (512, 12_500), (128, 8): (512, 12_500), (256, 16): (256, 25_000),
                    (512, 64): (128, 50_000)}
  assert tuple(config.sweep.widths) == (64, 128, 256, 512)
  for rates in config.sweep.rates.values():
    np.testing.assert_allclose(rates, [1e-4, 10 ** (-4 + 2 / 3), 10 ** (-4 + 4 / 3), 1e-2])
  assert (config.data.vocab_size, config.data.train_examples, config.data.eval_examples,
          config.data.power, config.data.random_non_queries) == (8192, 100_000, 3_000, 0.01,
                                                                  False)
  assert (config.model.num_layers, config.model.num_heads, config.model.tie_embeddings) == (
      2, 1, True)
  assert len(experiment.get_sweep(config)) == 4 * 4 * 4 * len(experiment.MODELS)


@pytest.mark.parametrize("preset", ["cpu", "zoology"])
def test_every_point_of_the_sweep_validates_as_its_own_model(preset):
  config = experiment.get_config(f"preset={preset}")
  points = experiment.get_sweep(config)
  model = lambda p: p["model.attention"] if p["model.kind"] == "transformer" else p["model.kind"]
  assert {model(point) for point in points} == set(experiment.MODELS)
  for point in points[:len(experiment.MODELS) * 2]:       # the first width of the first panel
    validate(apply_overrides(config, point), experiments.get("mqar"))
  for point in points:
    assert point["train.learning_rate"] in config.sweep.rates[experiment.family(model(point))]


def test_the_sweep_reads_its_grid_from_the_config():
  config = apply_overrides(experiment.get_config("preset=cpu"),
                           {"sweep.models": ("full", "gru"), "sweep.widths": (64,)})
  points = experiment.get_sweep(config)
  assert [(p["model.kind"], p["train.learning_rate"]) for p in points[:4]] == [
      ("transformer", 1e-3), ("transformer", 3e-3), ("gru", 3e-3), ("gru", 1e-2)]
  assert len(points) == 2 * 2 * len(config.sweep.panels)
  with pytest.raises(ConfigError, match=r"config.sweep.models: \['hyena'\] are not models"):
    experiment.get_sweep(apply_overrides(config, {"sweep.models": ("hyena",)}))


@pytest.mark.parametrize("overrides, message", [
    ({"data.num_pairs": 5}, "config.data.length=16, num_pairs=5, vocab_size=32: 5 pairs need "
                            "a length of at least 4 × 5 = 20"),
    ({"data.vocab_size": 9}, "vocab_size=9: 4 distinct keys need a vocabulary of at least "
                             "2 × \\(4 \\+ 1\\) = 10"),
    ({"data.length": 0}, "config.data.length=0 must be a number > 0"),
    ({"data.power": -1.0}, "config.data.power=-1.0 must be a number > 0"),
    ({"data.power": math.nan}, r"config.data.power=nan must be a finite number \(not inf"),
    ({"data.train_examples": 4}, "config.data.train_examples=4 must be at least "
                                 "config.train.batch_size=8"),
    ({"model.kind": "transformer", "model.attention": "linformer"},
     "attention 'linformer' cannot be causal"),
    ({"model.kind": "gru", "model.embed_size": 16, "model.hidden_size": 32},
     "config.model.tie_embeddings with kind 'gru' needs config.model.embed_size=16 equal to "
     "config.model.hidden_size=32"),
    ({"model.kind": "linear_cell", "model.state_size": 48},
     "config.model.state_size=48 must divide config.model.hidden_size=64"),
    ({"model.kind": "deltanet", "model.state_size": 48},
     r"config.model.hidden_size: state_size=48 \(the heads' size\) must divide the width, 64"),
    ({"model.kind": "mamba2", "model.recurrence.mamba2.head_dim": 48},
     "config.model.hidden_size: head_dim must divide"),
    ({"model.mlp_size": -1}, "config.model.mlp_size=-1 must be a number >= 0"),
    ({"model.kind": "hyena"}, "config.model.kind='hyena' is not allowed"),
    ({"data.train_examples": 10**9}, "host"),
])
def test_bad_values_are_one_line_before_anything_is_built(overrides, message):
  config = small_config(**overrides)
  with pytest.raises(ConfigError, match=message) as error:
    validate(config, experiments.get("mqar"))
  assert "\n" not in str(error.value)


def test_loss_and_accuracy_are_the_queries_cross_entropy_and_argmax():
  """The workload's metrics from the logits at the query positions equal NumPy's from the
  model's logits over the whole sequence, read at those positions."""
  config = small_config(**{"model.hidden_size": 16})
  workload = mqar.build(config)
  params = workload.init(jax.random.key(0))
  batch = workload.eval_data[0]
  model = mqar.make_model(config)
  full, _ = model.apply({"params": params}, jnp.asarray(batch["inputs"]))
  full = np.asarray(full, np.float64)                              # [B, L, V]
  rows = np.arange(len(batch["inputs"]))[:, None]
  logits = full[rows, batch["positions"]]                          # [B, N, V]
  log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
                          ) - logits.max(-1, keepdims=True)
  cross_entropy = -np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
  correct = logits.argmax(-1) == batch["targets"]
  metrics = workload.evaluate(params, {k: jnp.asarray(v) for k, v in batch.items()})
  np.testing.assert_allclose(metrics["loss"][0], cross_entropy.sum(1), rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"][0], correct.sum(1))
  np.testing.assert_allclose(metrics["loss"][1], config.data.num_pairs)


def test_the_training_set_is_fixed_and_the_evaluation_set_apart():
  config = small_config()
  first, again = mqar.build(config), mqar.build(config)
  epoch = config.data.train_examples // config.train.batch_size
  seen = [next(first.train_data)["inputs"] for _ in range(epoch)]
  assert np.array_equal(seen[0], next(again.train_data)["inputs"])
  train = {tuple(row) for batch in seen for row in batch}
  assert len(train) == config.data.train_examples
  assert {tuple(row) for row in next(first.train_data)["inputs"]} <= train   # epoch 2
  evaluation = {tuple(row) for batch in first.eval_data for row in batch["inputs"]}
  assert not evaluation & train


@pytest.mark.slow
@pytest.mark.parametrize("model", long_cases(  # three in the long tier
    ["full", "performer", "linear_cell", "lru", "mamba", "gru"], ("performer", "lru", "mamba")))
def test_a_model_of_each_family_learns(model):
  """60 AdamW steps lower the loss of a model of each family by a tenth at least."""
  overrides = {key: value for key, value in experiment.model_keys(model, 16).items()}
  config = small_config(f"preset=cpu,model={model},width=16", **overrides)
  workload = mqar.build(config)
  params = workload.init(jax.random.key(0))
  optimizer = optax.adamw(3e-3)
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, batch):
    (loss, _), grads = jax.value_and_grad(workload.loss, has_aux=True)(params, batch,
                                                                      jax.random.key(1))
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  losses = []
  for _ in range(60):
    batch = {k: jnp.asarray(v) for k, v in next(workload.train_data).items()}
    params, state, loss = step(params, state, batch)
    losses.append(float(loss))
  assert math.isfinite(losses[-1])
  assert np.mean(losses[-10:]) < 0.9 * np.mean(losses[:5])
