"""Sweeps: every point of a config's get_sweep() trained into its own subdirectory, in this
process or in worker processes side by side, the points split over shards (machines) if
asked, plus one summary of their final metrics; the root workdir is held as a run's is and
records the sweep (sweep.json), so that the same command resumes it (`run_sweep`;
docs/running.md, "Sweeps").
"""

import csv
import io
import json
import os
import re
import sys

import jax

from research import files
from research.errors import ConfigError, UserError, WorkdirError
from research.training import sweep_workers
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
SUMMARY_LOCK = "summary.lock"    # held while a process (a shard) reads the points and writes it
PENDING = "pending"              # the summary's column of the points not finished yet


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


def run_sweep(config, points: list[dict], workdir: str, experiment: Experiment, *,
              workers: int = 1, shard: tuple[int, int] = (0, 1)) -> list[dict]:
  """Trains each point (resuming unfinished ones, skipping finished ones) and writes
  summary.csv / summary.md of the final metrics. Every point's config and the root workdir
  are checked once, before the first point starts. Returns the summary's rows: one per
  point, its overrides + final metrics, or + {"pending": True} for a point not finished yet
  (another shard's, or one a stop left).

  `workers`: 1 trains the points one after another in this process; N > 1 in N worker
  processes side by side (`sweep_workers`; at most one per CPU core, or per GPU on a GPU
  host: `sweep_workers.check_workers`), each taking the next point when it is free. Every
  point computes what it computes in the serial sweep (the same programs; on the CPU, the
  same numbers: docs/running.md, "Sweeps"). `shard` (I, N): this process trains the points
  whose index in get_sweep() % N == I (`parse_shard` reads "I/N"), so that N processes or
  machines sharing the workdir split the sweep; each holds the root as `workdir.hold`'s
  shard (they run side by side; a whole sweep or a run there is refused while they do),
  and each writes the summary, under summary.lock, of every point finished so far by any of
  them: the last to finish writes the whole one.

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
  index, count = check_shard(shard)
  slots = None if workers == 1 else sweep_workers.check_workers(workers)
  if slots is not None and slots[0].gpu is not None:
    sweep_workers.keep_on_the_cpu(workers)
  configs = point_configs(config, points, experiment)
  if slots is not None:
    check_for_workers(configs, experiment, workers)
  with workdirs.hold(workdir, shard=(index, count) if count > 1 else None) as lease:
    check_sweep_workdir(config, points, workdir)
    lease.on_start(lambda: _record(config, points, workdir))
    mine = range(index, len(points), count)
    finals = {k: final for k in mine
              if (final := _finished(os.path.join(workdir, point_name(points[k])))) is not None}
    todo = [k for k in mine if k not in finals]
    if slots is None:
      jobs = _jobs(todo, points, configs, workdir, experiment, lease.start)
      trained = ((job.key, job.function(*job.args)) for job in jobs)
    else:
      jobs = _jobs(todo, points, configs, workdir, experiment, sweep_workers.report_start)
      trained = sweep_workers.run(jobs, slots, on_start=lambda key: lease.start())
    for key, final in trained:
      finals[key] = final
      lease.start()                  # (every point done before: the summary writes first)
      write_summary_of(points, finals, workdir)
    lease.start()
    return write_summary_of(points, finals, workdir)


def parse_shard(text: str) -> tuple[int, int]:
  """"I/N" -> (I, N), a sweep's shard as the command line gives it (`check_shard`)."""
  match = re.fullmatch(r"(\d+)/(\d+)", str(text).strip())
  if match is None or not int(match[1]) < int(match[2]):
    raise ConfigError(f"sweep shard {text!r}: give I/N, shard I of N with 0 <= I < N (e.g. "
                      "0/2 on one machine and 1/2 on another; 0/1: every point)")
  return int(match[1]), int(match[2])


