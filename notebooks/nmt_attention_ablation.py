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
# # Attention ablation on date translation
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/REPO/blob/main/notebooks/nmt_attention_ablation.ipynb)
#
# Dates written in 24 locales ("dimanche 14 janvier 2024", "2024年1月14日星期日", …) are
# translated into ISO `2024-01-14` by an encoder–decoder. We compare the fixed-length
# bottleneck (no attention) with Bahdanau's additive attention, Luong's attention with
# input feeding, Luong's local-p and hard attention, by calling the library directly:
# `colab.train(config, workdir)` (`research.training.train_and_evaluate`) with configs
# from `experiments/nmt_dates.py`. The outputs below are the full-size runs (1500 steps,
# about 1.5 minutes each on a 2-core CPU), kept in `runs/nmt_ablation` and read back when the
# notebook runs again; the suite's long tier runs the quick mode (`NOTEBOOK_QUICK=1`).

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

from IPython.display import Image, Markdown, display

from research.training import apply_overrides

QUICK, experiment, workdir = colab.setup(root, "nmt_dates", runs="nmt_ablation")
SIZE = ({"data.train_examples": 512, "data.eval_examples": 64, "data.test_examples": 64,
         "model.hidden_size": 32, "model.embed_size": 16, "train.batch_size": 32,
         "train.num_steps": 30, "train.eval_every": 30, "train.checkpoint_every": 30,
         "train.log_every": 10, "decode.beam_size": 2, "report.num_heatmaps": 1}
        if QUICK else {"train.num_steps": 1500, "train.eval_every": 500})
VARIANTS = {
    "no attention": "attention=none",
    "Bahdanau additive": "attention=additive",
    "Luong general + input feeding": "style=luong,attention=general,input_feeding=true",
    "Luong local-p": "style=luong,attention=local_p",
    "hard (Gumbel)": "style=luong,attention=hard",
}
if QUICK:   # CI: one variant with attention, enough for every cell below
  VARIANTS = {k: VARIANTS[k] for k in ("Bahdanau additive",)}

# %% [markdown]
# ## Train every variant
# Each call trains, evaluates on the validation split, then decodes the test split
# greedily and with beam search. The results also land in each run's directory
# (`metrics.jsonl`, `predictions.tsv`, attention heatmaps); each shows a progress bar here.

# %%
results = {name: colab.train(apply_overrides(experiment.get_config(variant), SIZE),
                             os.path.join(workdir, variant))
           for name, variant in VARIANTS.items()}

# %% [markdown]
# ## Exact match on held-out dates
# By source length: the bottleneck loses long inputs first.

# %%
buckets = sorted({k.rsplit("_len_", 1)[1] for r in results.values() for k in r if "_len_" in k},
                 key=lambda b: int(b.split("-")[0]))
header = ["variant", "exact (greedy)", "exact (beam)", "tokens (beam)",
          *(f"len {b}" for b in buckets)]
rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
for name, r in results.items():
  cells = [r["test/exact_match_greedy"], r["test/exact_match_beam"], r["test/token_accuracy_beam"],
           *(r.get(f"test/exact_match_beam_len_{b}", float("nan")) for b in buckets)]
  rows.append(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# ## Where the decoder looks
# Each row is an output character, each column a source character.

# %%
for variant in [v for v in ("attention=additive", "style=luong,attention=local_p")
                if v in VARIANTS.values()]:
  run = os.path.join(workdir, variant)
  for png in sorted(f for f in os.listdir(run) if f.startswith("attention_"))[:2]:
    display(Markdown(f"**{variant}**: `{png}`"), Image(os.path.join(run, png)))

# %%
with open(os.path.join(workdir, "attention=additive", "predictions.tsv"), encoding="utf-8") as f:
  print("".join(f.readlines()[:8]))
print(json.dumps({k: round(v, 4) for k, v in results["Bahdanau additive"].items()
                  if k.startswith("test/exact")}, indent=1))

# %% [markdown]
# ## Restore a run and ask it something new
# `research.training.restore` loads the Bahdanau run back from its directory: its config,
# model and the parameters of its last checkpoint. `research.predict.translate` then reads
# dates typed here, which need not be in any split, decoding greedily and with the run's
# beam search (`decode.beam_size`, GNMT's length penalty; the score is log P / lp).
# A text with a character the run's vocabulary lacks is refused, naming the character.

# %%
import matplotlib.pyplot as plt

from research import predict, training
from research.training.metrics import figure_png

restored = training.restore(os.path.join(workdir, VARIANTS["Bahdanau additive"]))
DATES = ["14 janvier 2024", "2024年1月14日", "Sunday, January 14, 2024"]
greedy = predict.translate(restored, DATES)
beam = predict.translate(restored, DATES, beam_size=restored.config.decode.beam_size,
                         length_penalty=restored.config.decode.length_penalty)
rows = ["| typed | greedy | beam | beam score |", "|---|---|---|---|"]
rows += [f"| {text} | {g or '(none)'} | {b or '(none)'} | {score:.3f} |"
         for text, g, b, score in zip(DATES, greedy.outputs, beam.outputs, beam.scores)]
display(Markdown(f"Step {restored.step}, beam size {restored.config.decode.beam_size}:\n\n"
                 + "\n".join(rows)))

# %% [markdown]
# The attention of the first date: each row an output character (its EOS last), each column
# a source character. For beam search the weights are the model's teacher-forced pass over
# the hypothesis it chose. (Matplotlib's default font has no CJK glyphs, so the map is of
# the French date.)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, (title, result) in zip(axes, (("greedy", greedy), ("beam", beam))):
  ax.imshow(result.attention[0], cmap="viridis", vmin=0, vmax=1)
  ax.set_xticks(range(len(result.source_tokens[0])), result.source_tokens[0])
  ax.set_yticks(range(len(result.output_tokens[0])), result.output_tokens[0])
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  ax.set_title(f"{title}: {DATES[0]!r} → {result.outputs[0]!r}")
fig.tight_layout()
display(Image(figure_png(fig)))
