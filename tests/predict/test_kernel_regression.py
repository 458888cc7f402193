"""research.predict.kernel_regression on a tiny run (2 steps of the three kernels'
bandwidths): restored estimates equal the loop's own, are the weights' average of the
training targets, and equal statsmodels' KernelReg (Gaussian) and the formula (box,
triangle) at the learned bandwidths; the refusals."""

import numpy as np
import pytest
from statsmodels.nonparametric.kernel_regression import KernelReg

from research.errors import InputError
from research.predict.kernel_regression import regress

from . import trained

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")   # statsmodels' own
TINY = {"data.num_train": 20, "train.batch_size": 20, "train.num_steps": 2,
        "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2,
        "model.grid_size": 10}
# Beyond the training points' range [0, 5] too, where the compact kernels may see none.
POINTS = np.array([-1.0, 0.0, 0.37, 1.5, 2.25, 4.9, 7.0])
COMPACT = {"box": lambda u: (u <= 1).astype(float), "triangle": lambda u: np.maximum(0, 1 - u)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(restored run, the same with the parameters the loop ended with)."""
  config = trained.config("kernel_regression", None, TINY)
  return trained.restored_and_final(config, str(tmp_path_factory.mktemp("kr") / "run"))


@pytest.mark.slow
def test_restored_estimates_are_the_loops_and_the_kernel_formulas(runs):
  run, final = runs
  fits = regress(run, POINTS)
  trained.assert_bitwise_equal(fits, regress(final, POINTS))
  assert list(fits) == ["gaussian", "box", "triangle"]
  x_train, y_train = (run.extras[k].astype(np.float64) for k in ("x_train", "y_train"))
  for kernel, fit in fits.items():
    h = np.exp(float(run.params[kernel]["log_bandwidth"]))
    assert fit.bandwidth == pytest.approx(h, rel=1e-6)
    assert (fit.bandwidth == 1.0) == (kernel == "box")    # learned from 1: box's gradient is 0
    assert fit.weights.shape == (7, 20) and np.all(fit.weights >= 0)
    np.testing.assert_allclose(fit.estimates, fit.weights @ y_train, rtol=1e-5, atol=1e-6)
    sums = fit.weights.sum(1)
    np.testing.assert_allclose(sums[sums > 0], 1.0, rtol=1e-6)
    assert (sums[-1] > 0) == (kernel == "gaussian")     # 7 is 2 past every x_i, h < 2
    if kernel == "gaussian":
      reference = KernelReg(y_train, x_train, var_type="c", reg_type="lc", bw=[h]).fit(POINTS)[0]
      np.testing.assert_allclose(fit.estimates, reference, rtol=1e-5, atol=1e-5)
      assert np.all(sums > 0)
    else:
      values = COMPACT[kernel](np.abs(POINTS[:, None] - x_train[None]) / h)
      total = values.sum(1, keepdims=True)
      weights = np.divide(values, total, out=np.zeros_like(values), where=total > 0)
      np.testing.assert_allclose(fit.weights, weights, atol=1e-6)


@pytest.mark.parametrize("x, message", [
    (np.ones((2, 3)), "x of shape [2, 3]: the points are a 1-D array [N] of finite real "
                      "numbers, N ≥ 1"),
    (2.0, "x of shape []: "),
    ([], "x of shape [0]: "),
    (np.array([1.0, np.inf, np.nan]), "x[1] is inf: "),
    (np.array([0.5, 1e39]), "x[1] is 1e+39: "),
    (np.array(["1.0"]), "x of dtype <U3: "),
    (np.array([True]), "x of dtype bool: "),
    ([[1.0], [2.0, 3.0]], "x is not an array ("),
])
def test_points_the_model_cannot_take_are_refused_naming_them(x, message):
  run = trained.untrained(trained.config("kernel_regression", None, TINY))
  with pytest.raises(InputError) as raised:
    regress(run, x)
  assert message in str(raised.value)
