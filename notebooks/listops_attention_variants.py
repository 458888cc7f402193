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
# # Attention variants on Long Range Arena's ListOps
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/REPO/blob/main/notebooks/listops_attention_variants.ipynb)
#
# ListOps (Nangia & Bowman 2018, as the Long Range Arena made it) asks for the value of a
# nested expression such as `[MAX 2 9 [MIN 4 7 ] 0 ]` written as a long flat token
# sequence. We train the same transformer encoder classifier with each attention of
# `research.models.EncoderClassifier` — every row of LRA's Table 1 (full, local,
# Longformer, Sparse Transformer, BigBird, Linformer, Linear Transformer, Performer,
# Synthesizer, Sinkhorn, Reformer) and memory-compressed — and then with a linear
# recurrence (LRU, S5) in each block's attention's place, and compare test accuracy,
# training speed and memory, beside the LRA paper's Table 1. The runs are the `--sweep` of
# `experiments/listops.py:preset=cpu` (4–13 minutes per point on a 2-core CPU); a
# sweep already run into `runs/listops_cpu` is read back instead of retrained. The suite's long tier runs the
# quick mode: tiny models and data, so its accuracies mean nothing.

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
import json

import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

from research.experiments.listops import LRA_TABLE_1
from research.training import apply_overrides
from research.training.metrics import figure_png

QUICK, experiment, workdir = colab.setup(root, "listops", runs="listops_cpu")
SIZE = ({"data.min_tree_length": 8, "data.max_tree_length": 150, "data.train_examples": 256,
         "data.eval_examples": 32, "data.test_examples": 64, "data.max_length": 128,
         "data.length_buckets": 1, "model.num_layers": 1, "model.hidden_size": 16, "model.mlp_size": 32,
         "model.window": 4, "model.proj_len": 8, "train.batch_size": 16, "train.num_steps": 20,
         "train.warmup_steps": 5, "train.log_every": 10, "train.eval_every": 20,
         "train.checkpoint_every": 20}
        if QUICK else {})
data_dir = {"data.dir": os.path.join(workdir, "data")} if QUICK else {}   # else root/data
config = apply_overrides(experiment.get_config("preset=cpu"), {**SIZE, **data_dir})

# %% [markdown]
# ## Train every attention variant
# `colab.sweep` (`run_sweep`) trains each point of `experiment.get_sweep()` (one per
# `model.attention`, then one per recurrent `model.kind`) into its own directory, skipping
# finished ones. `research.predict.compare_runs` reads the sweep back, one row a point: the
# config keys that differ, the final metrics and where each ran; it warns when the rows
# mix commits or machines, or ran side by side with other workers of the sweep.

# %%
from research.predict import compare_runs

points = experiment.get_sweep()[:2] if QUICK else experiment.get_sweep()   # CI: full, local
colab.sweep(config, points, workdir)
runs = compare_runs(workdir)
kinds = runs.get("model.kind", ["transformer"] * len(runs))       # lru, s5: blocks' kinds
names = [attention if kind == "transformer" else kind
         for kind, attention in zip(kinds, runs["model.attention"])]
display(runs[["model.attention", *(["model.kind"] if "model.kind" in runs else []),
              "status", "provenance/commit", "provenance/cores", "provenance/side_by_side"]])

# %% [markdown]
# ## Accuracy, speed and memory beside LRA's Table 1
# Test accuracy on the held-out split; steps/s is the median training rate; memory is
# XLA's estimate of one training step (arguments, outputs and temporaries). LRA's figures
# are for its own setting (length 500–2000, 6 layers of width 512), not this preset's.
# The committed outputs read a sweep run with `--workers 2` (two points at a time, one core
# each), beside test runs during its first points: its steps/s and minutes are not a point's
# alone (compare_runs' warning above); its accuracies are.

# %%
header = ["attention or block", "test accuracy", "LRA Table 1", "steps/s", "step memory (MiB)",
          "minutes"]
lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
for name, (_, row) in zip(names, runs.iterrows()):
  lra = f"{LRA_TABLE_1[name]:.2f}%" if name in LRA_TABLE_1 else "—"   # published, not run here
  lines.append(f"| {name} | {row['test/accuracy']:.2%} | {lra} | "
               f"{row['perf/steps_per_second']:.2f} | {row['perf/step_memory_mib']:.0f} | "
               f"{row.get('perf/wall_seconds', float('nan')) / 60:.1f} |")
