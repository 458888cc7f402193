"""research.predict.kernel_regression on a tiny run (2 steps of the three kernels'
bandwidths): restored estimates equal the loop's own, are the weights' average of the
training targets, and equal statsmodels' KernelReg (Gaussian) and the formula (box,
triangle) at the learned bandwidths; the refusals; 10^6 points in batches of one shape, batches as one
call, the weights refused beyond RESULT_BYTES; restore's step an int."""

import numpy as np
import pytest
from statsmodels.nonparametric.kernel_regression import KernelReg

from research.errors import ConfigError, InputError
from research.predict import kernel_regression as predictor
from research.predict import runs as rules
from research.predict.kernel_regression import regress
from research.training import restore

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
    (np.zeros(9_000_000, np.float32), "weights=True: the weights [N, 20] of 3 kernels over the "
                                      "run's training points of 9000000 inputs take "
                                      "2,160,000,000 bytes, more than a prediction returns at "
                                      "once (research.predict.runs.RESULT_BYTES = "
                                      "2,147,483,648): pass weights=False for the estimates "
                                      "alone, or fewer points at once"),
])
def test_points_the_model_cannot_take_are_refused_naming_them(x, message):
  run = trained.untrained(trained.config("kernel_regression", None, TINY))
  with pytest.raises(InputError) as raised:
    regress(run, x)
  assert message in str(raised.value)


# ---- Bounded memory: batches of one shape, the weights refused beyond the bound -------------

@pytest.fixture(scope="module")
def initialised():
  """A run of the tiny config (20 training points) with its initial bandwidths."""
  return trained.untrained(trained.config("kernel_regression", None, TINY), initialised=True)




def test_a_million_points_are_estimated_in_bounded_batches(initialised, monkeypatch):
  """10^6 points without weights: 245 calls of MAX_ROWS = 4096 points (the last padded), the
  estimates at every point those of the points alone."""
  shapes = trained.recording(monkeypatch, predictor, "_regress")
  x = np.linspace(-1.0, 7.0, 1_000_000)
  fits = regress(initialised, x, weights=False)
  assert shapes == [(rules.MAX_ROWS,)] * -(-1_000_000 // rules.MAX_ROWS)
  assert list(fits) == ["gaussian", "box", "triangle"]
  sample = np.random.default_rng(0).choice(1_000_000, 50, replace=False)
  alone = regress(initialised, x[sample])
  for kernel, fit in fits.items():
    assert fit.weights is None and fit.estimates.shape == (1_000_000,)
    assert fit.estimates.dtype == np.float32 and fit.bandwidth == alone[kernel].bandwidth
    np.testing.assert_allclose(fit.estimates[sample], alone[kernel].estimates, rtol=1e-5,
                               atol=1e-6)


def test_points_in_batches_answer_as_in_one_batch(initialised, monkeypatch):
  """POINTS (7) in 4 calls of 2 (MAX_ROWS forced): the estimates and weights of one call."""
  whole = regress(initialised, POINTS)
  shapes = trained.recording(monkeypatch, predictor, "_regress")
  monkeypatch.setattr(rules, "MAX_ROWS", 2)
  batched = regress(initialised, POINTS)
  assert shapes == [(2,)] * 4
  for kernel, fit in batched.items():
    assert fit.weights.shape == (7, 20)
    np.testing.assert_allclose(fit.weights, whole[kernel].weights, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fit.estimates, whole[kernel].estimates, rtol=1e-6, atol=1e-7)
  estimates = regress(initialised, POINTS, weights=False)
  for kernel, fit in estimates.items():
    assert fit.weights is None
    np.testing.assert_allclose(fit.estimates, whole[kernel].estimates, rtol=1e-6, atol=1e-7)
  with pytest.raises(InputError, match="^weights=0 must be True or False$"):
    regress(initialised, POINTS, weights=0)


# ---- research.training.restore's step: an int of a checkpoint there -------------------------

@pytest.mark.slow
@pytest.mark.parametrize("step", [2.0, "2", True, np.float64(2), [2], 2 + 0j])
def test_restore_refuses_a_step_that_is_not_an_int_naming_the_steps(runs, step):
  run, _ = runs
  with pytest.raises(ConfigError) as raised:
    restore(run.workdir, step)
  assert str(raised.value) == (f"step={step!r} must be an int (None: the latest); workdir "
                               f"{run.workdir} has checkpoints of steps 2")


@pytest.mark.slow
def test_restore_takes_a_numpy_int_step_as_an_int(runs):
  run, _ = runs
  restored = restore(run.workdir, np.int64(2))
  assert restored.step == 2 and type(restored.step) is int
  trained.assert_bitwise_equal(restored.params, run.params)


def test_points_given_as_a_generator_or_a_tuple_are_read_once(initialised):
  reference = regress(initialised, POINTS)
  for given in ((float(p) for p in POINTS), tuple(POINTS), list(POINTS)):
    trained.assert_bitwise_equal(regress(initialised, given), reference)
