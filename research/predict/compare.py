"""Runs side by side: `compare_runs` reads runs' and sweeps' workdirs into one pandas DataFrame,
a row per run (its final metrics, the config keys that differ between the rows, where it was
trained), and warns in one line each when the rows mix commits, versions or devices
(docs/trained_runs.md, "Comparing runs"). pandas comes with the `compare` extra.
"""

import functools
import json
import os
import warnings
from collections import Counter

from research import files
from research.errors import ConfigError, InputError, WorkdirError
from research.training.workdir import (
  ADDED_KEYS,
  CONFIG,
  FINAL_METRICS,
  PROVENANCE,
  SWEEP_RECORD,
  flatten,
  read_config_json,
  read_json,
  read_provenance,
)

PANDAS_INSTALL = 'pip install -e ".[compare]"'
# A row's status: its workdir holds final metrics, a diverged point's record (as a sweep writes
# it), a config alone (a run stopped or still training), or nothing (a sweep's point not begun)
FINISHED, DIVERGED, UNFINISHED, NOT_STARTED = "finished", "diverged", "unfinished", "not started"
VERSIONS = ("research", "python", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
# column: where a provenance.jsonl record holds it (of the run's last start)
PROVENANCE_COLUMNS = {
    "provenance/commit": ("git", "commit"), "provenance/changes": ("git", "changes"),
    "provenance/platform": ("devices", "platform"), "provenance/device_kind": ("devices", "kind"),
    "provenance/device_count": ("devices", "count"),
    "provenance/processes": ("devices", "processes"),
    "provenance/host": ("host", "name"), "provenance/cores": ("host", "cores"),
    "provenance/side_by_side": ("host", "side_by_side"),
    **{f"provenance/{name}": ("versions", name) for name in VERSIONS},
}
SHOWN = 3      # values a warning names before "and N more"


class MixedRunsWarning(UserWarning):
  """The rows were trained at different commits, with different versions, on different
  devices or machines, side by side with other runs, or some record none of it: their
  metrics differ by more than their configs."""


def compare_runs(paths) -> "pandas.DataFrame":  # noqa: F821
  """One row per run of `paths` (a workdir or a sweep's root, or a list of them), in order:

    workdir, status          the run's directory; finished, diverged, unfinished, not started
    model.kind, …            the config keys (dotted) whose values differ between the rows
                             (keys equal in every row left out; a key added since a run was
                             written counts as workdir.ADDED_KEYS' value there)
    eval/loss, …, diverged   final_metrics.json (NaN where a run has none)
    provenance/commit, …     the last start's provenance.jsonl: commit, changes, platform,
                             device kind and count, processes, versions, host, cores,
                             side_by_side (runs on the machine at once: a sweep's workers)

  A sweep's points come in its sweep.json's order (a root without one, as results/ keeps
  them: its subdirectories holding a config.json, by name). A run listed twice is one row.
  Warns (MixedRunsWarning, one line each) when the rows' starts mix commits (or a commit
  with and without changes), devices, machines or versions, when rows ran side by side with
  other workers of their sweep (their timings are not a run's alone; a job outside the sweep
  sharing the cores is not recorded), and when some rows record no provenance.
  WorkdirError naming a path that holds neither a run nor a sweep, or a file that cannot be
  read.
  """
  pandas = _pandas()
  workdirs = _first_of_each(w for path in _listed(paths) for w in run_workdirs(path))
  configs = _with_added_keys([_config(workdir) for workdir in workdirs])
  records = [read_provenance(workdir) for workdir in workdirs]
  differing = _differing_keys([config for config in configs if config is not None])
  rows = [_row(workdir, config, starts, differing)
          for workdir, config, starts in zip(workdirs, configs, records)]
  _warn_if_mixed(workdirs, configs, records)
  return _frame(pandas, rows, differing)


def _row(workdir: str, config: dict | None, starts: list[dict], differing: list[str]) -> dict:
  """{workdir, status, its values of the differing keys, final metrics, provenance}."""
  final, status = _final_metrics(workdir, config is not None)
  return {"workdir": workdir, "status": status,
          **{key: config[key] for key in differing if config and key in config},
          **final, **_provenance(starts[-1] if starts else {})}


def _frame(pandas, rows: list[dict], differing: list[str]):
  """The rows as a DataFrame: labels, metrics (in the order the rows first hold them),
  provenance. A label some rows lack is an object column (None beside the int 64, not NaN
  beside 64.0)."""
  labels = ["workdir", "status", *differing]
  metrics = [key for key in dict.fromkeys(k for row in rows for k in row)
             if key not in labels and key not in PROVENANCE_COLUMNS]
  frame = pandas.DataFrame(rows, columns=[*labels, *metrics, *PROVENANCE_COLUMNS])
  for column in [*differing, *PROVENANCE_COLUMNS]:
    if frame[column].isna().any():
      frame[column] = pandas.Series([row.get(column) for row in rows], dtype=object)
  return frame


def run_workdirs(path: str) -> list[str]:
  """The runs' workdirs at `path`: itself (a run: its config.json), or a sweep's points
  (those of its sweep.json, in order; without one, its subdirectories holding a config.json,
  by name)."""
  path = os.fspath(path)
  entries = _entries(path)
  if os.path.isfile(os.path.join(path, CONFIG)):
    return [path]
  points = _sweep_points(path)
  if points is None:
    points = sorted(name for name in entries
                    if os.path.isfile(os.path.join(path, name, CONFIG)))
  if not points:
    raise WorkdirError(f"{path} holds no run ({CONFIG}) and no sweep ({SWEEP_RECORD}, or "
                       f"subdirectories holding a {CONFIG}); give a run's workdir or a sweep's")
  return [os.path.join(path, name) for name in points]


def _listed(paths) -> list[str]:
  """`paths` as a list: one path (a str or os.PathLike) or an iterable of them."""
  if isinstance(paths, (str, os.PathLike)):
    return [paths]
  listed = list(paths)
  if not listed:
    raise InputError("compare_runs needs at least one path (a run's workdir or a sweep's "
                     "root); got none")
  return listed


def _first_of_each(workdirs) -> list[str]:
  """The workdirs in order, each directory once (the first path naming it kept)."""
  seen = {}
  for workdir in workdirs:
    seen.setdefault(os.path.realpath(workdir), workdir)
  return list(seen.values())


def _entries(path: str) -> list[str]:
  try:
    return os.listdir(path)
  except FileNotFoundError:
    raise WorkdirError(f"{path} does not exist; give a run's workdir or a sweep's") from None
  except NotADirectoryError:
    raise WorkdirError(f"{path} is a file; give a run's workdir or a sweep's") from None


def _sweep_points(root: str) -> list[str] | None:
  """The point names of the sweep.json in `root`, None where there is none."""
  try:
    record = files.read_json(os.path.join(root, SWEEP_RECORD))
  except FileNotFoundError:
    return None
  except files.UnreadableFile as error:
    raise WorkdirError(f"sweep {root} cannot be read: {error}") from None
  points = record.get("points") if isinstance(record, dict) else None
  if not (isinstance(points, list) and all(isinstance(name, str) for name in points)):
    raise WorkdirError(f"sweep {root}: {SWEEP_RECORD} is no sweep's record "
                       "({\"config\": …, \"points\": […]})")
  return points


def _config(workdir: str) -> dict | None:
  """The run's config.json, flattened; None where there is none (a point not begun)."""
  try:
    return flatten(read_config_json(os.path.join(workdir, CONFIG)))
  except FileNotFoundError:
    return None
  except (files.UnreadableFile, ConfigError) as error:
    raise WorkdirError(f"run {workdir} cannot be compared: {error}") from None


def _with_added_keys(configs: list[dict | None]) -> list[dict | None]:
  """Each config with the keys added since it was written (workdir.ADDED_KEYS) that another
  row holds, at the value that means what it ran."""
  held = {key for config in configs if config for key in config}
  added = {key: value for key, value in ADDED_KEYS.items() if key in held}
  return [config and config | {k: v for k, v in added.items() if k not in config}
          for config in configs]


def _differing_keys(configs: list[dict]) -> list[str]:
  """The keys (in the order the configs first hold them) whose values are not the same in
  every config: absent from one, or another value (1, 1.0 and True are three values)."""
  keys = dict.fromkeys(key for config in configs for key in config)
  same = lambda key: len({json.dumps(config.get(key), sort_keys=True) if key in config else None
                          for config in configs}) == 1
  return [key for key in keys if not same(key)]


def _final_metrics(workdir: str, configured: bool) -> tuple[dict, str]:
  """(final_metrics.json, the row's status). A file that cannot be read counts as absent,
  as a sweep counts it (it trains that point again)."""
  try:
    final = read_json(os.path.join(workdir, FINAL_METRICS))
  except (FileNotFoundError, files.UnreadableFile):
    return {}, UNFINISHED if configured else NOT_STARTED
  return final, DIVERGED if "diverged" in final else FINISHED


def _provenance(record: dict) -> dict:
  """PROVENANCE_COLUMNS of one provenance.jsonl record (None where it holds no value)."""
  return {column: (record.get(group) or {}).get(key)
          for column, (group, key) in PROVENANCE_COLUMNS.items()}


def _warn_if_mixed(workdirs: list[str], configs: list, records: list[list[dict]]) -> None:
  """A MixedRunsWarning for each of commits, devices and versions that the rows' starts
  mix, and one for the rows that record no provenance (a point not begun aside)."""
  started = [starts for config, starts in zip(configs, records) if config is not None]
  unrecorded = [w for w, c, starts in zip(workdirs, configs, records) if c and not starts]
  if unrecorded:
    _warn(f"{len(unrecorded)} of {len(started)} rows record no provenance "
          f"({PROVENANCE}; {unrecorded[0]} first): whether they mix commits or devices "
          "is unknown")
  for what, values in (("commits", _commit), ("devices", _devices), ("machines", _host)):
    counts = _row_counts(started, values)
    if len(counts) > 1:
      _warn(f"the rows mix {what}: {_counted(counts)}")
  shared = _row_counts(started, _side_by_side)
  if shared:
    _warn(f"{sum(shared.values())} of {len(started)} rows shared their machine with other runs "
          f"({_counted(shared)}): their perf/* figures are not those of a run alone")
  mixed = []
  for name in VERSIONS:
    counts = _row_counts(started, functools.partial(_version, name=name))
    if len(counts) > 1:
      mixed.append(f"{name} {_counted(counts)}")
  if mixed:
    _warn(f"the rows mix versions: {'; '.join(mixed)}")


def _row_counts(started: list[list[dict]], value) -> Counter:
  """{value: the number of rows one of whose starts has it} over the rows' records."""
  return Counter(v for starts in started for v in dict.fromkeys(map(value, starts)) if v)


def _counted(counts: Counter) -> str:
  """'a (3 rows), b (1 row)', the first SHOWN values named."""
  named = [f"{value} ({n} row{'s' * (n != 1)})" for value, n in counts.most_common(SHOWN)]
  more = len(counts) - SHOWN
  return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _commit(record: dict) -> str:
  git = record.get("git") or {}
  if not git.get("commit"):
    return f"no commit ({git.get('reason', 'not recorded')})"
  return git["commit"][:12] + (" with changes" if git.get("changes") else "")


def _host(record: dict) -> str | None:
  """'name (C of N cores)'; None for a record of a version that wrote no host."""
  host = record.get("host")
  return f"{host.get('name')} ({host.get('cores')} of {host.get('cpus')} cores)" if host else None


def _side_by_side(record: dict) -> str | None:
  """'N side by side' where a start ran beside other workers of its sweep, else None."""
  together = (record.get("host") or {}).get("side_by_side", 1)
  return f"{together} side by side" if together > 1 else None


def _devices(record: dict) -> str | None:
  devices = record.get("devices")
  if not devices:
    return None
  processes = devices.get("processes", 1)
  return (f"{devices.get('count')} × {devices.get('kind')}"
          + (f" in {processes} processes" if processes != 1 else ""))


def _version(record: dict, name: str) -> str | None:
  return (record.get("versions") or {}).get(name)


def _warn(message: str) -> None:
  warnings.warn(message, MixedRunsWarning, stacklevel=4)


def _pandas():
  """The pandas module; ModuleNotFoundError naming the extra where it is not installed."""
  try:
    import pandas  # noqa: PLC0415
  except ModuleNotFoundError:
    raise ModuleNotFoundError(f"compare_runs needs pandas, which is not installed: "
                              f"{PANDAS_INSTALL}", name="pandas") from None
  return pandas
