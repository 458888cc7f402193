"""kernel_regression: Nadaraya–Watson regression (attention with a kernel of |query − key|) on
y = 2 sin x + x^0.8 + N(0, 0.5²), 50 training points, test grid 0, 0.1, …, 4.9 (d2l.ai §10.2).

  python launch.py --config experiments/kernel_regression.py --workdir runs/kernel_regression

For the Gaussian, box and triangle kernels: test MSE against the true function with the
fixed bandwidth h = 1, the learned one (AdamW on the leave-one-out training MSE), the
leave-one-out cross-validated one (grid search) and the oracle (the grid's best test MSE),
and linear regression (research/experiments/kernel_regression.py). Writes attention_<kernel>.png
(weights, test × train) and fit.svg (the fits and the training points) into the workdir.

Expected (seed 0): test MSE against the true f (bandwidth h in brackets), in about 8 s on a
2-core CPU (5 s inside the loop: 300 full-batch steps, the report and the drawings):

  kernel     fixed           learned          loo              oracle
  gaussian   0.301  (1)      0.0284 (0.204)   0.0285 (0.202)   0.0250 (0.251)
  box        0.0837 (1)      0.0837 (1)       0.0417 (0.328)   0.0276 (0.377)
  triangle   0.0421 (1)      0.0437 (1.05)    0.0256 (0.537)   0.0247 (0.583)
  linear regression 0.881

The sweep over seeds 0 … 19 (one run each, summary.csv / summary.md of every run's final
metrics in the workdir; about 70 s), and the mean of each test/mse_* over the seeds:

  python launch.py --config experiments/kernel_regression.py --sweep --workdir runs/kr_seeds
  python -c "import csv, statistics as s; rows = list(csv.DictReader(open(
      'runs/kr_seeds/summary.csv'))); print({k: round(s.mean(float(r[k]) for r in rows), 4)
      for k in rows[0] if k.startswith('test/mse')})"

Measured means over the 20 seeds (oracle-relative in brackets):

  kernel     fixed    learned          loo              oracle
  gaussian   0.4176   0.0752 (1.12×)   0.0769 (1.14×)   0.0673
  box        0.2049   0.2049 (3.66×)   0.0851 (1.52×)   0.0560
  triangle   0.1052   0.0738 (1.38×)   0.0762 (1.43×)   0.0534
  linear regression 0.9278

Learned and loo minimise the same leave-one-out MSE: for the Gaussian their bandwidths agree
within 0.6% on 19 seeds (on seed 5 gradient descent from h = 1 stops in a local minimum at
0.197, the grid's minimum is 0.144); the triangle's bumpy criterion stops it early on seeds
0, 5 and 13; the box kernel's gradient is zero, so its learned h stays 1. For the Gaussian
both stay 12–14% above the oracle (10% was the goal): the price of choosing h from 50 noisy
points by leave-one-out error, not of the optimisation (the grid search does no better).
"""

import ml_collections

from research.training.config import base_config, parse_variants

SWEEP_SEEDS = 20


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  parse_variants(arg, {})                 # no variants: refuses any argument
  config = base_config()
  config.experiment = "kernel_regression"
  config.train.num_steps = 300
  config.train.batch_size = 50            # every training point in each step (≤ data.num_train)
  config.train.learning_rate = 0.05       # on log h
  config.train.grad_clip_norm = 0.0       # no clipping: it would couple the kernels' bandwidths
  config.train.log_every = 50
  config.train.eval_every = 100
  config.train.checkpoint_every = 300

  config.data = ml_collections.ConfigDict()
  config.data.num_train = 50              # training points, x ~ U(0, x_max), sorted
  config.data.x_max = 5.0
  config.data.noise_std = 0.5             # σ of the noise on the training targets
  config.data.test_spacing = 0.1          # test grid 0, s, 2s, … below x_max

  config.model = ml_collections.ConfigDict()
  config.model.kernels = "gaussian,box,triangle"   # comma-separated subset, one learned h each
  config.model.bandwidth = 1.0            # the fixed h, and the learned h's initial value
  config.model.grid_min = 0.01            # loo / oracle search geomspace(grid_min, grid_max,
  config.model.grid_max = 10.0            # grid_size)
  config.model.grid_size = 1000
  config.model.dtype = "float32"          # the weighted sums' dtype: float32 | bfloat16 | float16
  return config


def get_sweep() -> list[dict]:
  """The default config at seeds 0 … 19 (new data and a new run each)."""
  return [{"seed": seed} for seed in range(SWEEP_SEEDS)]