def check_shard(shard) -> tuple[int, int]:
  """(I, N) of a shard: this process trains the points whose index % N == I; ConfigError
  unless N >= 1 and 0 <= I < N."""
  if not (isinstance(shard, (tuple, list)) and len(shard) == 2
          and all(isinstance(n, int) and not isinstance(n, bool) for n in shard)
          and 0 <= shard[0] < shard[1]):
    raise ConfigError(f"sweep shard {shard!r}: give (I, N), shard I of N with 0 <= I < N "
                      "(e.g. (0, 2) on one machine and (1, 2) on another; (0, 1): every point)")
  return tuple(shard)


def check_for_workers(configs: list, experiment: Experiment, workers: int) -> None:
  """ConfigError unless the points can go to worker processes: one process (not a
  multi-process run: shards split those), an experiment and configs that pickle."""
  if jax.process_count() > 1:
    raise ConfigError(f"sweep workers={workers}: this sweep runs on {jax.process_count()} "
                      "processes (config.distributed); worker processes split one process's "
                      "sweep: give workers=1, and shards to split a sweep over machines")
  sweep_workers.check_sendable(experiment, workers, "the experiment")
  sweep_workers.check_sendable(configs, workers, "a point's config")


def train_point(index: int, point: dict, point_config, point_dir: str, experiment: Experiment,
                on_start) -> dict:
  """The final metrics of one point trained into point_dir (what the serial sweep and each
  worker run): a UserError names the point; a NaN or Inf loss is recorded as diverged."""
  try:
    return train(point_config, point_dir, experiment, on_start=on_start)
  except UserError as error:     # a file or workdir of this point: say which point
    raise type(error)(f"sweep point {index} ({point_name(point)}): {error}") from error
  except NonFiniteLossError as error:
    final = _diverged(point_dir, error)
    print(f"sweep point {index} ({point_name(point)}): {error}; recorded as diverged, "
          "the sweep goes on", file=sys.stderr, flush=True)
    return final


def _jobs(todo: list[int], points: list[dict], configs: list, workdir: str,
          experiment: Experiment, on_start) -> list[sweep_workers.Job]:
  """A job (`train_point`) per point to train, its lines under "point K (its name)"."""
  jobs = []
  for k in todo:
    name = point_name(points[k])
    jobs.append(sweep_workers.Job(k, f"point {k} ({name})", train_point, (
        k, points[k], configs[k], os.path.join(workdir, name), experiment, on_start)))
  return jobs


def check_sweep_workdir(config, points: list[dict], workdir: str) -> None:
  """Refuses a root workdir that holds a single run (config.json), a sweep of other points
  or of another config (its sweep.json: the keys every point sets, and workdir.RESUMABLE_KEYS,
  aside), or an entry where the sweep writes one of another kind; before anything is
  compiled or written."""
  names = [point_name(point) for point in points]
  workdirs.check_entries(workdir, files=(SUMMARY_CSV, SUMMARY_MD, SUMMARY_LOCK, SWEEP_RECORD),
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


def write_summary_of(points: list[dict], finals: dict[int, dict], workdir: str) -> list[dict]:
  """Writes the summary of every point finished so far (`summary_rows`) under summary.lock:
  whoever writes last has seen every point finished before; returns its rows."""
  with files.locked(os.path.join(workdir, SUMMARY_LOCK), "the sweep's summary"):
    rows = summary_rows(points, finals, workdir)
    write_summary(rows, workdir)
  return rows


def summary_rows(points: list[dict], finals: dict[int, dict], workdir: str) -> list[dict]:
  """One row per point in get_sweep()'s order, its overrides and final metrics: `finals`'
  (this process's points, by index), else its final_metrics.json's (another shard's), else
  {"pending": True} (not finished yet)."""
  rows = []
  for index, point in enumerate(points):
    final = finals.get(index)
    if final is None:
      try:
        final = read_json(os.path.join(workdir, point_name(point), FINAL_METRICS))
      except (FileNotFoundError, files.UnreadableFile):   # (being written: its shard rewrites)
        final = {PENDING: True}
    rows.append({**point, **final})
  return rows


def write_summary(rows: list[dict], workdir: str) -> None:
  """summary.csv and summary.md of the rows, each written whole (the pending column last)."""
  columns = sorted(dict.fromkeys(key for row in rows for key in row), key=lambda c: c == PENDING)
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
