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
# # Associative recall: which sequence mixer remembers what, against the model's width
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/REPO/blob/main/notebooks/mqar_recall.ipynb)
#
# Multi-query associative recall (MQAR; Arora, Eyuboglu et al., "Zoology", ICLR 2024): each
# sequence opens with N key-value pairs and then asks for every key once; the model must
# answer each key's value. The paper's Figure 2 trains two-layer models of each sequence
# mixer at widths 64–512 on (length, pairs) from (64, 4) to (512, 64) and finds that
# **attention solves the task at every width, while the gated convolutions and recurrences
# need a width that grows with the number of pairs** (its Figure 2 and §3).
#
# Here: every causal attention of this repository, the linear-attention cell, the LRU, S5,
# the selective recurrences (Mamba, Mamba-2, GLA, DeltaNet), a GRU and an LSTM, on the `cpu`
# preset of `experiments/mqar.py` (a vocabulary of 512,
# length 64 with 8 and with 16 pairs, widths 64 and 128, two learning rates per family, 1 500
# steps of batch 64; the `zoology` preset is the paper's full grid, for a GPU). A sweep run
# into `runs/mqar_cpu` by
# `python launch.py --config experiments/mqar.py:preset=cpu --sweep --workdir runs/mqar_cpu`
# is read back instead of retrained. The suite's long tier runs the quick mode (two models at width 16 for 30
# steps), whose numbers mean nothing.

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
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from research.training.metrics import figure_png
from research.training.config import apply_overrides

QUICK, experiment, workdir = colab.setup(root, "mqar", runs="mqar_cpu")
config = experiment.get_config("preset=cpu")
if QUICK:   # CI: an attention and a recurrence at width 16, 30 steps
  config = apply_overrides(config, {
      "sweep.models": ("full", "lru"), "sweep.widths": (16,),
      "sweep.panels": ((32, 8, 8, 30),), "sweep.rates.attention": (3e-3,),
      "sweep.rates.ssm": (3e-3,), "data.train_examples": 256,
      "data.eval_examples": 64, "train.eval_every": 30})
points = experiment.get_sweep(config)
model_of = lambda p: p["model.attention"] if p["model.kind"] == "transformer" else p["model.kind"]
MODELS = [m for m in experiment.MODELS if m in config.sweep.models]
WIDTHS = tuple(config.sweep.widths)
PANELS = [(length, pairs) for length, pairs, *_ in config.sweep.panels]

# %% [markdown]
# ## Train every point
# `colab.sweep` (`run_sweep`) trains each point into its own directory, skipping finished
# ones; `research.predict.compare_runs` reads them back, one row a point with its final
# metrics and where it ran, and warns when the rows mix commits or ran side by side.
# `eval/accuracy` is the fraction of the 1 000 test sequences' queries answered with the
# right value. As Zoology does, each (model, width, panel) is scored at its best learning
# rate. A point whose loss became NaN (a rate too high for it) is recorded as diverged and
# scores nothing. The committed outputs read a sweep put together from the points recorded
# in `results/mqar_cpu/` and `results/mqar_cpu_selective/` (finished points are read back,
# not trained again; no checkpoints are recorded), with the points of the last selective
# panel and the four restored below trained into it: the rows come from several commits of
# the same model and data code and several processes at once (the warnings), so their
# timings are not a point's alone; their accuracies are.

# %%
from research.predict import compare_runs

colab.sweep(config, points, workdir)
rows = compare_runs(workdir)
display(rows.groupby("provenance/commit", sort=False, dropna=False).size().rename("points")
        .to_frame())
best = {}
for point, (_, row) in zip(points, rows.iterrows()):
  key = (model_of(point), point["model.hidden_size"], point["data.length"],
         point["data.num_pairs"])
  accuracy = row.get("eval/accuracy", -1.0)
  accuracy = -1.0 if accuracy != accuracy else accuracy   # NaN, no eval: the point diverged
  if key not in best or accuracy > best[key]["eval/accuracy"]:
    best[key] = {**row, "eval/accuracy": accuracy, "rate": point["train.learning_rate"]}

# %% [markdown]
# ## Query accuracy at the best learning rate
# Each cell: `eval/accuracy` (its learning rate). Chance is about 1 / N for a model that
# answers one of the values present, 2 / V for one that does not know which are values.

# %%
header = "| model | family | " + " | ".join(
    f"{length}, {pairs} pairs, width {width}" for length, pairs in PANELS for width in WIDTHS)
