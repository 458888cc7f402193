"""kernel_regression: a restored run's Nadaraya–Watson estimates at new points, with the
weights over its training points.

  run = training.restore("runs/kernel_regression")
  fits = predict.regress(run, np.linspace(0, 5, 200))
  fits["gaussian"].estimates           # [200]: f̂_h(x) = Σ_i α_h(x, x_i) y_i
  fits["gaussian"].weights             # [200, num_train]: α_h(x, x_i), each row summing to 1

For each kernel of config.model.kernels, the run's model (research/experiments/
kernel_regression.py's Regressors) attends from the points x to its training points
(run.extras x_train, y_train) with the kernel's learned bandwidth h = exp(log h), as its
evaluation does; the weights are those it sows (intermediates/attention_weights of
research/attention/nadaraya_watson.py's NadarayaWatson). A compact kernel (box, triangle)
gives a point with no training point within h all-zero weights and the estimate 0.

Refused before anything compiles (research.errors.InputError): points that are not a 1-D
array of real numbers, none, or one that is not finite in float32 (named by its index).
One compiled function per number of points.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.errors import InputError
from research.experiments.kernel_regression import kernel_names
from research.predict.runs import check_experiment
from research.predict.static import ByIdentity

Array = jax.Array


class Regression(NamedTuple):
  """One kernel's regression at N points from the run's n training points."""
  estimates: np.ndarray        # [N] float32: f̂_h(x) = Σ_i weights[:, i] y_train[i]
  weights: np.ndarray          # [N, n] float32: α_h(x, x_i), rows summing to 1 (or all 0)
  bandwidth: float             # h, the kernel's learned bandwidth


def check_points(x) -> np.ndarray:
  """`x` as float32 [N]; InputError for what the module docstring refuses."""
  takes = "the points are a 1-D array [N] of finite real numbers, N ≥ 1"
  try:
    x = np.asarray(x)
  except ValueError as error:          # ragged nested lists
    raise InputError(f"x is not an array ({error}): {takes}") from None
  if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
    raise InputError(f"x of dtype {x.dtype}: {takes}")
  if x.ndim != 1 or not len(x):
    raise InputError(f"x of shape {list(x.shape)}: {takes}")
  with np.errstate(over="ignore"):     # a float64 beyond float32's range: refused below
    points = x.astype(np.float32)
  bad = np.flatnonzero(~np.isfinite(points))
  if len(bad):
    raise InputError(f"x[{bad[0]}] is {x[bad[0]]}: {takes} (finite in float32)")
  return points


def regress(run, x) -> dict[str, Regression]:
  """{kernel: Regression} at the points x [N] for each kernel of config.model.kernels, in
  its order (see the module docstring)."""
  check_experiment(run, "kernel_regression", "regress")
  x = check_points(x)
  outputs = jax.device_get(_regress(ByIdentity(run.model), run.params, x,
                                    run.extras["x_train"], run.extras["y_train"]))
  regressions = {}
  for kernel in kernel_names(run.config):
    estimates, weights, bandwidth = outputs[kernel]
    regressions[kernel] = Regression(estimates, weights, float(bandwidth))
  return regressions


@functools.partial(jax.jit, static_argnames="model")
def _regress(model: ByIdentity, params, x: Array, x_train: Array, y_train: Array
             ) -> dict[str, tuple[Array, Array, Array]]:
  """{kernel: (estimates [N], weights [N, n], bandwidth)} of model.value."""
  estimates, state = model.value.apply({"params": params}, x[:, None], x_train[:, None],
                                       y_train[:, None], mutable=["intermediates"])
  sown = state["intermediates"]
  return {k: (estimates[k][:, 0], sown[k]["attention_weights"][0],
              jnp.exp(params[k]["log_bandwidth"])) for k in estimates}
