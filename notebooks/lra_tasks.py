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
# # Long Range Arena beyond ListOps: Pathfinder, Text, Retrieval, Image
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/REPO/blob/main/notebooks/lra_tasks.ipynb)
#
# Long Range Arena (Tay et al., ICLR 2021) judges efficient attentions on five tasks; the
# papers that beat it (S4, S5, LRU) are judged on the same five. ListOps has its own notebook
# (`listops_attention_variants`); here are the other four, `experiments/lra.py`:
#
# * **Pathfinder**: is there a path between the two dots? 32 × 32 images read pixel by
#   pixel (1 024 tokens), generated here with the paper's recipe (`research.data.pathfinder`).
#   On it the papers' ordering is stark: LRA's transformers 66–77%, S5 and LRU 95%.
# * **Text** (IMDB reviews as bytes), **Retrieval** (pairs of ACL papers as bytes, a
#   two-tower encoder) and **Image** (CIFAR-10 as 1 024 grey levels): public data sets,
#   read from your copy (nothing is downloaded). Point the variables `LRA_TEXT`,
#   `LRA_RETRIEVAL` and `LRA_IMAGE` at the `aclImdb`, `lra_release/tsv_data` and
#   `cifar-10-batches-py` folders to train them too.
#
# We train every attention and the LRU / S5 blocks on the `cpu` preset of Pathfinder (the
# `--sweep` of `experiments/lra.py:task=pathfinder,preset=cpu`; a sweep already run into
# `runs/pathfinder_cpu` is read back instead of retrained) beside LRA's Table 1. The suite's
# long tier runs the quick mode: tiny models and data, so its accuracies mean nothing.

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
import numpy as np
from IPython.display import Image, Markdown, display

from research.data import pathfinder
from research.experiments.lra import LRA_TABLE_1, RECURRENCE_PAPERS
from research.training import apply_overrides
from research.training.metrics import figure_png
from research.training.sweep import point_name

QUICK, experiment, workdir = colab.setup(root, "lra", runs="pathfinder_cpu")
SIZE = ({"data.examples": 80, "model.num_layers": 1, "model.hidden_size": 8,
         "model.mlp_size": 8, "model.state_size": 4, "train.batch_size": 16,
         "train.num_steps": 10, "train.warmup_steps": 2, "train.log_every": 5,
         "train.eval_every": 10, "train.checkpoint_every": 10}
        if QUICK else {})
data_dir = {"data.dir": os.path.join(workdir, "data")} if QUICK else {}   # else root/data
config = apply_overrides(experiment.get_config("task=pathfinder,preset=cpu"), {**SIZE, **data_dir})

# %% [markdown]
# ## What Pathfinder looks like
# Two dots and paths of short dashes; the label says whether one path joins the dots.
# Distractor paths clutter the image, and the difficulty is the paths' length: 6, 9 or 14
# dashes (LRA's `curv_baseline`, `curv_contour_length_9`, `curv_contour_length_14`; LRA's
# Table 1 uses the hardest). The `cpu` preset trains on the easiest.

# %%
fig, axes = plt.subplots(3, 6, figsize=(9, 4.8))
for row, difficulty in zip(axes, pathfinder.DIFFICULTIES):
  images, labels = pathfinder.generate(seed=1, count=6, resolution=32, difficulty=difficulty)
  for ax, image, label in zip(row, images, labels):
    ax.imshow(image, cmap="gray", vmin=0, vmax=255)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("connected" if label else "apart", fontsize=8)
  row[0].set_ylabel(f"{difficulty}\n({pathfinder.DIFFICULTIES[difficulty][1]} dashes)",
                    fontsize=8)
fig.tight_layout()
display(Image(figure_png(fig)))

# %% [markdown]
# ## Train every attention and the linear recurrences on Pathfinder
# `colab.sweep` (`run_sweep`) trains each point of `experiment.get_sweep()` (one per
# `model.attention`, then one per recurrent `model.kind`) into its own directory, skipping
# finished ones; `research.predict.compare_runs` reads them back, one row a point with its
# final metrics and where it ran, and warns when the rows mix commits or ran side by side.
# The first run generates the images (`data.examples` of them, once, in LRA's release layout
# under `data/`). The committed outputs read a sweep put together from the points recorded in
# `results/pathfinder_cpu/` (finished points are read back, not trained again; no checkpoints
# are recorded), with the two runs restored below (full attention, LRU) trained into it: the
# rows come from two commits of the same model and data code (the warnings).

# %%
from research.predict import compare_runs

points = ([{"model.attention": "full"}, {"model.kind": "lru"}] if QUICK
          else experiment.get_sweep())                       # CI: full attention and LRU
colab.sweep(config, points, workdir)
rows = compare_runs(workdir)
names = [point.get("model.kind", point.get("model.attention")) for point in points]
display(rows.groupby("provenance/commit", sort=False, dropna=False).size().rename("points")
        .to_frame())

