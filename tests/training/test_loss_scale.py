"""--config.model.dtype=float16: dynamic loss scaling (train_step.dynamic_loss_scale) in the
train step, against a float32 reference gradient, flax's DynamicScale and optax's
apply_if_finite; float32 and bfloat16 runs keep the bare optimizer; a skipped step's
non-finite metrics written as valid JSON."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tiny
from flax.training.dynamic_scale import DynamicScale

from research.training import train_step, workdir
from research.training.checkpoints import Checkpoints
from research.training.config import base_config
from research.training.experiment import Workload
from research.training.loop import train_and_evaluate
from research.training.train_step import init_state, make_optimizer, make_train_step

ROWS, FEATURES, CLASSES = 32, 8, 4


class _MLP(nn.Module):
  dtype: str

  @nn.compact
  def __call__(self, x):
    x = jnp.tanh(nn.Dense(16, dtype=self.dtype)(x))
    return nn.Dense(CLASSES, dtype=self.dtype)(x).astype(jnp.float32)


def _workload(dtype: str, weight: float = 1.0) -> Workload:
  """Cross-entropy of a two-layer MLP computing in `dtype`, times `weight`."""
  model = _MLP(dtype)

  def loss(params, batch, rng):
    del rng
    logits = model.apply({"params": params}, batch["x"])
    return weight * optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}

  init = lambda rng: model.init(rng, jnp.zeros((1, FEATURES)))["params"]
  return Workload(init, None, [], loss, None)


def _batch(seed: int = 0) -> dict:
  x = jax.random.normal(jax.random.key(seed), (ROWS, FEATURES))
  return {"x": x, "y": jax.random.randint(jax.random.key(seed + 1), (ROWS,), 0, CLASSES)}


def _recorder() -> optax.GradientTransformation:
  """An optimizer that applies nothing and keeps the last gradient it was given as its state."""
  return optax.GradientTransformation(lambda params: optax.tree.zeros_like(params),
                                      lambda grads, state, params=None: (
                                          optax.tree.zeros_like(grads), grads))


def _step(workload: Workload, optimizer: optax.GradientTransformation):
  return jax.jit(make_train_step(workload, optimizer, lambda step: 0.0, jax.random.key(1), None))


def test_the_unscaled_gradient_is_float32_s_and_would_underflow_without_the_scale():
  """A loss small enough (× 1e-6) that its float16 cotangents fall below float16's smallest
  subnormal (6e-8): at S = 1 most gradients flush to zero, at S = 2**15 they are float32's."""
  weight, batch = 1e-6, _batch()
  reference = _workload("float32", weight)
  loss_and_grad = jax.jit(jax.value_and_grad(lambda p: reference.loss(p, batch, None)[0]))
  optimizer = train_step.dynamic_loss_scale(_recorder())
  step = _step(_workload("float16", weight), optimizer)
  state = jax.jit(lambda rng: init_state(reference, optimizer, rng))(jax.random.key(0))
  expected_loss, expected = loss_and_grad(state.params)
  gradients = {}
  for scale in (train_step.INITIAL_SCALE, 1.0):
    after, metrics = step(state.replace(opt_state=state.opt_state._replace(
        scale=jnp.float32(scale))), batch)
    gradients[scale] = after.opt_state.inner_state
    assert int(after.opt_state.skipped_steps) == 0
    assert float(metrics["loss"]) == pytest.approx(float(expected_loss), rel=1e-2)
  for got, want in zip(jax.tree.leaves(gradients[train_step.INITIAL_SCALE]),
                       jax.tree.leaves(expected), strict=True):
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(jnp.abs(want).max()))
  kernel = lambda grads: np.asarray(grads["Dense_0"]["kernel"])
  assert np.mean(kernel(gradients[1.0]) == 0) > 0.5 > np.mean(kernel(expected) == 0)


