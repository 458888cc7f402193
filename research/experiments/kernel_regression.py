"""The kernel_regression experiment: Nadaraya–Watson regression as attention, bandwidth chosen
four ways, against linear regression (the d2l.ai example; research/attention/nadaraya_watson.py).

A query x attends to n noisy training points (x_i, y_i) of f(x) = 2 sin x + x^0.8
(research/data/regression_1d.py): f̂_h(x) = Σ_i α_h(x, x_i) y_i, α_h the normalised kernel of
u = |x − x_i|/h.
"""

import functools
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from research.attention.nadaraya_watson import SMOOTHING_KERNELS, NadarayaWatson, nadaraya_watson
from research.data import regression_1d as data
from research.data.stream import ShuffledStream, eval_batches
from research.errors import ConfigError
from research.training.config import (
  COMPUTE_DTYPES,
  check_choice,
  check_host_memory,
  check_positive,
  check_range,
  get,
)
from research.training.experiment import Heatmap, Inference, Model, Report, Workload, register

Array = jax.Array
METHODS = ("fixed", "learned", "loo", "oracle")
BANDWIDTHS = (1e-6, 1e6)          # allowed h (fixed, initial, grid): exp(log h) in float32
DATA_SCALE = 1e6                  # the largest x_max, noise σ and test spacing


def kernel_names(config) -> tuple[str, ...]:
  """config.model.kernels, "gaussian,box" -> ("gaussian", "box")."""
  return tuple(name.strip() for name in config.model.kernels.split(","))


def compute_dtype(config) -> str:
  """config.model.dtype: the weighted sums' dtype (float32 where a config.json written before
  the key lacks it).

  config.model.dtype (float32, bfloat16 or float16, as in every experiment) is the dtype of
  the weighted sums Σ_i α_i y_i, the model's matrix products, in training, evaluation and the
  report alike; the distances, the kernels' weights, the bandwidths and the losses stay
  float32.
  """
  return config.model.get("dtype", "float32")


def bandwidth_grid(config) -> np.ndarray:
  """The bandwidths that the loo and oracle choices search: [grid_size], log-spaced."""
  m = config.model
  return np.geomspace(m.grid_min, m.grid_max, m.grid_size)


def validate(config) -> None:
  """Raises ConfigError for a bad config.data / config.model value, naming the key."""
  names = kernel_names(config)
  for name in names:
    if name not in SMOOTHING_KERNELS:
      raise ConfigError(f"config.model.kernels={config.model.kernels!r}: {name!r} is not "
                        f"allowed; choose a comma-separated subset of: {', '.join(SMOOTHING_KERNELS)}")
  if len(set(names)) != len(names):
    raise ConfigError(f"config.model.kernels={config.model.kernels!r} names a kernel twice")
  if "dtype" in config.model:     # absent from the config.json of a run before it: float32
    check_choice(config, "model.dtype", COMPUTE_DTYPES)
  check_positive(config, "data.num_train", "data.x_max", "data.test_spacing", "model.bandwidth",
                 "model.grid_min", "model.grid_max", "model.grid_size")
  check_positive(config, "data.noise_std", allow_zero=True)
  for key in ("model.bandwidth", "model.grid_min", "model.grid_max"):
    check_range(config, key, *BANDWIDTHS, "a float32 bandwidth further out makes the kernel "
                "weights or their gradient overflow")
  for key in ("data.x_max", "data.noise_std", "data.test_spacing"):
    check_range(config, key, 0, DATA_SCALE, "float32 data whose squares stay finite")
  for key in ("data.num_train", "model.grid_size"):
    if not isinstance(get(config, key), int) or get(config, key) < 2:
      raise ConfigError(f"config.{key}={get(config, key)!r} must be an int >= 2")
  if config.model.grid_max <= config.model.grid_min:
    raise ConfigError(f"config.model.grid_max={config.model.grid_max} must be > "
                      f"config.model.grid_min={config.model.grid_min}")
  if config.train.batch_size > config.data.num_train:
    raise ConfigError(f"config.train.batch_size={config.train.batch_size} must be <= "
                      f"config.data.num_train={config.data.num_train} (a batch is a set of "
                      "training points)")
  n, m = config.data.num_train, data.test_size(config.data.x_max, config.data.test_spacing)
  check_host_memory(config, ("data.num_train", "data.x_max", "data.test_spacing",
                             "model.grid_size"),
                    16 * (config.model.grid_size + 2) * n * (m + n),
                    f"the report's weights of {m} test and {n} training points at each "
                    "bandwidth of the grid")


