# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Nadaraya–Watson kernel regression: kernels and bandwidths
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/REPO/blob/main/notebooks/kernel_regression_bandwidths.ipynb)
#
# Nadaraya–Watson regression is attention whose query–key score is a kernel of the
# distance: f(q) = Σ_j softmax-like weights K(|q − k_j| / h) · y_j. From 50 noisy samples
# of y = 2 sin x + x^0.8 we fit Gaussian, box and triangle kernels with a fixed bandwidth
# h = 1, a learned one (gradient descent on the leave-one-out training error), a
# leave-one-out cross-validated one and the oracle (the best test error on a grid), and
# compare with linear regression. The runs are `experiments/kernel_regression.py` (seconds
# each on a CPU, kept in `runs/kernel_regression`); the second part averages 20 seeds with
# its `--sweep`. The suite's long tier runs the quick mode (3 seeds, fewer steps).

# %%
# @title Install the repository
# From this checkout when the notebook runs inside it; otherwise (Colab) cloned from
# REPOSITORY: the repository's address (tools/set_repository.py writes it here), or any git
# URL you type instead (your fork, a mirror). The JAX installed already is kept (Colab's, with
# its GPU or TPU plugin). RUNS_ON_DRIVE keeps runs/ on Google Drive (Colab only), so that this
# notebook run again on a new runtime resumes where the last one stopped. The checkout goes
# on sys.path, so `research` imports in this running kernel without a restart.
REPOSITORY = "https://github.com/OWNER/REPO"  # @param {type:"string"}
RUNS_ON_DRIVE = False  # @param {type:"boolean"}
import os
import subprocess
import sys


class Stop(Exception):   # IPython shows its message alone, without a traceback
  _render_traceback_ = lambda self: [str(self)]


root = os.path.abspath(".." if os.path.exists("../pyproject.toml") else "research-repo")
if not os.path.exists(os.path.join(root, "pyproject.toml")):
  if REPOSITORY.endswith("/OWNER/REPO"):
    raise Stop("This notebook's repository address is not set: type it in REPOSITORY above, "
               "or run `python3 tools/set_repository.py OWNER/NAME` in a clone and push.")
  if subprocess.run(["git", "clone", "--depth=1", "-q", REPOSITORY, root]).returncode != 0:
    raise Stop(f"git clone {REPOSITORY} failed (git's message is above)")
for path in (root, os.path.join(root, "notebooks")):   # research; colab.py beside the notebooks
  if path not in sys.path:
    sys.path.insert(0, path)
import colab

colab.install(root, RUNS_ON_DRIVE)

# %%
from IPython.display import SVG, Image, Markdown, display

from research.training import apply_overrides

QUICK, experiment, workdir = colab.setup(root, "kernel_regression")
SIZE = {"train.num_steps": 100, "train.eval_every": 50} if QUICK else {}
config = apply_overrides(experiment.get_config(), SIZE)
SMOOTHING_KERNELS = config.model.kernels.split(",")
METHODS = ("fixed", "learned", "loo", "oracle")


def table(metrics: dict) -> str:
  """Markdown: test MSE per kernel and bandwidth choice, linear regression last."""
  lines = ["| kernel | " + " | ".join(METHODS) + " |", "|---" * (len(METHODS) + 1) + "|"]
  for kernel in SMOOTHING_KERNELS:
    lines.append(f"| {kernel} | " + " | ".join(
        f"{metrics[f'test/mse_{kernel}_{m}']:.4f}" for m in METHODS) + " |")
  lines.append(f"| linear regression | {metrics['test/mse_linear']:.4f} |" + " |" * 3)
  return "\n".join(lines)


# %% [markdown]
# ## One run (seed 0)
# Test MSE against the true function for every kernel and bandwidth choice.

# %%
run = os.path.join(workdir, "seed0")
final = colab.train(config, run)
display(Markdown(table(final)))

# %% [markdown]
# ## The fits and the attention matrix
# Each test point's prediction is a weighted mean of the training targets; the heatmap shows
# those weights (rows: test points, columns: training points, sorted by x) for the
# Gaussian kernel at the learned bandwidth.

# %%
display(SVG(filename=os.path.join(run, "fit.svg")))
for name in sorted(f for f in os.listdir(run) if f.startswith("attention_")):
  display(Markdown(f"`{name}`"), Image(os.path.join(run, name)))

# %% [markdown]
# ## Averaged over seeds
# The mean test MSE over the sweep's seeds (20; 3 in quick mode): how far each data-driven
# bandwidth stays from the oracle. `research.predict.compare_runs` reads the sweep back as
# one row per run (the config key that differs, here the seed; the final metrics; where
# each ran), and warns if the rows mix commits, versions or devices.

# %%
from research.predict import compare_runs

points = experiment.get_sweep()[:3] if QUICK else experiment.get_sweep()
colab.sweep(config, points, os.path.join(workdir, "seeds"))
runs = compare_runs(os.path.join(workdir, "seeds"))
display(runs[["seed", "status", "test/mse_gaussian_learned", "test/mse_gaussian_oracle",
              "provenance/commit"]].head(3))
mean = runs.filter(like="test/mse").mean()
display(Markdown(f"Mean over {len(runs)} seeds:\n\n" + table(mean)))
for kernel in SMOOTHING_KERNELS:
  oracle = mean[f"test/mse_{kernel}_oracle"]
  print(f"{kernel:9s} learned / oracle {mean[f'test/mse_{kernel}_learned'] / oracle:.2f}   "
        f"loo / oracle {mean[f'test/mse_{kernel}_loo'] / oracle:.2f}")

# %% [markdown]
# ## Restore a run and ask it something new
# `research.training.restore` loads the seed-0 run back from its directory (config, model,
# the learned bandwidths of its last checkpoint), and `research.predict.regress` estimates
# at 400 points between the training points, with each estimate's weights over them.
# Left: each kernel's estimate (learned h) over the training points and the true f.
# Right: the weights of one query point over the training points.

# %%
import matplotlib.pyplot as plt
import numpy as np

from research import predict, training
from research.data.regression_1d import true_function
from research.training.metrics import figure_png

restored = training.restore(run)
x_train, y_train = restored.extras["x_train"], restored.extras["y_train"]
grid = np.linspace(x_train.min(), x_train.max(), 400)
fits = predict.regress(restored, grid)
query = len(grid) // 2
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.scatter(x_train, y_train, color="gray", s=12, label="training points")
left.plot(grid, true_function(grid), color="black", linestyle=":", label="true f")
for kernel, fit in fits.items():
  left.plot(grid, fit.estimates, label=f"{kernel} (h = {fit.bandwidth:.3f})")
  right.plot(x_train, fit.weights[query], marker=".", label=kernel)
right.axvline(grid[query], color="gray", linestyle=":", label=f"query x = {grid[query]:.2f}")
left.set_xlabel("x")
left.set_title("estimates between the training points")
left.legend(fontsize="small")
right.set_xlabel("training point x_i")
right.set_ylabel("weight α(x, x_i)")
right.set_title("one query's weights")
right.legend(fontsize="small")
fig.tight_layout()
lines = ["| kernel | learned h | f̂(query) | f(query) | training points with weight > 0 |",
         "|---|---|---|---|---|"]
lines += [f"| {kernel} | {fit.bandwidth:.3f} | {fit.estimates[query]:.3f} | "
          f"{true_function(grid[query]):.3f} | {np.count_nonzero(fit.weights[query])} |"
          for kernel, fit in fits.items()]
display(Markdown("\n".join(lines)), Image(figure_png(fig)))
