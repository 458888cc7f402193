"""Train state, optimizer (AdamW, warm-up, decay, clipping; dynamic loss scaling for
float16) and the pure update and evaluation steps."""

from collections.abc import Callable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import lax

from research.training.experiment import Workload


@flax.struct.dataclass
class TrainState:
  step: jax.Array                 # int32 scalar: updates applied so far
  params: Any
  opt_state: Any


SCHEDULES = ("cosine", "rsqrt")   # config.train.schedule
# Random bits by platform: a TPU draws them with its hardware generator (XLA's
# RngBitGenerator); threefry's hash, compiled for a TPU, tripled the compile time of LRA's
# ListOps step with dropout (103 s against 36 s for a v5e chip, measured deviceless).
KEY_IMPLS = {"tpu": "rbg"}


def root_key(seed: int, platform: str) -> jax.Array:
  """The run's key for devices of `platform` (threefry, or RBG on a TPU: `KEY_IMPLS`)."""
  return jax.random.key(seed, impl=KEY_IMPLS.get(platform))


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warm-up from 0 to `learning_rate` over `warmup_steps`, then

    cosine   cosine decay to 0 at `num_steps`
    rsqrt    learning_rate · sqrt(warmup_steps / step) (Vaswani et al.; LRA's
             "linear_warmup * rsqrt_decay" with peak constant / sqrt(warmup_steps))
  """
  if train.schedule == "rsqrt":
    warmup = max(train.warmup_steps, 1)
    return lambda step: train.learning_rate * jnp.minimum(step / warmup,
                                                          jnp.sqrt(warmup / jnp.maximum(step, 1)))
  return optax.warmup_cosine_decay_schedule(
      0.0, train.learning_rate, train.warmup_steps, max(train.num_steps, train.warmup_steps + 1))


# The linear recurrences' own parameters (LRU: λ's ν, θ and γ; S5: Λ and the time step;
# Mamba and Mamba-2: A and Δ's bias, which their reference code keeps from weight decay) and
# every LayerNorm's: S5's "ssm" group, which a recurrence_learning_rate > 0 trains apart.
RECURRENCE_PARAMS = ("nu_log", "theta_log", "gamma_log", "Lambda_re", "Lambda_im", "log_step",
                     "A_log", "dt_bias")


def parameter_group(path) -> str:
  """"recurrence" for a leaf of RECURRENCE_PARAMS or of a module named *norm, else "rest"."""
  names = [getattr(key, "key", str(key)) for key in path]
  return ("recurrence" if names[-1] in RECURRENCE_PARAMS or any(
      name.endswith("norm") for name in names[:-1]) else "rest")


def make_optimizer(train: ml_collections.ConfigDict,
                   dtype: str = "float32") -> optax.GradientTransformation:
  """AdamW (β₂ = adam_b2) on the schedule, after clipping the global gradient norm (if
  grad_clip_norm > 0); for a model of `dtype` float16 (config.model.dtype) wrapped in
  dynamic loss scaling (`dynamic_loss_scale`), whose state holds the loss scale.

  With train.recurrence_learning_rate > 0 the recurrences' own parameters and the norms'
  (`parameter_group`) take Adam at that peak rate on the same schedule, without weight
  decay (S5's and the LRU papers' recipes: 1e-3 there, 3e-3 for the rest in S5's ListOps)."""
  adamw = optax.adamw(learning_rate_schedule(train), b2=train.adam_b2,
                      weight_decay=train.weight_decay)
  rate = train.get("recurrence_learning_rate", 0.0)
  if rate:
    slow = optax.adam(learning_rate_schedule(ml_collections.ConfigDict(
        {**train.to_dict(), "learning_rate": rate})), b2=train.adam_b2)
    adamw = optax.multi_transform(
        {"rest": adamw, "recurrence": slow},
        lambda params: jax.tree_util.tree_map_with_path(lambda path, _: parameter_group(path),
                                                        params))
  if train.grad_clip_norm > 0:
    adamw = optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adamw)
  return dynamic_loss_scale(adamw) if dtype == "float16" else adamw