def make_data(config) -> dict[str, np.ndarray]:
  d = config.data
  return data.generate(config.seed, num_train=d.num_train, x_max=d.x_max,
                       noise_std=d.noise_std, test_spacing=d.test_spacing)


def others(n: int) -> np.ndarray:
  """[n, n − 1]: row i lists 0 … n − 1 without i (the points that predict point i)."""
  return np.array([np.delete(np.arange(n), i) for i in range(n)], dtype=np.int32)


def predict(x_query, x_train, y_train, *, kernel: str, bandwidth, return_weights=False,
            dtype="float32"):
  """Nadaraya–Watson estimates at x_query [m] from the points (x_train, y_train) [n], the
  weighted sums in `dtype`.

  bandwidth: a scalar, or [G] for G bandwidths at once. Returns [m] (or [G, m]), and with
  return_weights also the weights [m, n] (or [G, m, n]).
  """
  bandwidth = jnp.asarray(bandwidth, jnp.float32)[..., None, None]        # [(G,) 1, 1]
  out, weights = nadaraya_watson(jnp.asarray(x_query)[:, None], jnp.asarray(x_train)[:, None],
                                 jnp.asarray(y_train)[:, None], kernel=kernel,
                                 bandwidth=bandwidth, return_weights=True, dtype=dtype)
  return (out[..., 0], weights) if return_weights else out[..., 0]


def leave_one_out_predictions(x_train, y_train, *, kernel: str, bandwidth,
                              dtype="float32") -> Array:
  """f̂_{h,−i}(x_i) for every training point i: [n], or [G, n] for bandwidths [G]."""
  rest = others(len(x_train))
  x_train, y_train = jnp.asarray(x_train), jnp.asarray(y_train)
  bandwidth = jnp.asarray(bandwidth, jnp.float32)[..., None, None, None]  # [(G,) 1, 1, 1]
  out = nadaraya_watson(x_train[:, None, None], x_train[rest][..., None],
                        y_train[rest][..., None], kernel=kernel, bandwidth=bandwidth,
                        dtype=dtype)
  return out[..., 0, 0]                                                   # [(G,) n]


def leave_one_out_mse(x_train, y_train, *, kernel: str, bandwidth, dtype="float32") -> Array:
  """L(h) = 1/n Σ_i (y_i − f̂_{h,−i}(x_i))²: a scalar, or [G] for bandwidths [G]."""
  predictions = leave_one_out_predictions(x_train, y_train, kernel=kernel, bandwidth=bandwidth,
                                          dtype=dtype)
  return jnp.mean(jnp.square(predictions - jnp.asarray(y_train)), axis=-1)


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """Least squares y ≈ a + b x: (a, b)."""
  design = np.stack([np.ones_like(x), x], axis=1).astype(np.float64)
  (a, b), *_ = np.linalg.lstsq(design, y.astype(np.float64), rcond=None)
  return float(a), float(b)


class Regressors(nn.Module):
  """One Nadaraya–Watson regressor per kernel, each with its own learned bandwidth."""
  kernels: tuple[str, ...]          # e.g. ("gaussian", "box", "triangle")
  bandwidth: float                  # initial h of every kernel
  dtype: str = "float32"            # the weighted sums' dtype (config.model.dtype)

  @nn.compact
  def __call__(self, queries: Array, keys: Array, values: Array) -> dict[str, Array]:
    """queries [..., m, 1], keys [..., n, 1], values [..., n, 1] -> {kernel: [..., m, 1]}."""
    regressors = {k: NadarayaWatson(kernel=k, init_bandwidth=self.bandwidth, dtype=self.dtype,
                                    name=k)
                  for k in self.kernels}
    return {k: regressor(queries, keys, values) for k, regressor in regressors.items()}


def learned_bandwidths(params) -> dict[str, Array]:
  """Regressors' parameters -> {kernel: h = exp(log_bandwidth)}."""
  return {k: jnp.exp(p["log_bandwidth"]) for k, p in params.items()}


def build_model(config, read=None) -> Model:
  """Regressors over config.model.kernels; extras: the data, make_data(config) (drawn from
  config.seed in microseconds): x_train, y_train [num_train], the points every prediction
  attends to, and the test grid x_test, y_test."""
  del read     # the run writes no file
  arrays = make_data(config)
  model = Regressors(kernel_names(config), config.model.bandwidth, compute_dtype(config))
  x_train, y_train = arrays["x_train"][:, None], arrays["y_train"][:, None]
  return Model(model, lambda rng: model.init(rng, jnp.asarray(x_train[:1]), jnp.asarray(x_train),
                                             jnp.asarray(y_train))["params"], arrays)


