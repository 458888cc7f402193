"""Sweeps: every point of a config's get_sweep() into its own subdirectory, plus a summary."""

import csv
import json
import os

from research.training.loop import train, validate
from research.training.experiment import Experiment
from research.training.validation import apply_overrides

SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"


def point_name(point: dict) -> str:
  """{"model.kind": "lstm", "data.length": 50} -> "model.kind=lstm,data.length=50"."""
  return ",".join(f"{key}={value}" for key, value in point.items()).replace("/", "_")


def run_sweep(config, points: list[dict], workdir: str, experiment: Experiment) -> list[dict]:
  """Trains each point (resuming unfinished ones, skipping finished ones) and writes
  summary.csv / summary.md of the final metrics. Every point's config is validated
  once, before the first one starts. Returns one row per point: its overrides + final
  metrics."""
  configs = [apply_overrides(config, point) for point in points]
  for point_config in configs:
    validate(point_config, experiment)
  rows = []
  for point, point_config in zip(points, configs, strict=True):
    point_dir = os.path.join(workdir, point_name(point))
    done = os.path.join(point_dir, "final_metrics.json")
    if os.path.exists(done):
      with open(done) as f:
        final = json.load(f)
    else:
      final = train(point_config, point_dir, experiment)
    rows.append({**point, **final})
    write_summary(rows, workdir)
  return rows


def write_summary(rows: list[dict], workdir: str) -> None:
  columns = list(dict.fromkeys(key for row in rows for key in row))
  with open(os.path.join(workdir, SUMMARY_CSV), "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
  with open(os.path.join(workdir, SUMMARY_MD), "w") as f:
    f.write("\n".join(lines) + "\n")


def _cell(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)