display(Markdown("\n".join(lines)))

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for name, (_, row) in zip(names, runs.iterrows()):
  ax.scatter(row["perf/steps_per_second"], 100 * row["test/accuracy"], s=row["perf/step_memory_mib"])
  ax.annotate(name, (row["perf/steps_per_second"], 100 * row["test/accuracy"]),
              textcoords="offset points", xytext=(6, 4))
ax.axhline(17, color="gray", linestyle=":", label="majority class (≈ 17%)")
ax.set_xlabel("training steps / s")
ax.set_ylabel("test accuracy (%)")
ax.set_title("ListOps, cpu preset (marker area: step memory)")
ax.legend(loc="lower right")
fig.tight_layout()
display(Image(figure_png(fig)))

# %% [markdown]
# ## Learning curves
# Validation accuracy during training, from each run's `metrics.jsonl`.

# %%
fig, ax = plt.subplots(figsize=(7, 5))
for name, run in zip(names, runs["workdir"]):
  with open(os.path.join(run, "metrics.jsonl")) as f:
    curve = [(r["step"], 100 * r["eval/accuracy"]) for r in map(json.loads, f) if "eval/accuracy" in r]
  ax.plot(*zip(*curve), marker=".", label=name)
ax.set_xlabel("step")
ax.set_ylabel("validation accuracy (%)")
ax.legend(fontsize="small", ncol=2)
fig.tight_layout()
display(Image(figure_png(fig)))

# %% [markdown]
# ## Restore a run and ask it something new
# `research.training.restore` loads the full-attention run back from its directory
# (config, model, the parameters of its last checkpoint). We draw fresh expressions with
# the data's own generator (`research.data.listops`, the run's tree lengths) under another
# seed than the run's, keep those the model takes whole (at most `data.max_length` tokens;
# training truncates longer ones), and `research.predict.classify` them: the accuracy per
# operator at the root of the tree.

# %%
import numpy as np

from research import predict, training
from research.data import listops

restored = training.restore(runs["workdir"][names.index("full")])
d = restored.config.data
drawn = listops.draw_split_trees(d.seed + 1, (32 if QUICK else 500,),
                                 (d.min_tree_length, d.max_tree_length))[0]
trees = [t for t in drawn
         if len(listops.tokenize(listops.to_source(t), d.brackets)) <= d.max_length]
sources = [listops.to_source(t) for t in trees]
values = np.array([listops.evaluate(t) for t in trees])
result = predict.classify(restored, sources, attention=False)
roots = np.array([operator for operator, _ in trees])
lines = [f"{len(trees)} fresh expressions (seed {d.seed + 1}), `{restored.config.model.attention}` "
         f"attention, step {restored.step}:", "", "| root operator | expressions | accuracy |",
         "|---|---|---|"]
for operator in listops.OPERATORS:
  chosen = roots == operator
  accuracy = f"{np.mean(result.labels[chosen] == values[chosen]):.2%}" if chosen.any() else "—"
  lines.append(f"| `{operator[1:]}` | {chosen.sum()} | {accuracy} |")
lines.append(f"| all | {len(trees)} | {np.mean(result.labels == values):.2%} |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# One tree's attention: the shortest fresh expression, the weights of the first layer
# averaged over its heads (row: the query position, column: the key; with CLS pooling,
# position 0 is the CLS vector and token t sits at t + 1).

# %%
shortest = int(np.argmin(result.lengths))
one = predict.classify(restored, [sources[shortest]])
size = one.lengths[0] + (restored.config.model.pooling == "cls")
fig, ax = plt.subplots(figsize=(5.5, 5))
image = ax.imshow(one.attention[0][0].mean(0)[:size, :size], cmap="viridis")
fig.colorbar(image, ax=ax)
ax.set_xlabel("key position")
ax.set_ylabel("query position")
ax.set_title(f"{one.lengths[0]} tokens, value {values[shortest]}, predicted {one.labels[0]}")
fig.tight_layout()
display(Image(figure_png(fig)))
