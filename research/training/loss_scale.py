"""Dynamic loss scaling for model.dtype=float16: an optax wrapper whose state holds the scale.

float16 keeps 5 exponent bits: its largest value is 65504 and its smallest normal 2⁻¹⁴
(6.1e-5), so the small cotangents of a backward pass run in float16 flush to zero. A step
differentiates S·L instead of the loss L (S, the loss scale, a power of two), reads back

    L = (S·L) / S,   g = ∇(S·L) / S        (in float32: exact, S being a power of two)

and updates from g. Where S·L's backward pass overflowed, some g is inf or NaN: the update
is skipped (parameters and the wrapped optimizer's state unchanged), S halves and the skip
is counted; after PERIOD consecutive finite steps, S doubles (up to float32's largest).

The semantics follow flax.training.dynamic_scale.DynamicScale (halve on a non-finite
gradient, never below float32's smallest normal; double after a period of finite steps,
capped at float32's largest) and optax.apply_if_finite (a skipped step's update is zero
and the inner state is kept; a count of skipped steps). The initial scale and the period
are TensorFlow's DynamicLossScale defaults (initial_loss_scale=2**15, "approximately half
the maximum float16 value", increment_period=2000), Keras' LossScaleOptimizer's too
(initial_scale=32768, dynamic_growth_steps=2000); flax's growth_interval is 2000, its
initial scale 2**16. As TensorFlow counts it, the PERIOD-th finite step in a row doubles S
(flax doubles on the one after it: its growth_interval = PERIOD − 1 gives our scales).

A skipped step leaves the step counts inside the optimizer's state (Adam's, the learning
rate schedule's) where they were: the rate applied lags the step number, which the logged
train/learning_rate follows, by the skipped steps.

Parameters, gradients and the optimizer's state stay float32; only the matrix products
run in float16 (the models' `dtype`). The state, (scale, finite steps, skipped steps,
the inner state), is part of the TrainState's opt_state, so a checkpoint resumes a float16
run bit for bit; runs of other dtypes keep the bare optimizer and its state.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

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
  """`inner`, given the unscaled gradients g, applied only where every g is finite; the
  loss scale in its state follows the module docstring's rules."""

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


def metrics(opt_state: LossScaleState) -> dict:
  """STATE_METRICS of the state after a step: {"loss_scale": S, "skipped_steps": updates
  skipped so far}."""
  return dict(zip(STATE_METRICS, (opt_state.scale, opt_state.skipped_steps), strict=True))