# %% [markdown]
# ## Accuracy and speed beside LRA's Table 1
# Test accuracy on the held-out tenth of the images; steps/s is the median training rate
# (two runs side by side on the machine's two cores, one core each). LRA's column is its
# Table 1 (Pathfinder 32 × 32, the hardest set, LRA's own recipe); LRU's and S5's are their
# papers' (deeper models trained far longer): neither was measured here.

# %%
def published(name: str) -> str:
  figure = LRA_TABLE_1["pathfinder"].get(name, RECURRENCE_PAPERS.get(name, {}).get("pathfinder"))
  return "—" if figure is None else f"{figure:.2f}%"


header = ["attention or block", "test accuracy", "published (LRA's setting)", "steps/s",
          "minutes"]
lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
for name, (_, row) in zip(names, rows.iterrows()):
  lines.append(f"| {name} | {row['test/accuracy']:.2%} | {published(name)} | "
               f"{row['perf/steps_per_second']:.2f} | {row['perf/wall_seconds'] / 60:.1f} |")
accuracy = dict(zip(names, rows["test/accuracy"]))
recurrent = max(accuracy.get(kind, 0.0) for kind in ("lru", "s5"))
attention = max(a for name, a in accuracy.items() if name not in ("lru", "s5"))
margin = 100 * (recurrent - attention)
lines.append(f"\nThe best linear recurrence minus the best attention: **{margin:+.1f} points** "
             f"(the goal: +10; {'met' if margin >= 10 else f'missed by {10 - margin:.1f}'}).")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Learning curves
# Validation accuracy during training, from each run's `metrics.jsonl`; chance is 50%.

# %%
fig, ax = plt.subplots(figsize=(7, 5))
for name, point in zip(names, points):
  with open(os.path.join(workdir, point_name(point), "metrics.jsonl")) as f:
    curve = [(r["step"], 100 * r["eval/accuracy"]) for r in map(json.loads, f) if "eval/accuracy" in r]
  ax.plot(*zip(*curve), marker=".", label=name)
ax.axhline(50, color="gray", linestyle=":", label="chance")
ax.set_xlabel("step")
ax.set_ylabel("validation accuracy (%)")
ax.legend(fontsize="small", ncol=2)
fig.tight_layout()
display(Image(figure_png(fig)))

# %% [markdown]
# ## Text, Retrieval and Image, from your files
# Each trains on its `cpu` preset with full attention when its variable names your copy of
# the data set; LRA's Table 1 row for each task is beside it.

# %%
FILES = {"text": os.environ.get("LRA_TEXT", ""), "retrieval": os.environ.get("LRA_RETRIEVAL", ""),
         "image": os.environ.get("LRA_IMAGE", "")}
lines = ["| task | test accuracy (cpu preset, full) | LRA Table 1: full | its best attention |",
         "|---|---|---|---|"]
for task, files in FILES.items():
  measured = "— (set LRA_" + task.upper() + ")"
  if files and not QUICK:
    task_config = apply_overrides(experiment.get_config(f"task={task},preset=cpu"),
                                  {"data.files": files})
    (row,) = colab.sweep(task_config, [{"model.attention": "full"}],
                         os.path.join(root, "runs", f"{task}_cpu"))
    measured = f"{row['test/accuracy']:.2%}"
  table = LRA_TABLE_1[task]
  best = max(table, key=table.get)
  lines.append(f"| {task} | {measured} | {table['full']:.2f}% | {best} {table[best]:.2f}% |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Restore a run and ask it something new
# `research.training.restore` loads a run back from its directory (config, model, the
# parameters of its last checkpoint) and `research.predict.classify_lra` answers new images.
# We draw fresh ones under another seed than the run's, at each difficulty, and ask full
# attention and the LRU: trained on the easiest set, do they follow longer paths?

# %%
from research import predict, training

lines = ["| run | easy | intermediate | hard |", "|---|---|---|---|"]
probe = 32 if QUICK else 500
restored = ("lru",) if QUICK else ("full", "lru")          # CI: the LRU's run alone
for name, point in ((n, p) for n, p in zip(names, points) if n in restored):
  run = training.restore(os.path.join(workdir, point_name(point)))
  scores, drawn = [], {}
  for difficulty in pathfinder.DIFFICULTIES:
    images, labels = pathfinder.generate(seed=run.config.data.seed + 1, count=probe,
                                         resolution=32, difficulty=difficulty)
    answers = predict.classify_lra(run, images, attention=False)
    drawn[difficulty] = images, labels, answers.probabilities
    scores.append(float(np.mean(answers.labels == labels)))
  lines.append(f"| {name} | " + " | ".join(f"{s:.1%}" for s in scores) + " |")
display(Markdown("\n".join(lines)))

# %%
images, labels, probabilities = (part[:8] for part in drawn["easy"])   # the last run probed
fig, axes = plt.subplots(1, 8, figsize=(12, 2))
for ax, image, label, p in zip(axes, images, labels, probabilities[:, 1]):
  ax.imshow(image, cmap="gray", vmin=0, vmax=255)
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title(f"{'joined' if label else 'apart'}\np(joined) {p:.2f}", fontsize=8)
fig.suptitle(f"{restored[-1]}: fresh easy images", fontsize=9)
fig.tight_layout()
display(Image(figure_png(fig)))
