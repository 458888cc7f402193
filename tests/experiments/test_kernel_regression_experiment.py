"""The kernel_regression experiment against outside references: statsmodels' Nadaraya–Watson
(KernelReg, reg_type="lc"), its least-squares cross-validation and OLS, NumPy formulas of
the kernels and of the data recipe, and one tiny run through the train loop.

statsmodels' Gaussian kernel is kernels.gaussian(h, X_i, x) = exp(−(X_i − x)² / (2h²)) / √(2π),
i.e. K(u) = exp(−u²/2) / √(2π) with u = |x − X_i| / h: our convention (K(u) = exp(−u²/2)) up
to the constant, which cancels in the normalised weights; so the same h means the same
estimator (checked first below).
"""

import functools
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from statsmodels.nonparametric import kernels as statsmodels_kernels
from statsmodels.nonparametric.kernel_regression import KernelReg
from statsmodels.regression.linear_model import OLS

from research import experiments
from research.data import regression_1d as data
from research.experiments import kernel_regression
from research.training.config import ConfigError, apply_overrides
from research.training.loop import train_and_evaluate
from research.training.workdir import config_changes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import kernel_regression as experiment  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")   # statsmodels' own
FORMULAS = {"gaussian": lambda u: np.exp(-u**2 / 2), "box": lambda u: (u <= 1).astype(float),
            "triangle": lambda u: np.maximum(0.0, 1 - u)}


def as64(arrays, *names):
  return [arrays[name].astype(np.float64) for name in names]


def nadaraya_watson_formula(x_query, x_train, y_train, kernel, h, leave_one_out=False):
  """Σ_j K(|x − x_j| / h) y_j / Σ_j K(|x − x_j| / h) in float64, 0 where no K is > 0."""
  weights = FORMULAS[kernel](np.abs(x_query[:, None] - x_train[None, :]) / h)
  if leave_one_out:
    np.fill_diagonal(weights, 0.0)
  total = weights.sum(1)
  return np.where(total > 0, weights @ y_train / np.where(total > 0, total, 1), 0.0)


def test_the_data_follows_the_recipe():
  arrays = data.generate(3)
  x, y, x_test, y_test = as64(arrays, "x_train", "y_train", "x_test", "y_test")
  assert x.shape == y.shape == (50,) and np.all(np.diff(x) >= 0) and 0 <= x.min() < x.max() < 5
  np.testing.assert_allclose(x_test, np.arange(0, 5, 0.1), atol=1e-6)   # 0, 0.1, …, 4.9
  np.testing.assert_allclose(y_test, 2 * np.sin(x_test) + x_test**0.8, atol=1e-6)
  for name, value in data.generate(3).items():
    np.testing.assert_array_equal(value, arrays[name])                  # seeded
  assert not np.array_equal(data.generate(4)["x_train"], x)
  # The noise: N(0, 0.5²) around f, pooled over 100 seeds (5000 draws; std error ≈ 0.005).
  noise = np.concatenate([
      d["y_train"] - (2 * np.sin(d["x_train"]) + d["x_train"]**0.8)
      for d in map(data.generate, range(100))])
  assert abs(noise.mean()) < 0.025 and abs(noise.std() - 0.5) < 0.02
  uniform = np.concatenate([data.generate(s)["x_train"] for s in range(100)])
  assert abs(uniform.mean() - 2.5) < 0.05 and abs(uniform.std() - 5 / np.sqrt(12)) < 0.05