lines = [header + " |", "|---" * (2 + len(PANELS) * len(WIDTHS)) + "|"]
for model in MODELS:
  cells = [f"{best[model, w, l, n]['eval/accuracy']:.3f} ({best[model, w, l, n]['rate']:g})"
           if best[model, w, l, n]["eval/accuracy"] >= 0 else "diverged"
           for l, n in PANELS for w in WIDTHS]
  lines.append(f"| {model} | {experiment.family(model)} | " + " | ".join(cells) + " |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Zoology's Figure 2, drawn from this sweep
# Accuracy against the width, a line per model (colour by family), a panel per (length,
# pairs).

# %%
COLORS = {"attention": "tab:blue", "linear": "tab:orange", "ssm": "tab:green",
          "selective": "tab:purple", "rnn": "tab:red"}
STYLES = ["-", "--", ":", "-."]
fig, axes = plt.subplots(1, len(PANELS), figsize=(5.5 * len(PANELS), 4.5), squeeze=False)
for ax, (length, pairs) in zip(axes[0], PANELS):
  for model in MODELS:
    family = experiment.family(model)
    style = STYLES[experiment.FAMILIES[family].index(model) % len(STYLES)]
    ax.plot(WIDTHS, [best[model, w, length, pairs]["eval/accuracy"] for w in WIDTHS],
            marker="o", color=COLORS[family], linestyle=style, label=model)
  ax.set_xscale("log", base=2)
  ax.set_xticks(WIDTHS, [str(w) for w in WIDTHS])
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlabel("model width")
  ax.set_title(f"length {length}, {pairs} key-value pairs")
axes[0][0].set_ylabel("query accuracy")
fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center right", fontsize="small")
fig.tight_layout(rect=(0, 0, 0.86, 1))
display(Image(figure_png(fig)))

# %% [markdown]
# ## The paper's findings, checked
# Attention at least 99% at every width of every panel; at the smallest width and the most
# pairs, the linear attention, Performer, the LRU and S5 at least 30 points below full
# attention, and each rising with width (Zoology's Figure 2); there, DeltaNet and Mamba
# above the best of the LRU and S5 (the orderings of Zoology's sequels and of the DeltaNet
# paper: a selective recurrence closes part of the gap or all of it).

# %%
small, (length, pairs) = WIDTHS[0], max(PANELS, key=lambda panel: panel[1])
full = best["full", small, length, pairs]["eval/accuracy"]
lines = ["| check | measured | holds |", "|---|---|---|"]
for l, n in PANELS:
  lowest = min(best["full", w, l, n]["eval/accuracy"] for w in WIDTHS)
  lines.append(f"| full attention ≥ 0.99 at every width, ({l}, {n}) | lowest {lowest:.3f} | "
               f"{'yes' if lowest >= 0.99 else 'no'} |")
for model in ("linear", "performer", "lru", "s5"):
  if model not in MODELS:
    continue
  accuracy = [best[model, w, length, pairs]["eval/accuracy"] for w in WIDTHS]
  gap = full - accuracy[0]
  lines.append(f"| {model}: 30 points below full attention at width {small}, ({length}, "
               f"{pairs}) | {100 * gap:.1f} points | {'yes' if gap >= 0.30 else 'no'} |")
  rising = all(b > a for a, b in zip(accuracy, accuracy[1:]))
  lines.append(f"| {model}: rising with width at ({length}, {pairs}) | "
               f"{' → '.join(f'{a:.3f}' for a in accuracy)} | {'yes' if rising else 'no'} |")
time_invariant = [best[m, small, length, pairs]["eval/accuracy"] for m in ("lru", "s5")
                  if m in MODELS]
for model in ("deltanet", "mamba"):
  if model in MODELS and time_invariant:
    accuracy = best[model, small, length, pairs]["eval/accuracy"]
    lines.append(f"| {model} above the best of LRU and S5 at width {small}, ({length}, "
                 f"{pairs}) | {accuracy:.3f} against {max(time_invariant):.3f} | "
                 f"{'yes' if accuracy > max(time_invariant) else 'no'} |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Restore a run and ask it something new
# `research.training.restore` loads the best full-attention run and the best LRU run at the
# smallest width and the most pairs back from their directories, and
# `research.predict.recall` answers fresh sequences drawn with the data's own generator
# (`research.data.mqar.multi_query_recall`) under a seed of our own: the accuracy by how
# far back the key-value pair is from its query, and where full attention's second layer
# looks from one query (its weights over the pairs; the key's value is marked).

# %%
from research import predict, training
from research.data.mqar import multi_query_recall
from research.training.sweep import point_name

d = config.data
fresh = multi_query_recall(np.random.default_rng(2024), 64 if QUICK else 1000, length=length,
                           num_pairs=pairs, vocab_size=d.vocab_size, power=d.power)
distance = fresh["positions"] - (2 * np.arange(pairs) + 1)        # query − its value's position
lines = ["| model | fresh sequences: accuracy | eval/accuracy of the run |", "|---|---|---|"]
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
for model in ("full", "lru"):
  run_point = next(p for p in points if model_of(p) == model and p["model.hidden_size"] == small
                   and (p["data.length"], p["data.num_pairs"]) == (length, pairs)
                   and p["train.learning_rate"] == best[model, small, length, pairs]["rate"])
  run = training.restore(os.path.join(workdir, point_name(run_point)))
  answers = predict.recall(run, fresh["inputs"], fresh["positions"])
  correct = answers.tokens == fresh["targets"]
  lines.append(f"| {model} (width {small}) | {correct.mean():.3f} | "
               f"{best[model, small, length, pairs]['eval/accuracy']:.3f} |")
  bins = np.unique(distance)
  left.plot(bins, [correct[distance == k].mean() for k in bins], marker=".", label=model)
  if model == "full":
    weights = answers.attention[1][0, 0]                          # layer 2, sequence 0: [L, L]
    query = int(fresh["positions"][0, 0])
    right.bar(np.arange(2 * pairs), weights[query, :2 * pairs],
              color=["tab:gray" if t % 2 == 0 else "tab:blue" for t in range(2 * pairs)])
    right.bar([1], weights[query, 1], color="tab:red", label="the key's value")
    right.set_xticks(np.arange(0, 2 * pairs, 2), [f"k{i + 1}" for i in range(pairs)])
    right.set_title(f"full attention, layer 2: weights of the query at {query} (key 1) "
                    "over the pairs")
    right.set_ylabel("attention weight")
    right.legend()
left.set_xlabel("distance from the pair's value to its query (tokens)")
left.set_ylabel("query accuracy")
left.set_title(f"{len(distance)} fresh sequences, length {length}, {pairs} pairs")
left.legend()
fig.tight_layout()
display(Markdown("\n".join(lines)))
display(Image(figure_png(fig)))
