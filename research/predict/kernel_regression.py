"""kernel_regression: a restored run's Nadaraya–Watson estimates at new points, with the
weights over its training points.

  run = training.restore("runs/kernel_regression")
  fits = predict.regress(run, np.linspace(0, 5, 200))
  fits["gaussian"].estimates           # [200]: f̂_h(x) = Σ_i α_h(x, x_i) y_i
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.errors import InputError
from research.experiments.kernel_regression import kernel_names
from research.predict.runs import (
  ByIdentity,
  as_array,
  check_bool,
  check_experiment,
  check_result,
  in_batches,
  row_bytes,
  rows_per_call,
)

Array = jax.Array


class Regression(NamedTuple):
  """One kernel's regression at N points from the run's n training points."""
  estimates: np.ndarray        # [N] float32: f̂_h(x) = Σ_i weights[:, i] y_train[i]
  weights: np.ndarray | None   # [N, n] float32: α_h(x, x_i), rows summing to 1 (or all 0);
                               # None with regress(..., weights=False)
  bandwidth: float             # h, the kernel's learned bandwidth


def check_points(x) -> np.ndarray:
  """`x` as float32 [N]; InputError for points that are not a 1-D array of real numbers, for
  none, and for one that is not finite in float32 (named by its index)."""
  takes = "the points are a 1-D array [N] of finite real numbers, N ≥ 1"
  x = as_array(x, "x", takes)
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


def regress(run, x, *, weights: bool = True) -> dict[str, Regression]:
  """{kernel: Regression} at the points x [N] for each kernel of config.model.kernels, in
  its order; with weights=False the estimates alone (each Regression's weights None).

  For each kernel the run's model (research/experiments/kernel_regression.py's Regressors)
  attends from the points x to its training points (run.extras x_train, y_train) with the
  kernel's learned bandwidth h = exp(log h), as its evaluation does; the weights are those it
  sows (intermediates/attention_weights of research/attention/nadaraya_watson.py's
  NadarayaWatson). A compact kernel (box, triangle) gives a point with no training point
  within h all-zero weights and the estimate 0.

  The points go through the model at most research.predict.runs.MAX_ROWS at a time (fewer
  where the weights they compute, rows × n float32 a kernel, would pass
  research.predict.runs.CALL_BYTES a call), the last batch padded with copies of its last
  point: one compiled function per batch size, memory on the device that does not grow with
  N, the answers gathered on the host. The weights returned, N × n float32 a kernel, are
  refused up front beyond research.predict.runs.RESULT_BYTES (2 GiB) in all, naming
  weights=True; weights=False gives the estimates alone, at any number of points.

  Refused before anything compiles (research.errors.InputError): what `check_points`
  refuses; weights not a bool; weights beyond the bound above.
  """
  check_experiment(run, "kernel_regression", "regress")
  weights = check_bool(weights, "weights")
  x = check_points(x)
  model, x_train, y_train = ByIdentity(run.model), run.extras["x_train"], run.extras["y_train"]
  call = lambda x, keep: _regress(model, run.params, x, x_train, y_train, weights=keep)
  kernels = kernel_names(run.config)
  if weights:
    check_result(len(x), (len(kernels) * len(x_train)) * 4, "weights=True",
                 f"the weights [N, {len(x_train)}] of {len(kernels)} kernels over the run's "
                 "training points", "pass weights=False for the estimates alone, or fewer "
                 "points at once")
  computed = row_bytes(lambda x: call(x, True), (x,))     # the weights are computed either way
  outputs = in_batches(lambda x: call(x, weights), (x,), rows_per_call(computed, len(x)))
  regressions = {}
  for kernel in kernels:
    estimates, kernel_weights = outputs[kernel]
    bandwidth = float(jnp.exp(run.params[kernel]["log_bandwidth"]))
    regressions[kernel] = Regression(estimates, kernel_weights, bandwidth)
  return regressions


@functools.partial(jax.jit, static_argnames=("model", "weights"))
def _regress(model: ByIdentity, params, x: Array, x_train: Array, y_train: Array, *,
             weights: bool) -> dict[str, tuple[Array, Array | None]]:
  """{kernel: (estimates [N], weights [N, n] or None)} of model.value."""
  estimates, state = model.value.apply({"params": params}, x[:, None], x_train[:, None],
                                       y_train[:, None], mutable=["intermediates"])
  sown = state["intermediates"]
  return {k: (estimates[k][:, 0], sown[k]["attention_weights"][0] if weights else None)
          for k in estimates}
