"""The sequence_tasks experiment: config variants and sweep, validation errors, data streams,
evaluation against a hand computation, and a short training run."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.experiments import sequence_tasks
from research.training.config import ConfigError, apply_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import sequence_tasks as experiment  # noqa: E402

SMALL = {"data.length": 6, "data.num_symbols": 5, "data.num_items": 3, "data.eval_examples": 20,
         "model.hidden_size": 16, "model.mlp_size": 64, "train.batch_size": 8}


def small_config(arg=None, **overrides):
  return apply_overrides(experiment.get_config(arg), {**SMALL, **overrides})


@pytest.mark.parametrize("task", experiment.TASKS)
@pytest.mark.parametrize("model", ["rnn", "lstm", "gru", "transformer", "lru", "s5"])
def test_every_variant_validates(task, model):
  config = experiment.get_config(f"task={task},model={model},length=33")
  sequence_tasks.validate(config)
  assert (config.data.task, config.model.kind, config.data.length) == (task, model, 33)
  if model in ("lru", "s5"):      # the products of the adding problem need a second block
    assert config.model.num_layers >= 2


def test_default_config_is_the_adding_problem_with_an_lstm():
  config = experiment.get_config()
  assert (config.experiment, config.data.task, config.model.kind) == ("sequence_tasks", "adding", "lstm")
  assert config.data.length == experiment.TASKS["adding"]["length"]


@pytest.mark.parametrize("arg, message", [
    ("cell=gru", "unknown variant 'cell'.*allowed: task, model, length"),
    ("task=sort", "task='sort' is not allowed; choose one of: copy, reverse, adding, recall"),
    ("model=hyena", "model='hyena' is not allowed; choose one of: rnn, lstm, gru, transformer, "
                    "lru, s5"),
    ("length=-3", "length='-3' must be a positive int"),
    ("length=ten", "length='ten' must be a positive int"),
])
def test_bad_variant_arguments_are_named(arg, message):
  with pytest.raises(ConfigError, match=message):
    experiment.get_config(arg)


def test_sweep_covers_every_model_and_length_and_validates():
  points = experiment.get_sweep()
  assert len(points) == 30
  assert {(p["model.kind"], p["data.length"]) for p in points} == {
      (kind, length) for kind in ("rnn", "lstm", "gru", "transformer", "lru", "s5", "mamba",
                                  "mamba2", "gla", "deltanet")
      for length in experiment.SWEEP_LENGTHS}
  for point in points:       # each point trains as its model's own variant would
    config = apply_overrides(experiment.get_config(), point)
    sequence_tasks.validate(config)
    own = experiment.get_config(f"model={point['model.kind']},length={point['data.length']}")
    for key in ("model.num_layers", "model.state_size", "train.num_steps", "train.learning_rate"):
      section, field = key.split(".")
      assert config[section][field] == own[section][field], key


@pytest.mark.parametrize("overrides, message", [
    ({"data.task": "sort"}, "config.data.task='sort' is not allowed; choose one of: 'copy'"),
    ({"model.kind": "hyena"}, "config.model.kind='hyena' is not allowed; choose one of: 'rnn'"),
    ({"model.attention": "routing"}, "config.model.attention='routing' is not allowed; choose "
                                     "one of: 'full', 'local', 'longformer', 'sparse'"),
    ({"model.implementation": "flash"}, "config.model.implementation='flash' is not allowed; "
                                        "choose one of: 'auto', 'dense', 'chunked', 'banded'"),
    ({"model.dtype": "float8"}, "config.model.dtype='float8' is not allowed; choose one of: "
                                "'float32', 'bfloat16', 'float16'"),
    ({"data.length": 0}, "config.data.length=0 must be a number > 0"),
    ({"data.num_symbols": -1}, "config.data.num_symbols=-1 must be a number > 0"),
    ({"data.num_items": 0}, "config.data.num_items=0 must be a number > 0"),
    ({"data.eval_examples": 0}, "config.data.eval_examples=0 must be a number > 0"),
    ({"model.hidden_size": 0}, "config.model.hidden_size=0 must be a number > 0"),
    ({"model.num_layers": 0}, "config.model.num_layers=0 must be a number > 0"),
    ({"model.num_heads": 0}, "config.model.num_heads=0 must be a number > 0"),
    ({"model.window": 0}, "config.model.window=0 must be a number > 0"),
    ({"model.mlp_size": -1}, "config.model.mlp_size=-1 must be a number >= 0"),
    ({"model.dropout_rate": 1.0}, "config.model.dropout_rate=1.0 must be in [0, 1)"),
    ({"model.state_size": 0}, "config.model.state_size=0 must be a number > 0"),
    ({"model.recurrence.lru.r_min": 1.5}, "config.model.recurrence: lru: need 0 <= r_min < "
                                          "r_max <= 1, got r_min=1.5"),
    ({"model.recurrence.s5.dt_min": 0.5}, "config.model.recurrence: s5: need 0 < dt_min <= "
                                          "dt_max <= 174, got dt_min=0.5"),
    ({"model.recurrence.lru.mode": "fast"}, "config.model.recurrence: lru: mode must be one of "
                                            "('parallel', 'stepwise'), got 'fast'"),
    ({"model.kind": "s5", "model.recurrence.s5.blocks": 3},
     "config.model.recurrence: s5: state_size must be a multiple of 2 × blocks = 6"),
    ({"data.task": "adding", "data.length": 1}, "config.data.length=1 must be >= 2 for the "
                                                "adding problem"),
    ({"data.task": "recall", "data.num_items": 6}, "config.data.num_items=6 must be <= "
                                                   "config.data.num_symbols=5"),
    ({"model.kind": "transformer", "model.num_heads": 3}, "config.model.num_heads=3 must divide "
                                                          "config.model.hidden_size=16"),
    ({"model.kind": "transformer", "model.attention": "linformer", "model.causal": True},
     "config.model.attention: attention 'linformer' cannot be causal (a key position mixes "
     "later positions); a causal model takes one of full, local, longformer, sparse, bigbird, "
     "linear, performer, synthesizer, sinkhorn, reformer"),
])
def test_bad_values_are_named(overrides, message):
  config = small_config()
  with pytest.raises(ConfigError) as error:
    sequence_tasks.validate(apply_overrides(config, overrides))
  assert message in str(error.value)


@pytest.mark.parametrize("task", experiment.TASKS)
def test_streams_are_deterministic_and_evaluation_is_held_apart(task):
  config = small_config(f"task={task}")
  build = sequence_tasks.build(config)
  first, again = next(build.train_data), next(sequence_tasks.build(config).train_data)
  np.testing.assert_array_equal(first["inputs"], again["inputs"])
  assert first["inputs"].shape[0] == config.train.batch_size
  eval_data = build.eval_data
  assert len(eval_data) == 3 and all(b["inputs"].shape[0] == 8 for b in eval_data)
  assert [b["weight"].sum() for b in eval_data] == [8, 8, 4]
  assert not np.array_equal(eval_data[0]["inputs"], first["inputs"])


def log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


# evaluate / loss recompute the forward pass; compared within 1e-5: float32 products, not TF32
@pytest.mark.slow
@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("task, kind", [("copy", "gru"), ("reverse", "rnn"), ("adding", "lstm"),
                                        ("recall", "transformer")])
def test_evaluate_and_loss_match_a_hand_computation(task, kind):
  config = small_config(f"task={task},model={kind}")
  build = sequence_tasks.build(config)
  model = sequence_tasks.make_model(config)
  params = jax.jit(build.init)(jax.random.key(1))
  batch = build.eval_data[0]

  @jax.jit
  def run(params, batch):
    outputs = model.apply({"params": params}, batch["inputs"])
    return outputs, build.evaluate(params, batch), build.loss(params, batch, None)

  outputs, metrics, (loss, train_metrics) = run(params, batch)
  outputs, targets = np.asarray(outputs), batch["targets"]
  if task == "adding":
    error = outputs[:, 0] - targets
    expected = {"loss": (error ** 2, np.ones(8)), "mse": (error ** 2, np.ones(8)),
                "accuracy": (np.abs(error) < 0.04, np.ones(8))}
  else:
    scored = outputs[:, None] if task == "recall" else outputs[:, -targets.shape[1]:]
    labels = targets[:, None] if task == "recall" else targets
    k = labels.shape[1]
    picked = np.take_along_axis(log_softmax(scored), labels[..., None], -1)[..., 0]
    correct = scored.argmax(-1) == labels
    expected = {"loss": (-picked.sum(1), np.full(8, k)),
                "accuracy": (correct.sum(1), np.full(8, k))}
    if task != "recall":
      expected["exact_match"] = (correct.all(1), np.ones(8))
  assert set(metrics) == set(expected)
  for name, (numerator, denominator) in expected.items():
    np.testing.assert_allclose(metrics[name][0], numerator, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics[name][1], denominator)
  assert loss == pytest.approx(expected["loss"][0].sum() / expected["loss"][1].sum(), rel=1e-5)
  assert set(train_metrics) == set(expected) - {"loss"}


@pytest.mark.slow
def test_fifty_adamw_steps_reduce_the_loss():
  config = small_config("task=adding,model=lstm", **{"train.batch_size": 32})
  build = sequence_tasks.build(config)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 50)))
  params = jax.jit(build.init)(jax.random.key(0))
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, batch):
    (loss, _), grads = jax.value_and_grad(build.loss, has_aux=True)(params, batch, None)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  eval_loss = jax.jit(lambda params: build.loss(params, build.eval_data[0], None)[0])
  before = eval_loss(params)
  for _ in range(50):
    params, state, _ = step(params, state, jax.tree.map(jnp.asarray, next(build.train_data)))
  assert eval_loss(params) < 0.5 * before


@pytest.mark.parametrize("task", ["copy", "adding"])
def test_the_blocks_attention_is_sized_for_the_tasks_inputs(task):
  """Linformer's projection E [proj_len, max_length] of every block spans the task's inputs
  (copy: K + T + 1 + K tokens, adding: T), the length the experiment passes the model."""
  config = small_config(f"task={task},model=transformer", **{"model.attention": "linformer",
                                                              "model.proj_len": 4})
  sequence_tasks.validate(config)
  build = sequence_tasks.build(config)
  params = jax.eval_shape(build.init, jax.random.key(0))
  length = {"copy": 3 + 6 + 1 + 3, "adding": 6}[task]
  assert next(build.train_data)["inputs"].shape[1] == length
  assert params["stack"]["block0"]["attention"]["e"].shape == (4, length)
