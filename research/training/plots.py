"""PNG figures for the workdir: loss curves and attention heatmaps (matplotlib, Agg), and
any figure as PNG bytes (what a notebook displays)."""

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from research.files import atomic_write  # noqa: E402
from research.training.experiment import Heatmap  # noqa: E402

MAX_INCHES = 40        # a heatmap's largest side (4000 pixels at 100 dpi)
MAX_LABELS = 100       # tick labels per axis at most


def plot_curves(history: list[dict], path: str, names=("train/loss", "eval/loss")) -> None:
  """Draws each metric in `names` against `step` from metrics.jsonl records."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in names:
    points = [(r["step"], r[name]) for r in history if name in r]
    if points:
      ax.plot(*zip(*points), label=name, marker="." if len(points) < 30 else None)
  ax.set_xlabel("step")
  ax.set_yscale("log" if all(r.get(n, 1) > 0 for r in history for n in names) else "linear")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  _save(fig, path)


def plot_heatmap(heatmap: Heatmap, path: str) -> None:
  """Weights [rows, cols] with token labels; rows are outputs, columns inputs. Large
  matrices are drawn at most MAX_INCHES a side with every k-th label (MAX_LABELS at most)."""
  values = np.asarray(heatmap.values, np.float32)
  rows, cols = values.shape
  fig, ax = plt.subplots(figsize=(min(MAX_INCHES, max(4, 0.3 * cols + 1.5)),
                                  min(MAX_INCHES, max(3, 0.3 * rows + 1))))
  image = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
  for set_ticks, labels in ((ax.set_xticks, heatmap.col_labels),
                            (ax.set_yticks, heatmap.row_labels)):
    every = -(-len(labels) // MAX_LABELS)             # a large matrix: every k-th label
    set_ticks(range(0, len(labels), every), labels[::every], fontsize=8)
  ax.set_xlabel("source")
  ax.set_ylabel("output")
  ax.set_title(heatmap.title, fontsize=9)
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  _save(fig, path)


def _save(fig, path: str) -> None:
  """The figure as a PNG file, written whole (see research/files.py); closes it."""
  try:
    with atomic_write(path, "wb") as f:
      fig.savefig(f, format="png", dpi=100)
  finally:
    plt.close(fig)


def figure_png(fig) -> bytes:
  """The figure as PNG bytes (e.g. for IPython.display.Image); closes it."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=100)
  plt.close(fig)
  return buffer.getvalue()
