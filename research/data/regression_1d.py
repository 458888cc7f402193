"""Data of the kernel_regression experiment (the Nadaraya–Watson example of d2l.ai §10.2):
noisy training points of f(x) = 2 sin x + x^0.8 and a test grid with the noise-free f.
"""

import numpy as np


def true_function(x: np.ndarray) -> np.ndarray:
  """f(x) = 2 sin x + x^0.8 (x ≥ 0)."""
  return 2 * np.sin(x) + x**0.8


def test_size(x_max: float, spacing: float) -> int:
  """How many points test_grid(x_max, spacing) has: ceil(x_max / spacing)."""
  return int(np.ceil(x_max / spacing - 1e-9))


def test_grid(x_max: float, spacing: float) -> np.ndarray:
  """0, spacing, 2·spacing, … strictly below x_max (up to rounding): [test_size(...)]."""
  return spacing * np.arange(test_size(x_max, spacing))


def generate(seed: int, *, num_train: int = 50, x_max: float = 5.0, noise_std: float = 0.5,
             test_spacing: float = 0.1) -> dict[str, np.ndarray]:
  """The training points and the test grid, float32:

    training   x_i ~ U(0, x_max), sorted, i = 1 … num_train;  y_i = f(x_i) + ε_i,  ε_i ~ N(0, σ²)
    test       the grid x = 0, s, 2s, … below x_max, with the noise-free targets f(x)

  σ = noise_std, s = test_spacing; with the defaults the test grid is 0, 0.1, …, 4.9.
  Everything is drawn from np.random.default_rng(seed): the same seed gives the same data.
  Returns {"x_train": [num_train] ascending, "y_train": [num_train] (noisy),
  "x_test": [num_test], "y_test": [num_test] = f(x_test) (noise-free)}.
  """
  rng = np.random.default_rng(seed)
  x_train = np.sort(rng.uniform(0.0, x_max, num_train))
  y_train = true_function(x_train) + rng.normal(0.0, noise_std, num_train)
  x_test = test_grid(x_max, test_spacing)
  arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test,
            "y_test": true_function(x_test)}
  return {name: a.astype(np.float32) for name, a in arrays.items()}
