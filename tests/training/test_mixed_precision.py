"""--config.model.dtype=bfloat16 in every experiment: matrix products in bfloat16, parameters,
optimizer state and loss in float32, and training that learns like float32; float16's
products likewise (its loss scaling: test_loss_scale.py)."""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny

from research import experiments
from research.training.config import apply_overrides
from research.training.train_step import init_state, make_optimizer, make_train_step

sys.path.insert(0, os.path.join(tiny.ROOT, "experiments"))
import nmt_dates  # noqa: E402
from tiers import long_cases

pytestmark = pytest.mark.slow

NMT_TINY = {"data.train_examples": 256, "data.eval_examples": 32, "data.test_examples": 32,
            "model.embed_size": 16, "model.hidden_size": 32, "train.batch_size": 32,
            "train.learning_rate": 1e-2, "train.warmup_steps": 0}
EXPERIMENTS = {  # name: config with training settings for a short run (the recurrent layers
                 # in bfloat16: nmt_dates' encoder and decoder)
    "sequence_tasks transformer": lambda: tiny.config(**{
        "model.kind": "transformer", "data.length": 20, "model.num_heads": 2,
        "model.mlp_size": 64, "train.learning_rate": 3e-3}),
    "nmt_dates": lambda: apply_overrides(nmt_dates.get_config(), NMT_TINY),
}
STEPS = 50


def _train(config):
  """(per-step losses, final state) of STEPS plain train steps, without the workdir loop."""
  config = apply_overrides(config, {"train.num_steps": STEPS})
  task = experiments.get(config.experiment).build(config)
  optimizer = make_optimizer(config.train)
  state = jax.jit(lambda rng: init_state(task, optimizer, rng))(jax.random.key(0))
  step = jax.jit(make_train_step(task, optimizer, lambda s: 0.0, jax.random.key(1), None))
  losses = []
  for _ in range(STEPS):
    state, metrics = step(state, jax.tree.map(jnp.asarray, next(task.train_data)))
    losses.append(float(metrics["loss"]))
  return np.array(losses), state, task


@pytest.mark.long   # both its cases
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_bfloat16_learns_like_float32_and_keeps_float32_state(name):
  f32_losses, _, _ = _train(EXPERIMENTS[name]())
  bf16_losses, state, task = _train(apply_overrides(EXPERIMENTS[name](),
                                                    {"model.dtype": "bfloat16"}))
  first, last = np.mean(f32_losses[:5]), np.mean(f32_losses[-10:])
  assert last < 0.7 * first                                      # float32 learns
  assert np.mean(bf16_losses[-10:]) < last + 0.1 * (first - last)  # bfloat16 as far, or near
  assert {x.dtype for x in jax.tree.leaves((state.params, state.opt_state))
          if jnp.issubdtype(x.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}

  assert _products_and_loss_dtypes(task, state.params) == ("bf16", jnp.float32)


def _product_operand_dtypes(task, params) -> list[tuple[str, str]]:
  """The operands' dtypes of each matrix product of the loss, in program order."""
  batch = jax.tree.map(jnp.asarray, next(task.train_data))
  text = jax.jit(task.loss).lower(params, batch, jax.random.key(2)).as_text()
  return re.findall(r"dot_general.*\(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)", text)


def _loss_dtype(task, params) -> jnp.dtype:
  batch = jax.tree.map(jnp.asarray, next(task.train_data))
  return jax.eval_shape(task.loss, params, batch, jax.random.key(2))[0].dtype


def _products_and_loss_dtypes(task, params) -> tuple[str, jnp.dtype]:
  """(the operands' dtype of the loss's first three matrix products, the loss's dtype)."""
  (dtype,) = {x for pair in _product_operand_dtypes(task, params)[:3] for x in pair}
  return dtype, _loss_dtype(task, params)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_float16_is_accepted_and_runs_the_products_in_float16(name):
  """Training in float16 (dynamic loss scaling): tests/training/test_loss_scale.py."""
  config = apply_overrides(EXPERIMENTS[name](), {"model.dtype": "float16"})
  experiment = experiments.get(config.experiment)
  experiment.validate(config)
  task = experiment.build(config)
  params = jax.eval_shape(task.init, jax.random.key(0))
  assert _products_and_loss_dtypes(task, params) == ("f16", jnp.float32)


@pytest.mark.parametrize("kind", long_cases(list(tiny.SELECTIVE), ("mamba", "mamba2", "gla")))
def test_float16_runs_each_selective_recurrences_projections_in_float16_near_float32(kind):
  """Mamba, Mamba-2, GLA and DeltaNet in the block stack with model.dtype float16: their
  projections' products in float16 (the chunked recurrences' own products stay float32, as
  the layers' docstrings say: no product mixes the two), the loss float32, and the loss and
  its gradient those of float32 on the same parameters within float16's roundings (11-bit
  mantissas: relative 2⁻¹¹ a product's input, a few 10⁻³ through two blocks)."""
  config = tiny.selective_config(kind)
  full = experiments.get("mqar").build(config)
  half = experiments.get("mqar").build(tiny.selective_config(kind, **{"model.dtype": "float16"}))
  params = jax.jit(full.init)(jax.random.key(0))
  batch = jax.tree.map(jnp.asarray, next(full.train_data))
  products = _product_operand_dtypes(half, params)
  assert set(products) <= {("f16", "f16"), ("f32", "f32")}
  assert products.count(("f16", "f16")) >= 2 * config.model.num_layers   # in and out
  assert _loss_dtype(half, params) == jnp.float32
  (loss, _), grads = jax.jit(jax.value_and_grad(full.loss, has_aux=True))(params, batch,
                                                                           jax.random.key(2))
  (half_loss, _), half_grads = jax.jit(jax.value_and_grad(half.loss, has_aux=True))(
      params, batch, jax.random.key(2))
  np.testing.assert_allclose(half_loss, loss, rtol=2e-3)
  flat, half_flat = (jnp.concatenate([g.ravel() for g in jax.tree.leaves(t)])
                     for t in (grads, half_grads))
  assert bool(jnp.all(jnp.isfinite(half_flat)))
  assert float(jnp.linalg.norm(half_flat - flat) / jnp.linalg.norm(flat)) < 2e-2