def test_an_overflowing_step_is_skipped_and_counted_and_halves_the_scale():
  workload, batch = _workload("float16"), _batch()
  optimizer = make_optimizer(base_config().train, "float16")
  state = jax.jit(lambda rng: init_state(workload, optimizer, rng))(jax.random.key(0))
  step = _step(workload, optimizer)
  state, _ = step(state, batch)           # one update, so that Adam's moments are not zeros
  before = state.replace(opt_state=state.opt_state._replace(scale=jnp.float32(2.0**40)))
  after, metrics = step(before, batch)    # S·L's float16 cotangents overflow at S = 2**40
  assert not np.isfinite(float(metrics["grad_norm"]))
  assert np.isfinite(float(metrics["loss"]))      # the loop's NaN check does not stop it
  for old, new in zip(jax.tree.leaves((before.params, before.opt_state.inner_state)),
                      jax.tree.leaves((after.params, after.opt_state.inner_state)), strict=True):
    np.testing.assert_array_equal(np.atleast_1d(old).view(np.uint8), np.atleast_1d(new).view(np.uint8))
  assert (float(after.opt_state.scale), int(after.opt_state.skipped_steps),
          int(after.opt_state.finite_steps), int(after.step)) == (2.0**39, 1, 0, 2)
  assert (float(metrics["loss_scale"]), int(metrics["skipped_steps"])) == (2.0**39, 1)
  resumed, metrics = step(after.replace(opt_state=after.opt_state._replace(
      scale=jnp.float32(train_step.INITIAL_SCALE))), batch)
  assert np.isfinite(float(metrics["grad_norm"])) and int(resumed.opt_state.finite_steps) == 1
  assert not np.array_equal(resumed.params["Dense_0"]["kernel"], after.params["Dense_0"]["kernel"])