def test_statsmodels_gaussian_kernel_is_ours_up_to_a_constant():
  h, x_i, x = 0.3, np.array([0.1, 0.5, 2.0]), 0.4
  np.testing.assert_allclose(statsmodels_kernels.gaussian(h, x_i, x) * np.sqrt(2 * np.pi),
                             np.exp(-(np.abs(x - x_i) / h)**2 / 2), rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("h", [0.05, 0.3, 1.0, 3.0])
def test_gaussian_predictions_equal_statsmodels_kernelreg(seed, h):
  arrays = data.generate(seed)
  x, y, x_test = as64(arrays, "x_train", "y_train", "x_test")
  reference = KernelReg(y, x, var_type="c", reg_type="lc", bw=[h]).fit(x_test)[0]
  ours = kernel_regression.predict(arrays["x_test"], arrays["x_train"], arrays["y_train"],
                                   kernel="gaussian", bandwidth=h)
  # 1e-6 relative and absolute: ours are float32 (spacing 4.8e-7 at y ≈ 4).
  np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("h", [0.1, 0.25, 1.0])
def test_leave_one_out_mse_equals_statsmodels_cv_loo(h):
  arrays = data.generate(2)
  x, y = as64(arrays, "x_train", "y_train")
  model = KernelReg(y, x, var_type="c", reg_type="lc", bw=[h])
  reference = model.cv_loo(np.array([h]), model.est["lc"])[0]
  ours = kernel_regression.leave_one_out_mse(arrays["x_train"], arrays["y_train"],
                                             kernel="gaussian", bandwidth=h)
  np.testing.assert_allclose(ours, reference, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_loo_bandwidth_agrees_with_statsmodels_cv_ls(seed):
  """statsmodels minimises the same criterion by Nelder–Mead from its rule-of-thumb h."""
  config = apply_overrides(experiment.get_config(), {"seed": seed})
  arrays = kernel_regression.make_data(config)
  x, y = as64(arrays, "x_train", "y_train")
  reference = KernelReg(y, x, var_type="c", reg_type="lc", bw="cv_ls").bw[0]
  ours = kernel_regression.choose_bandwidths(config, arrays, "gaussian", 1.0)["loo"][0]
  assert ours == pytest.approx(reference, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gaussian", "box", "triangle"])
def test_every_kernel_and_bandwidth_choice_matches_the_formulas(kernel):
  config = apply_overrides(experiment.get_config(), {"seed": 7, "model.grid_size": 60})
  arrays = kernel_regression.make_data(config)
  x, y, x_test, y_test = as64(arrays, "x_train", "y_train", "x_test", "y_test")
  grid = np.geomspace(0.01, 10.0, 60)
  test_mse = np.array([np.mean((nadaraya_watson_formula(x_test, x, y, kernel, h) - y_test)**2)
                       for h in grid])
  loo_mse = np.array([np.mean((nadaraya_watson_formula(x, x, y, kernel, h, True) - y)**2)
                      for h in grid])
  np.testing.assert_allclose(
      kernel_regression.leave_one_out_mse(arrays["x_train"], arrays["y_train"], kernel=kernel,
                                          bandwidth=grid), loo_mse, rtol=1e-5)
  chosen = kernel_regression.choose_bandwidths(config, arrays, kernel, learned=0.4)
  expected = {"fixed": 1.0, "learned": 0.4, "loo": grid[np.argmin(loo_mse)],
              "oracle": grid[np.argmin(test_mse)]}
  for method, h in expected.items():
    predictions = nadaraya_watson_formula(x_test, x, y, kernel, h)
    assert chosen[method][:2] == pytest.approx((h, np.mean((predictions - y_test)**2)),
                                               rel=1e-5), method
    np.testing.assert_allclose(chosen[method][2], predictions, rtol=1e-5, atol=1e-6)
  assert chosen["oracle"][1] == pytest.approx(test_mse.min(), rel=1e-5)


def test_linear_regression_equals_statsmodels_ols():
  arrays = data.generate(0)
  x, y = as64(arrays, "x_train", "y_train")
  reference = OLS(y, np.stack([np.ones_like(x), x], axis=1)).fit().params
  np.testing.assert_allclose(kernel_regression.linear_fit(arrays["x_train"], arrays["y_train"]),
                             reference, rtol=1e-6)


@pytest.mark.parametrize("overrides, message", [
    ({"model.kernels": "gaussian,epanechnikov"}, "config.model.kernels='gaussian,epanechnikov': "
     "'epanechnikov' is not allowed; choose a comma-separated subset of: gaussian, box, triangle"),
    ({"model.kernels": "box,box"}, "config.model.kernels='box,box' names a kernel twice"),
    ({"model.bandwidth": 0.0}, "config.model.bandwidth=0.0 must be a number > 0"),
    ({"data.noise_std": -0.1}, "config.data.noise_std=-0.1 must be a number >= 0"),
    ({"data.num_train": 1, "train.batch_size": 1}, "config.data.num_train=1 must be an int >= 2"),
    ({"model.grid_max": 0.005}, "config.model.grid_max=0.005 must be > config.model.grid_min"),
    ({"train.batch_size": 64}, "config.train.batch_size=64 must be <= config.data.num_train=50"),
    ({"experiment": "kernel_regresion"}, "config.experiment='kernel_regresion' is not allowed; choose one "
     "of: .*'kernel_regression'"),
    ({"model.dtype": "float64"}, "^config.model.dtype='float64' is not allowed; choose one of: "
     "'float32', 'bfloat16', 'float16'$"),
    ({"model.dtype": "bf16"}, "^config.model.dtype='bf16' is not allowed; choose one of: "),
])
def test_bad_values_are_named(overrides, message):
  config = apply_overrides(experiment.get_config(), overrides)
  with pytest.raises(ConfigError, match=message):
    experiments.get(config.experiment).validate(config)


def _product_dtypes(function, *args) -> set[str]:
  """The operands' dtypes of every matrix product (dot_general) of function(*args), lowered."""
  text = jax.jit(function).lower(*args).as_text()
  operands = re.findall(r"dot_general.*\(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)", text)
  assert operands, text[-2000:]
  return {dtype for pair in operands for dtype in pair}


@pytest.mark.parametrize("dtype, short", [("float32", "f32"), ("bfloat16", "bf16"),
                                          ("float16", "f16")])
def test_model_dtype_is_the_dtype_of_every_weighted_sum_and_the_rest_stays_float32(dtype, short):
  config = apply_overrides(experiment.get_config(), {"model.dtype": dtype})
  kernel_regression.validate(config)
  workload = kernel_regression.build(config)
  params = workload.init(jax.random.key(0))
  batch = jax.tree.map(jnp.asarray, next(workload.train_data))
  test = {"x": jnp.asarray(kernel_regression.make_data(config)["x_test"]),
          "y": jnp.asarray(kernel_regression.make_data(config)["y_test"])}
  assert _product_dtypes(workload.loss, params, batch, jax.random.key(1)) == {short}
  assert _product_dtypes(workload.evaluate, params, test) == {short}
  arrays = kernel_regression.make_data(config)
  curves = functools.partial(kernel_regression.bandwidth_curves, kernel="gaussian", dtype=dtype)
  assert _product_dtypes(curves, *(arrays[k] for k in ("x_train", "y_train", "x_test", "y_test")),
                         np.array([0.5, 1.0])) == {short}              # the report's too
  loss, aux = workload.loss(params, batch, jax.random.key(1))
  assert loss.dtype == jnp.float32 and {v.dtype for v in aux.values()} == {jnp.dtype("float32")}
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype("float32")}


def test_a_workdir_written_before_model_dtype_resumes_as_float32():
  config = experiment.get_config()
  before = json.loads(config.to_json_best_effort())
  del before["model"]["dtype"]
  assert config_changes(before, json.loads(config.to_json_best_effort()), "runs/kr") == ""
  bfloat16 = json.loads(apply_overrides(config, {"model.dtype": "bfloat16"}).to_json_best_effort())
  assert config_changes(before, bfloat16, "runs/kr") == ("config.model.dtype 'float32' there, "
                                                          "'bfloat16' now")
  old = ml_collections.ConfigDict(before)          # its config.json, restored: float32
  kernel_regression.validate(old)
  assert kernel_regression.compute_dtype(old) == "float32"


def test_bfloat16_weighted_sums_change_the_estimates_by_bfloat16s_rounding_alone():
  """The dtype is computed in, not only declared: bfloat16's 8-bit mantissa moves the
  estimates (relative rounding 2⁻⁸ of values up to ~4), float32's do not."""
  arrays = kernel_regression.make_data(experiment.get_config())
  estimates = {dtype: np.asarray(kernel_regression.predict(
      arrays["x_test"], arrays["x_train"], arrays["y_train"], kernel="gaussian", bandwidth=0.3,
      dtype=dtype)) for dtype in ("float32", "bfloat16")}
  assert estimates["bfloat16"].dtype == np.float32
  difference = np.abs(estimates["bfloat16"] - estimates["float32"])
  assert 0 < difference.max() < 0.05


def test_the_sweep_is_the_default_config_at_seeds_0_to_19():
  points = experiment.get_sweep()
  assert points == [{"seed": s} for s in range(20)]
  kernel_regression.validate(apply_overrides(experiment.get_config(), points[-1]))


@pytest.mark.slow
def test_a_tiny_run_learns_the_bandwidths_and_reports_every_method(tmp_path):
  overrides = {"train.num_steps": 40, "train.learning_rate": 0.1, "train.log_every": 10,
               "train.eval_every": 40, "train.checkpoint_every": 40, "model.grid_size": 100}
  config = apply_overrides(experiment.get_config(), overrides)
  workdir = str(tmp_path / "run")
  final = train_and_evaluate(config, workdir, experiments.get("kernel_regression"))
  with open(os.path.join(workdir, "final_metrics.json")) as f:
    assert json.load(f) == pytest.approx(final)
  for kernel in ("gaussian", "box", "triangle"):
    for method in kernel_regression.METHODS:
      assert np.isfinite(final[f"test/mse_{kernel}_{method}"]), (kernel, method)
      assert final[f"test/bandwidth_{kernel}_{method}"] > 0
    assert final[f"test/mse_{kernel}_oracle"] <= final[f"test/mse_{kernel}_loo"]
    # The learned h is the trained parameter that the last evaluation used.
    assert final[f"test/mse_{kernel}_learned"] == pytest.approx(final[f"eval/mse_{kernel}"],
                                                                rel=1e-5)
  assert np.isfinite(final["test/mse_linear"])
  assert os.path.getsize(os.path.join(workdir, "attention_gaussian.png")) > 0   # the first's
  # The box kernel's gradient in h is zero; the Gaussian's leave-one-out loss went down.
  assert final["test/bandwidth_box_learned"] == 1.0
  arrays = kernel_regression.make_data(config)
  learned = final["test/bandwidth_gaussian_learned"]
  assert learned < 1.0
  loo = [kernel_regression.leave_one_out_mse(arrays["x_train"], arrays["y_train"],
                                             kernel="gaussian", bandwidth=h) for h in (1, learned)]
  assert loo[1] < loo[0]
  with open(os.path.join(workdir, "fit.svg")) as f:
    assert "<svg" in f.read()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_tiny_run_in_a_lower_precision_learns_the_gaussian_bandwidth(tmp_path, dtype):
  """float16 with dynamic loss scaling (train_step.dynamic_loss_scale): no step skipped."""
  overrides = {"train.num_steps": 40, "train.learning_rate": 0.1, "train.log_every": 20,
               "train.eval_every": 40, "train.checkpoint_every": 40, "model.grid_size": 100,
               "model.dtype": dtype}
  config = apply_overrides(experiment.get_config(), overrides)
  final = train_and_evaluate(config, str(tmp_path), experiments.get("kernel_regression"))
  assert all(np.isfinite(v) for k, v in final.items() if k.startswith(("eval/", "test/")))
  assert final["test/bandwidth_gaussian_learned"] < 1.0
  assert final["test/mse_gaussian_learned"] < final["test/mse_gaussian_fixed"]
  assert final.get("train/skipped_steps", 0) == 0
