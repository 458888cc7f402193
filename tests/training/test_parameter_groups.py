"""train.recurrence_learning_rate: the recurrences' own parameters and the norms' take Adam
at that rate without weight decay, the rest AdamW at learning_rate (S5's "ssm" and
"regular" groups), each update equal to optax's own optimizer applied to its group alone;
and a config.json written before a key was added resumes as the key's old meaning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.models import SequenceModel
from research.training.config import base_config
from research.training.train_step import (
  learning_rate_schedule,
  make_optimizer,
  parameter_group,
)
from research.training.workdir import config_changes


@pytest.mark.parametrize("kind, slow", [
    pytest.param("lru", {"nu_log", "theta_log", "gamma_log", "scale", "bias"},
                 marks=pytest.mark.long),
    ("s5", {"Lambda_re", "Lambda_im", "log_step", "scale", "bias"}),
    ("mamba", {"A_log", "dt_bias", "scale", "bias"})])
def test_each_group_steps_as_optax_alone_on_it(kind, slow):
  model = SequenceModel(kind=kind, num_outputs=1, hidden_size=8, num_layers=2, state_size=4,
                        mlp_size=8)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 3)), jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), x)["params"]
  grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, x) ** 2)))(params)
  train = base_config().train
  train.update(learning_rate=3e-3, recurrence_learning_rate=1e-3, weight_decay=0.04,
               warmup_steps=0, grad_clip_norm=0.0, num_steps=100)
  optimizer = make_optimizer(train)
  updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
  groups = jax.tree_util.tree_map_with_path(lambda path, _: parameter_group(path), params)
  names = {getattr(path[-1], "key", None) for path, group in
           jax.tree_util.tree_flatten_with_path(groups)[0] if group == "recurrence"}
  assert names == slow
  fast = optax.adamw(3e-3, b2=train.adam_b2, weight_decay=0.04)
  adam = optax.adam(1e-3, b2=train.adam_b2)
  want_fast, _ = jax.jit(fast.update)(grads, fast.init(params), params)
  want_slow, _ = jax.jit(adam.update)(grads, adam.init(params), params)
  for (path, update), fast_leaf, slow_leaf, group in zip(
      jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(want_fast),
      jax.tree.leaves(want_slow), jax.tree.leaves(groups), strict=True):
    want = slow_leaf if group == "recurrence" else fast_leaf
    np.testing.assert_allclose(update, want, rtol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_without_the_rate_every_parameter_is_one_adamw():
  train = base_config().train
  assert train.recurrence_learning_rate == 0.0
  params = {"lru": {"nu_log": jnp.ones(3)}, "w": jnp.ones(2)}
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = make_optimizer(train).update(grads, make_optimizer(train).init(params), params)
  reference = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(learning_rate_schedule(train), b2=train.adam_b2,
                                      weight_decay=0.0))
  want, _ = reference.update(grads, reference.init(params), params)
  jax.tree.map(np.testing.assert_allclose, updates, want)


def test_a_config_written_before_a_key_was_added_is_the_same_config():
  new = {"model": {"kind": "lru", "positions": "sinusoidal", "mixer_gate": "none"},
         "train": {"recurrence_learning_rate": 0.0}}
  old = {"model": {"kind": "lru"}, "train": {}}
  assert config_changes(old, new, "w") == ""
  changed = {**new, "model": {**new["model"], "positions": "none"}}
  assert config_changes(old, changed, "w") == (
      "config.model.positions 'sinusoidal' there, 'none' now")