def test_the_scale_follows_flax_and_the_skips_optax_apply_if_finite():
  """A run of finite and non-finite gradients through our wrapper (period 3), flax's
  DynamicScale (which doubles on the step after growth_interval finite ones: 2) and optax's
  apply_if_finite around the same Adam: the same scales, skips, updates and Adam states."""
  finite = [1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1]
  inner = optax.adam(0.1)
  ours, theirs = train_step.dynamic_loss_scale(inner, period=3), optax.apply_if_finite(inner, 99)
  params = jnp.array([1.0, -2.0])
  our_state, their_state, dynamic = ours.init(params), theirs.init(params), DynamicScale(
      growth_interval=2, scale=train_step.INITIAL_SCALE)
  update_ours, update_theirs = jax.jit(ours.update), jax.jit(theirs.update)
  flax_step = jax.jit(lambda d, x: d.value_and_grad(lambda p: jnp.sum(p * x))(params))
  scales = []
  for i, ok in enumerate(finite):
    x = jnp.array([0.5 + i, jnp.inf if not ok else -1.0])    # the gradient of Σ p·x
    updates, our_state = update_ours(x, our_state, params)
    expected, their_state = update_theirs(x, their_state, params)
    dynamic = flax_step(dynamic, x).dynamic_scale
    assert float(our_state.scale) == float(dynamic.scale), i
    scales.append(float(our_state.scale) / train_step.INITIAL_SCALE)
    assert int(our_state.skipped_steps) == int(their_state.total_notfinite), i
    for got, want in zip(jax.tree.leaves((updates, our_state.inner_state)),
                         jax.tree.leaves((expected, their_state.inner_state)), strict=True):
      np.testing.assert_array_equal(got, want)
  assert scales == [1, 1, 2, 2, 2, 4, 2, 2, 2, 1, 0.5, 0.5, 0.5, 1, 1]   # doubled at 3 in a row
  assert int(our_state.skipped_steps) == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_dtypes_keep_adamws_state(dtype):
  """Their checkpoints (the TrainState's tree) are those written before loss scaling."""
  train, params = base_config().train, {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
  adamw = optax.chain(optax.clip_by_global_norm(train.grad_clip_norm),
                      optax.adamw(optax.constant_schedule(train.learning_rate)))
  want = jax.tree.structure(adamw.init(params))
  assert jax.tree.structure(make_optimizer(train, dtype).init(params)) == want
  assert jax.tree.structure(make_optimizer(train).init(params)) == want
  scaled = make_optimizer(train, "float16").init(params)
  assert isinstance(scaled, train_step.LossScaleState)
  assert jax.tree.structure(scaled.inner_state) == want


class _SpikedStream:
  """Wraps a stream so that each batch says (`spike`) whether its step is one of `spikes`."""

  def __init__(self, stream, spikes):
    self.stream, self.spikes, self.batch_size = stream, spikes, stream.batch_size

  def __next__(self):
    batch = next(self.stream)
    spiked = self.stream.get_state()["step"] in self.spikes
    return {**batch, "spike": np.full(self.batch_size, spiked, np.float32)}   # one per row

  def get_state(self):
    return self.stream.get_state()

  def set_state(self, state):
    self.stream.set_state(state)


def _spiked(spikes: set[int]):
  """The tiny task, its loss's gradient 1e10 times the real one at the steps of `spikes`
  (the loss's value unchanged): S·L's float16 cotangents overflow there."""
  task = tiny.task()

  def build(config):
    workload = task.build(config)

    def loss(params, batch, rng):
      value, aux = workload.loss(params, {k: v for k, v in batch.items() if k != "spike"}, rng)
      spike = 1e10 * batch["spike"].max()
      return value + spike * (value - jax.lax.stop_gradient(value)), aux

    return workload._replace(train_data=_SpikedStream(workload.train_data, spikes), loss=loss)

  return task._replace(build=build)


@pytest.mark.slow
def test_a_float16_run_logs_its_scale_and_skips_and_checkpoints_them(tmp_path):
  config = tiny.config(**{"model.dtype": "float16", "train.num_steps": 20,
                          "train.checkpoint_every": 20, "train.eval_every": 20})
  train_and_evaluate(config, str(tmp_path), _spiked({3, 12, 13}))
  records = [r for r in tiny.records(str(tmp_path)) if "train/loss" in r]
  assert [(r["step"], r["train/skipped_steps"], r["train/loss_scale"]) for r in records] == [
      (10, 1, 2.0**14), (20, 3, 2.0**12)]
  assert all(np.isfinite(r["train/loss"]) for r in records)
  like = jax.eval_shape(lambda rng: init_state(tiny.task().build(config), make_optimizer(
      config.train, "float16"), rng), jax.random.key(0))
  restored = Checkpoints(str(tmp_path / "checkpoints"), 3).restore_latest(like)
  assert restored.step == 20
  assert (float(restored.state.opt_state.scale), int(restored.state.opt_state.skipped_steps),
          int(restored.state.opt_state.finite_steps)) == (2.0**12, 3, 7)


def _strict(text: str):
  """json.loads as RFC 8259 reads it: NaN, Infinity and -Infinity are no JSON."""
  def refuse(token):
    raise ValueError(f"{token} is not JSON")
  return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_a_float16_runs_skipped_steps_write_valid_json_read_back_as_non_finite(tmp_path):
  """A skipped step's gradient norm is inf or NaN: the window's mean of train/grad_norm
  (logged at steps 10 and 20) and final_metrics.json hold it, as the string "inf" or "nan"."""
  config = tiny.config(**{"model.dtype": "float16", "train.num_steps": 20,
                          "train.checkpoint_every": 20, "train.eval_every": 20})
  final = train_and_evaluate(config, str(tmp_path), _spiked({3, 12}))
  strict = [_strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  logged = [r["train/grad_norm"] for r in strict if "train/grad_norm" in r]
  assert len(logged) == 2 and set(logged) <= {"inf", "nan"}, logged
  written = _strict((tmp_path / "final_metrics.json").read_text())
  assert written["train/grad_norm"] == logged[-1] and not np.isfinite(final["train/grad_norm"])
  read = workdir.read_json(str(tmp_path / "final_metrics.json"))        # the round trip
  assert read.keys() == final.keys()
  for key, value in final.items():
    assert read[key] == value or (np.isnan(value) and np.isnan(read[key])), key
  history = workdir.read_history(str(tmp_path))
  norms = [r["train/grad_norm"] for r in history if "train/grad_norm" in r]
  assert [str(norm) for norm in norms] == logged           # str(inf) == "inf": the same spelling
  assert all(np.isfinite(r["train/loss"]) for r in history if "train/loss" in r)
