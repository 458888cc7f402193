"""Sweeps: every point of a config's get_sweep() trained into its own subdirectory, plus a
summary of their final metrics; the root workdir is held as a run's is and records the sweep
(sweep.json), so that the same command resumes it (`run_sweep`; docs/running.md, "Sweeps").
"""

import csv
import io
import json
import os
import sys

import jax

from research import files
from research.errors import ConfigError, UserError, WorkdirError
from research.training import workdir as workdirs
from research.training.config import apply_overrides
from research.training.experiment import Experiment
from research.training.loop import train, validate
from research.training.metrics import NonFiniteLossError
from research.training.workdir import (
  CONFIG,
  FINAL_METRICS,
  SWEEP_RECORD,
  config_changes,
  read_json,
  read_record,
  write_json,
)

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
  summary.csv / summary.md of the final metrics. Every point's config and the root workdir
  are checked once, before the first point starts. Returns one row per point: its
  overrides + final metrics.

  The root workdir is held as a run's is (`research.training.workdir.hold`: refused while a
  live process holds it, left as found by a sweep refused before its first point starts)
  and records the sweep in sweep.json (its base config and points) once the first point
  starts. A root that holds a single run (config.json), or a sweep of other points or of
  another config (beyond workdir.RESUMABLE_KEYS and the keys every point sets), is refused
  (`check_sweep_workdir`); the same sweep command resumes it.

  A point whose final_metrics.json is there and readable is done and skipped; one whose file
  cannot be read (cut short by an older version's kill, say) is trained again, which resumes
  from its last checkpoint and writes the file anew. A point whose loss became NaN or Inf (a
  learning rate too high for it: a finding of the sweep, not a failure of it) is recorded as
  diverged, its final_metrics.json {"diverged": the loop's message}, and the sweep goes on;
  delete that file to train the point again.
  """
  configs = point_configs(config, points, experiment)
  with workdirs.hold(workdir) as lease:
    check_sweep_workdir(config, points, workdir)
    lease.on_start(lambda: _record(config, points, workdir))
    rows = []
    for index, (point, point_config) in enumerate(zip(points, configs, strict=True)):
      point_dir = os.path.join(workdir, point_name(point))
      final = _finished(point_dir)
      if final is None:
        try:
          final = train(point_config, point_dir, experiment, on_start=lease.start)
        except UserError as error:     # a file or workdir of this point: say which point
          raise type(error)(f"sweep point {index} ({point_name(point)}): {error}") from error
        except NonFiniteLossError as error:
          final = _diverged(point_dir, error)
          print(f"sweep point {index} ({point_name(point)}): {error}; recorded as diverged, "
                "the sweep goes on", file=sys.stderr, flush=True)
      rows.append({**point, **final})
      lease.start()                    # (every point done before: the summary writes first)
      write_summary(rows, workdir)
  return rows


def check_sweep_workdir(config, points: list[dict], workdir: str) -> None:
  """Refuses a root workdir that holds a single run (config.json), a sweep of other points
  or of another config (its sweep.json: the keys every point sets, and workdir.RESUMABLE_KEYS,
  aside), or an entry where the sweep writes one of another kind; before anything is
  compiled or written."""
  names = [point_name(point) for point in points]
  workdirs.check_entries(workdir, files=(SUMMARY_CSV, SUMMARY_MD, SWEEP_RECORD),
                         directories=tuple(names))
  if os.path.exists(os.path.join(workdir, CONFIG)):
    raise WorkdirError(f"workdir {workdir} holds a single run ({CONFIG}); a sweep needs a "
                       "workdir of its own (its points in subdirectories): give another "
                       "--workdir")
  record = read_record(workdir, SWEEP_RECORD, "the sweep there", "to run this sweep there")
  if record is None:
    return
  if not (isinstance(record, dict) and isinstance(record.get("config"), dict)
          and isinstance(record.get("points"), list)
          and all(isinstance(name, str) for name in record["points"])):
    raise WorkdirError(f"workdir {workdir} cannot be resumed: {workdir}/{SWEEP_RECORD} is no "
                       "sweep's record ({\"config\": …, \"points\": […]}); give another "
                       "--workdir")
  if sorted(record["points"]) != sorted(names):
    there = [name for name in record["points"] if name not in names]
    now = [name for name in names if name not in record["points"]]
    shown = "; ".join([f"{name} there" for name in there[:2]] + [f"{name} now" for name in now[:2]])
    raise ConfigError(f"workdir {workdir} holds a sweep of other points ({len(record['points'])} "
                      f"there, {len(names)} now: {shown or 'repeated'}"
                      f"{' …' if len(there) + len(now) > 4 else ''}); use a new --workdir")
  every_point_sets = set.intersection(*(set(point) for point in points))
  changes = config_changes(record["config"], json.loads(config.to_json_best_effort()), workdir,
                           ignored=every_point_sets)
  if changes:
    raise ConfigError(f"workdir {workdir} holds a sweep with a different config ({changes}); "
                      "use a new --workdir")


def _record(config, points: list[dict], workdir: str) -> None:
  """sweep.json: the sweep's base config and its points' names (process 0 writes it)."""
  if jax.process_index() == 0:
    files.write_json(os.path.join(workdir, SWEEP_RECORD),
                     {"config": json.loads(config.to_json_best_effort()),
                      "points": [point_name(point) for point in points]})


def _diverged(point_dir: str, error: NonFiniteLossError) -> dict:
  """The final metrics of a point whose loss became NaN or Inf, written as a finished
  point's (process 0 writes)."""
  final = {"diverged": str(error)}
  if jax.process_index() == 0:
    os.makedirs(point_dir, exist_ok=True)
    write_json(os.path.join(point_dir, FINAL_METRICS), final)
  return final


def _finished(point_dir: str) -> dict | None:
  """The final metrics of a finished point, None for a point to (re)train."""
  try:
    return read_json(os.path.join(point_dir, FINAL_METRICS))
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