def init_state(workload: Workload, optimizer: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  params = workload.init(rng)
  return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def microbatches(batch, count: int):
  """The batch's rows as `count` microbatches [count, B / count, ...]: microbatch i holds
  rows i, i + count, i + 2·count, … so that each device's rows of a batch split over the
  devices (contiguous blocks of B / devices rows, a multiple of count) split in place."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // count, count, *x.shape[1:])
                      .swapaxes(0, 1), batch)


def accumulated_gradients(loss: Callable, loss_weight: Callable | None, count: int) -> Callable:
  """gradients(params, batch, rng) -> ((loss, metrics), grads) of `loss` over a batch.

  With count = 1 that is jax.value_and_grad(loss). With count = k the batch is cut into k
  microbatches (`microbatches`), whose gradients are computed one after another in a
  lax.scan (one microbatch's activations in memory at a time) and averaged, each weighted
  by w_i = loss_weight(microbatch_i) (the count the loss's sum is divided by, e.g. target
  tokens; 1 for every microbatch when None):

    g = Σ_i w_i · ∇L_i / Σ_i w_i,   L_i = S_i / w_i   ⇒   g = ∇(Σ_i S_i / Σ_i w_i)

  the gradient of the whole batch's loss, and the loss and metrics likewise. Microbatch i
  draws its randomness from fold_in(rng, i): dropout masks differ from the whole batch's,
  and a statistic over the batch inside the loss (nmt_dates' REINFORCE baseline) is taken
  per microbatch.
  """
  value_and_grad = jax.value_and_grad(loss, has_aux=True)
  if count == 1:
    return value_and_grad

  def gradients(params, batch, rng):
    def add(totals, index_and_microbatch):
      index, microbatch = index_and_microbatch
      found = value_and_grad(params, microbatch, jax.random.fold_in(rng, index))
      weight = (jnp.ones((), jnp.float32) if loss_weight is None
                else loss_weight(microbatch).astype(jnp.float32))
      sums, weights = totals
      return (jax.tree.map(lambda t, x: t + weight * x, sums, found), weights + weight), None

    parts = microbatches(batch, count)
    shapes = jax.eval_shape(value_and_grad, params, jax.tree.map(lambda x: x[0], parts), rng)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    (sums, weights), _ = lax.scan(add, (zeros, jnp.zeros((), jnp.float32)),
                                  (jnp.arange(count), parts))
    return jax.tree.map(lambda t: t / weights, sums)

  return gradients


def make_train_step(workload: Workload, optimizer, schedule, rng: jax.Array, axis_name: str | None,
                    grad_accum_steps: int = 1,
                    on_trace: Callable[[], None] | None = None) -> Callable:
  """step(state, batch) -> (state, metrics): one update from the batch, its gradient
  accumulated over `grad_accum_steps` microbatches (`accumulated_gradients`). The key of
  step n is fold_in(rng, n), so a resumed run draws the same dropout masks; under pmap each
  device folds in its index.

  With dynamic loss scaling (a `LossScaleState`) the gradients are those
  of S·loss, S read from the state, divided by S; the metrics add loss_scale and
  skipped_steps after the update (a skipped step's grad_norm is inf or NaN). `on_trace()`,
  where given, is called each time the step is traced (the loop counts retraces)."""

  def step(state: TrainState, batch):
    if on_trace is not None:
      on_trace()
    step_rng = jax.random.fold_in(rng, state.step)
    if axis_name is not None:
      step_rng = jax.random.fold_in(step_rng, lax.axis_index(axis_name))
    scale = scale_of(state.opt_state)
    loss_fn = workload.loss if scale is None else scaled(workload.loss, scale)
    gradients = accumulated_gradients(loss_fn, workload.loss_weight, grad_accum_steps)
    (loss, metrics), grads = gradients(state.params, batch, step_rng)
    if scale is not None:
      loss, grads = jax.tree.map(lambda x: x / scale, (loss, grads))
    metrics = {"loss": loss, **metrics}
    if axis_name is not None:
      grads, metrics = lax.pmean((grads, metrics), axis_name)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    metrics |= {"grad_norm": optax.tree.norm(grads), "learning_rate": schedule(state.step)}
    if scale is not None:
      metrics |= loss_scale_metrics(opt_state)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), metrics

  return step


def make_eval_step(workload: Workload, axis_name: str | None) -> Callable:
  """evaluate(params, batch) -> {name: (Σ weight·numerator, Σ weight·denominator)}."""

  def evaluate(params, batch):
    weight = batch["weight"]
    sums = {name: (jnp.sum(weight * num), jnp.sum(weight * den))
            for name, (num, den) in workload.evaluate(params, batch).items()}
    return sums if axis_name is None else lax.psum(sums, axis_name)

  return evaluate


# ---- Dynamic loss scaling (model.dtype=float16) ----------------------------------------------
INITIAL_SCALE = 2.0**15
PERIOD = 2000            # consecutive finite steps after which the scale doubles
FACTOR = 2.0             # the scale is multiplied by it (growth) or divided by it (overflow)
# the train step's metrics of this state: the loop logs their values after a window's last
# step (it averages the others over the window)
STATE_METRICS = ("loss_scale", "skipped_steps")


class LossScaleState(NamedTuple):
  scale: jax.Array           # float32 S: the loss is multiplied by it before differentiating
  finite_steps: jax.Array    # int32: consecutive finite steps since S last changed
  skipped_steps: jax.Array   # int32: updates skipped so far (a gradient not finite)
  inner_state: Any           # the wrapped optimizer's state


def dynamic_loss_scale(inner: optax.GradientTransformation,
                       period: int = PERIOD) -> optax.GradientTransformation:
  """Dynamic loss scaling for model.dtype=float16: `inner` applied to g = ∇(S·L) / S only
  where every g is finite (else the update is zero, `inner`'s state kept, S halved and the
  skip counted); after `period` finite steps in a row S doubles (capped at float32's largest,
  never below its smallest normal). flax's DynamicScale and optax.apply_if_finite semantics;
  TensorFlow's defaults (S = 2¹⁵ at first, a period of 2 000). The state is part of the
  TrainState's opt_state, so a float16 run resumes bit for bit (docs/accelerators.md)."""

  def init(params):
    return LossScaleState(jnp.asarray(INITIAL_SCALE, jnp.float32), jnp.zeros((), jnp.int32),
                          jnp.zeros((), jnp.int32), inner.init(params))

  def update(grads, state: LossScaleState, params=None):
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    updates, inner_state = lax.cond(
        finite, lambda: inner.update(grads, state.inner_state, params),
        lambda: (optax.tree.zeros_like(grads), state.inner_state))
    grow = finite & (state.finite_steps + 1 >= period)
    f32 = jnp.finfo(jnp.float32)
    scale = jnp.where(finite,
                      jnp.where(grow, jnp.minimum(state.scale * FACTOR, f32.max), state.scale),
                      jnp.maximum(state.scale / FACTOR, f32.tiny))
    finite_steps = jnp.where(finite & ~grow, state.finite_steps + 1, 0)
    skipped = state.skipped_steps + (~finite).astype(jnp.int32)
    return updates, LossScaleState(scale, finite_steps, skipped, inner_state)

  return optax.GradientTransformation(init, update)


def scale_of(opt_state) -> jax.Array | None:
  """The loss scale S of a dynamic_loss_scale optimizer's state; None for any other's."""
  return opt_state.scale if isinstance(opt_state, LossScaleState) else None


def scaled(loss: Callable, scale: jax.Array) -> Callable:
  """loss(params, batch, rng) -> (L, aux) as a function returning (scale · L, aux)."""

  def scaled_loss(params, batch, rng):
    value, aux = loss(params, batch, rng)
    return scale * value, aux

  return scaled_loss


def loss_scale_metrics(opt_state: LossScaleState) -> dict:
  """STATE_METRICS of the state after a step: {"loss_scale": S, "skipped_steps": updates
  skipped so far}."""
  return dict(zip(STATE_METRICS, (opt_state.scale, opt_state.skipped_steps), strict=True))
