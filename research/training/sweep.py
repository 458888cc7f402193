"""Sweeps: every point of a config's get_sweep() into its own subdirectory, plus a summary.

A point whose final_metrics.json is there and readable is done and skipped; one whose
file cannot be read (cut short by an older version's kill, say) is trained again, which
resumes from its last checkpoint and writes the file anew.
"""

import csv
import io
import os
import sys

from research import files
from research.errors import ConfigError, UserError
from research.training.experiment import Experiment
from research.training.loop import FINAL_METRICS, train, validate
from research.training.validation import apply_overrides

SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"


def point_name(point: dict) -> str:
  """{"model.kind": "lstm", "data.length": 50} -> "model.kind=lstm,data.length=50"."""
  return ",".join(f"{key}={value}" for key, value in point.items()).replace("/", "_")


def point_configs(config, points, experiment: Experiment, validate=validate) -> list:
  """Each point's config (config with the point's overrides), checked by validate(config,
  experiment) before any point runs; ConfigError naming the point (its index in get_sweep()
  and its overrides)."""
  if not isinstance(points, (list, tuple)) or not all(isinstance(p, dict) for p in points):
    raise ConfigError(f"get_sweep() must return a list of {{config key: value}} dicts, got "
                      f"{points!r:.200}")
  if not points:
    raise ConfigError("get_sweep() returned no point; a sweep needs at least one")
  first = {}
  configs = []
  for index, point in enumerate(points):
    name = point_name(point)
    if not point:
      raise ConfigError(f"sweep point {index} is {{}}: each point needs at least one override "
                        "(its directory is named after them)")
    if name in first:
      raise ConfigError(f"sweep points {first[name]} and {index} are the same ({name}); each "
                        "point needs its own overrides")
    first[name] = index
    try:
      configs.append(apply_overrides(config, point))
      validate(configs[-1], experiment)
    except ConfigError as error:
      raise ConfigError(f"sweep point {index} ({name}): {error}") from None
  return configs


def run_sweep(config, points: list[dict], workdir: str, experiment: Experiment) -> list[dict]:
  """Trains each point (resuming unfinished ones, skipping finished ones) and writes
  summary.csv / summary.md of the final metrics. Every point's config is validated
  once, before the first one starts. Returns one row per point: its overrides + final
  metrics."""
  configs = point_configs(config, points, experiment)
  rows = []
  for index, (point, point_config) in enumerate(zip(points, configs, strict=True)):
    point_dir = os.path.join(workdir, point_name(point))
    final = _finished(point_dir)
    if final is None:
      try:
        final = train(point_config, point_dir, experiment)
      except UserError as error:     # a file or workdir of this point: say which point
        raise type(error)(f"sweep point {index} ({point_name(point)}): {error}") from error
    rows.append({**point, **final})
    write_summary(rows, workdir)
  return rows


def _finished(point_dir: str) -> dict | None:
  """The final metrics of a finished point, None for a point to (re)train."""
  try:
    return files.read_json(os.path.join(point_dir, FINAL_METRICS))
  except FileNotFoundError:
    return None
  except files.UnreadableFile as error:
    print(f"sweep: {error}; training the point again (it resumes from its last checkpoint)",
          file=sys.stderr, flush=True)
    return None


def write_summary(rows: list[dict], workdir: str) -> None:
  """summary.csv and summary.md of the rows, each written whole."""
  columns = list(dict.fromkeys(key for row in rows for key in row))
  table = io.StringIO()
  writer = csv.DictWriter(table, columns)
  writer.writeheader()
  writer.writerows(rows)
  files.write_text(os.path.join(workdir, SUMMARY_CSV), table.getvalue())
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
  files.write_text(os.path.join(workdir, SUMMARY_MD), "\n".join(lines) + "\n")


def _cell(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)