def inference(config, model, extras) -> Inference:
  """Each kernel's estimate f̂_h(x) [B] at points x [B], with its learned bandwidth h and the
  run's training points (extras x_train, y_train [num_train]) as keys and values."""
  x_train, y_train = extras["x_train"][:, None], extras["y_train"][:, None]
  kernels = kernel_names(config)

  def function(params, x):
    estimates = model.apply({"params": params}, x[:, None], x_train, y_train)
    return {kernel: estimates[kernel][:, 0] for kernel in kernels}

  return Inference(
      function, {"x": (jax.ShapeDtypeStruct((1,), jnp.float32), "the points to estimate at")},
      {kernel: f"the Nadaraya–Watson estimate with the {kernel} kernel and its learned "
               f"bandwidth over the {len(x_train)} training points" for kernel in kernels},
      {"kernels": list(kernels), "num_train": len(x_train)})


def build(config) -> Workload:
  """Model, data and loss for config (validated); see research/training/experiment.py.

  Training batches: config.train.batch_size training points (all of them by default) as
  queries, the other n − 1 points as keys and values. Periodic evaluation: eval/mse_<k> on
  the test grid with the current learned h, eval/loss their mean. The report: `make_report`.
  """
  kernels, (model, init, arrays) = kernel_names(config), build_model(config)
  x_train, y_train = jnp.asarray(arrays["x_train"]), jnp.asarray(arrays["y_train"])
  rest = jnp.asarray(others(config.data.num_train))
  n = config.data.num_train

  def loss(params, batch, rng):
    """The mean over the kernels of the leave-one-out MSE of the batch's training points."""
    del rng  # deterministic
    neighbours = rest[batch["index"]]                                     # [B, n − 1]
    predictions = model.apply({"params": params}, batch["x"][:, None, None],
                              x_train[neighbours][..., None], y_train[neighbours][..., None])
    mse = {k: jnp.mean(jnp.square(p[:, 0, 0] - batch["y"])) for k, p in predictions.items()}
    metrics = {f"loo_mse_{k}": v for k, v in mse.items()}
    metrics |= {f"bandwidth_{k}": h for k, h in learned_bandwidths(params).items()}
    return jnp.mean(jnp.stack(list(mse.values()))), metrics

  def evaluate(params, batch):
    predictions = model.apply({"params": params}, batch["x"][:, None], x_train[:, None],
                              y_train[:, None])
    ones = jnp.ones_like(batch["y"])
    squared = {k: jnp.square(p[:, 0] - batch["y"]) for k, p in predictions.items()}
    metrics = {f"mse_{k}": (s, ones) for k, s in squared.items()}
    return {"loss": (jnp.mean(jnp.stack(list(squared.values())), axis=0), ones), **metrics}

  def report(params) -> Report:
    learned = learned_bandwidths(params)             # (a pytree's dict comes back sorted)
    return make_report(config, arrays, {k: float(learned[k]) for k in kernels})

  train = {"x": arrays["x_train"], "y": arrays["y_train"],
           "index": np.arange(n, dtype=np.int32)}
  test = {"x": arrays["x_test"], "y": arrays["y_test"]}
  return Workload(init=init, train_data=ShuffledStream(train, config.train.batch_size, config.seed),
              eval_data=eval_batches(test, config.train.batch_size), loss=loss,
              evaluate=evaluate, report=report)


@functools.partial(jax.jit, static_argnames=("kernel", "dtype"))
def bandwidth_curves(x_train, y_train, x_test, y_test, bandwidths, *, kernel: str,
                     dtype: str = "float32") -> tuple[Array, Array, Array]:
  """At each of bandwidths [G]: the predictions on x_test [G, m], their MSE against y_test [G]
  and the leave-one-out MSE L(h) [G], the weighted sums in `dtype`."""
  predictions = predict(x_test, x_train, y_train, kernel=kernel, bandwidth=bandwidths,
                        dtype=dtype)
  test = jnp.mean(jnp.square(predictions - y_test), axis=-1)
  return predictions, test, leave_one_out_mse(x_train, y_train, kernel=kernel,
                                              bandwidth=bandwidths, dtype=dtype)


def choose_bandwidths(config, arrays, kernel: str, learned: float
                      ) -> dict[str, tuple[float, float, np.ndarray]]:
  """{method: (h, test MSE, predictions on x_test [m])} for the kernel. The bandwidth h is

    fixed    config.model.bandwidth (d2l's h = 1)
    learned  exp(log h), the trained parameter: the loop's optimizer minimises, from the fixed
             h, the leave-one-out training MSE  L(h) = 1/n Σ_i (y_i − f̂_{h,−i}(x_i))², where
             f̂_{h,−i} regresses on the other n − 1 points (each point is left out of its own
             prediction, else h → 0 interpolates the noise). One log-bandwidth per kernel,
             trained jointly: the loss is the mean of the kernels' L, whose parameters are
             separate.
    loo      argmin of the same L over the grid geomspace(grid_min, grid_max, grid_size):
             least-squares leave-one-out cross-validation, statsmodels' KernelReg(bw="cv_ls")
    oracle   argmin over that grid of the test MSE itself (it uses the true f: a bound, not a
             method)

  Learned and loo minimise the same criterion, by gradient descent (a local minimum, off the
  grid) and by search (the grid's global minimum). The box kernel is piecewise constant in h,
  so its gradient is zero and its learned bandwidth stays at the fixed one.
  """
  grid = bandwidth_grid(config)
  bandwidths = np.concatenate([[config.model.bandwidth, learned], grid])
  predictions, test, loo = jax.device_get(bandwidth_curves(
      *(arrays[k] for k in ("x_train", "y_train", "x_test", "y_test")), bandwidths,
      kernel=kernel, dtype=compute_dtype(config)))
  best_loo, best_test = 2 + np.argmin(loo[2:]), 2 + np.argmin(test[2:])   # on the grid
  return {method: (float(bandwidths[i]), float(test[i]), np.asarray(predictions[i]))
          for method, i in (("fixed", 0), ("learned", 1), ("loo", best_loo),
                            ("oracle", best_test))}


def make_report(config, arrays, learned: dict[str, float]) -> Report:
  """Test MSEs and bandwidths of every kernel (learned: {kernel: h}, in config's order) and
  method, linear regression's test MSE, the first kernel's attention heatmap and the drawing
  of the fits.

  test/mse_<k>_<fixed|learned|loo|oracle> = mean over the test grid of (f̂_h(x) − f(x))²,
  test/bandwidth_<k>_<...> = h (`choose_bandwidths`), and test/mse_linear (least squares
  a + b x). The attention weights (test × train) of the first kernel with its learned h are
  drawn as attention_<k>.png, and every fit with the training points as fit.svg (a report's
  files other than heatmaps are text).
  """
  x_train, y_train, x_test, y_test = (arrays[k] for k in ("x_train", "y_train", "x_test", "y_test"))
  metrics, curves = {}, {}
  for kernel, h in learned.items():
    chosen = choose_bandwidths(config, arrays, kernel, h)
    for method, (bandwidth, mse, _) in chosen.items():
      metrics[f"test/mse_{kernel}_{method}"] = mse
      metrics[f"test/bandwidth_{kernel}_{method}"] = bandwidth
    curves[f"{kernel}, learned h = {h:.3g}"] = chosen["learned"][2]
  a, b = linear_fit(x_train, y_train)
  linear = a + b * x_test.astype(np.float64)
  metrics["test/mse_linear"] = float(np.mean(np.square(linear - y_test)))
  curves["linear regression"] = linear
  # The first kernel's weights only: drawing a heatmap takes about a second.
  kernel, h = next(iter(learned.items()))
  _, weights = jax.jit(predict, static_argnames=("kernel", "return_weights", "dtype"))(
      x_test, x_train, y_train, kernel=kernel, bandwidth=h, return_weights=True,
      dtype=compute_dtype(config))
  heatmap = Heatmap(np.asarray(weights), [f"{x:.1f}" for x in x_test],
                    [f"{x:.1f}" for x in x_train],
                    f"Nadaraya–Watson attention weights, {kernel} kernel, learned h = {h:.3g} "
                    "(rows: test x, columns: training x)")
  return Report(metrics=metrics, heatmaps={f"attention_{kernel}": heatmap},
                texts={"fit.svg": draw_fit(arrays, curves)})


def draw_fit(arrays, curves: dict[str, np.ndarray]) -> str:
  """An SVG drawing of the training points, the true f and each curve [num_test] on x_test."""
  figure = Figure(figsize=(7, 4.5))
  ax = figure.add_subplot()
  x_test = arrays["x_test"]
  ax.plot(arrays["x_train"], arrays["y_train"], "o", color="0.6", ms=4, label="training points")
  ax.plot(x_test, arrays["y_test"], "k-", lw=2, label="true f(x) = 2 sin x + x^0.8")
  for label, curve in curves.items():
    ax.plot(x_test, curve, "--" if label.startswith("linear") else "-", label=label)
  ax.set_xlabel("x")
  ax.set_ylabel("y")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  figure.tight_layout()
  buffer = io.StringIO()
  figure.savefig(buffer, format="svg", metadata={"Date": None})
  return buffer.getvalue()


register("kernel_regression", validate=validate, build=build, build_model=build_model,
         inference=inference)
