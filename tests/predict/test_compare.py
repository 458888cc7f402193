"""research.predict.compare_runs: every committed sweep's summary.csv (read with the csv module)
is reproduced from its runs, points and final metrics; a tiny sweep trained here likewise, in
its order, its provenance the checkout's commit and this machine's devices; a row per status,
only the config keys that differ, one-line warnings for rows that mix commits, devices or
versions or record none, and the refusals."""

import csv
import glob
import json
import math
import os
import platform
import re
import subprocess
import sys
import warnings

import jax
import pandas
import pytest

import research
from research import experiments
from research.errors import InputError, WorkdirError
from research.predict import MixedRunsWarning, compare_runs
from research.training import run_sweep

from . import trained

ROOT = trained.ROOT
SUMMARIES = sorted(os.path.relpath(path, ROOT) for path in
                   glob.glob(os.path.join(ROOT, "results", "**", "summary.csv"), recursive=True))
TINY = {"data.length": 12, "data.eval_examples": 8, "model.hidden_size": 4,
        "train.batch_size": 8, "train.num_steps": 2, "train.warmup_steps": 1,
        "train.log_every": 1, "train.eval_every": 2, "train.checkpoint_every": 2}


def is_metric(column: str) -> bool:
  """A summary column of a final metric (`eval/loss`, a diverged point's message), not of a
  point's config key (`model.kind`)."""
  return "/" in column or column == "diverged"


def read_summary(root: str) -> list[dict]:
  with open(os.path.join(root, "summary.csv"), newline="") as f:
    return list(csv.DictReader(f))


def overrides(workdir: str) -> dict:
  """A sweep point's overrides as its directory's name spells them: "model.kind=gru,seed=1"."""
  return dict(item.split("=", 1) for item in os.path.basename(workdir).split(","))


def assert_reproduces(table: pandas.DataFrame, summary: list[dict], ordered: bool) -> None:
  """Each summary row is the one row of the table whose directory is named after its point:
  the point's values are the table's (a key the table leaves out, equal in every row, has one
  value in the whole summary), its metrics are equal (an empty cell where the table has
  none), its status diverged where the summary says so; the rows in order if `ordered`."""
  assert len(table) == len(summary)
  matched = []
  for row in summary:
    point = {key: value for key, value in row.items() if not is_metric(key) and value != ""}
    found = [i for i, workdir in enumerate(table["workdir"]) if overrides(workdir) == point]
    assert len(found) == 1, (point, found)
    matched += found
    assert table.at[found[0], "status"] == ("diverged" if row.get("diverged") else "finished")
    for key, value in point.items():
      if key in table.columns:
        assert str(table.at[found[0], key]) == value, (point, key)
      else:
        assert {other[key] for other in summary} - {""} == {value}, (point, key)
    for key, value in row.items():
      if not is_metric(key):
        continue
      cell = table.at[found[0], key] if key in table.columns else math.nan
      if value == "":
        assert pandas.isna(cell), (point, key, cell)
      elif key == "diverged":
        assert cell == value
      else:
        assert float(value) == cell or math.isnan(float(value)) and math.isnan(cell), (point, key)
  assert sorted(matched) == list(range(len(summary)))
  if ordered:
    assert matched == list(range(len(summary)))


def test_results_hold_sweep_summaries():
  assert len(SUMMARIES) >= 5, SUMMARIES


@pytest.mark.parametrize("summary", SUMMARIES)
def test_each_committed_sweep_summary_is_reproduced_from_its_runs(summary):
  """results/ keeps each point's config.json and final_metrics.json; a sweep recorded since
  tools/record_run.py kept them keeps its sweep.json and each point's provenance.jsonl too.
  Without them the rows come by name, with a warning that nothing says where they ran; with
  them in the sweep's order, without that warning."""
  root = os.path.join(ROOT, os.path.dirname(summary))
  recorded = os.path.exists(os.path.join(root, "sweep.json"))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", MixedRunsWarning)
    table = compare_runs(root)
  unrecorded = [w for w in caught
                if re.match(r"^(\d+) of \1 rows record no provenance", str(w.message))]
  assert len(unrecorded) == (0 if recorded else 1), [str(w.message) for w in caught]
  assert_reproduces(table, read_summary(root), ordered=recorded)


def head_commit() -> str | None:
  try:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


@pytest.mark.slow
def test_a_tiny_sweep_trained_here_is_reproduced_in_its_order_with_its_provenance(tmp_path):
  config = trained.config("sequence_tasks", "task=adding,model=rnn", TINY)
  points = [{"model.kind": "gru"}, {"model.kind": "rnn", "train.learning_rate": 0.003}]
  root = str(tmp_path / "sweep")
  run_sweep(config, points, root, experiments.get("sequence_tasks"))
  with warnings.catch_warnings():
    warnings.simplefilter("error", MixedRunsWarning)       # one checkout, one machine
    table = compare_runs(root)
  assert_reproduces(table, read_summary(root), ordered=True)
  assert set(table.columns[2:4]) == {"model.kind", "train.learning_rate"}   # nothing else differs
  assert list(table["workdir"]) == [os.path.join(root, "model.kind=gru"),
                                    os.path.join(root, "model.kind=rnn,train.learning_rate=0.003")]
  device = jax.devices()[0]
  for column, value in {"provenance/commit": head_commit(), "provenance/platform":
                        device.platform, "provenance/device_kind": device.device_kind,
                        "provenance/device_count": jax.device_count(),
                        "provenance/research": research.__version__,
                        "provenance/jax": jax.__version__, "provenance/host": platform.node(),
                        "provenance/cores": len(os.sched_getaffinity(0)),
                        "provenance/side_by_side": 1}.items():
    assert list(table[column]) == [value, value], column


# ---- Runs written by hand: statuses, the keys that differ, warnings, refusals -------------

CONFIG = {"experiment": "sequence_tasks", "seed": 0,
          "model": {"kind": "rnn", "hidden_size": 16, "positions": "sinusoidal"},
          "train": {"learning_rate": 0.01, "num_steps": 100}}
RECORD = {"time": "2026-11-26T12:00:00+00:00", "step": 0, "argv": ["launch.py"],
          "git": {"commit": "a" * 40, "changes": False},
          "versions": {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8",
                       "optax": "0.2.8", "orbax-checkpoint": "0.12.8", "research": "0.2.0"},
          "devices": {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1},
          "host": {"name": "vm-1", "cores": 2, "cpus": 2, "side_by_side": 1}}


def write_run(workdir, config=CONFIG, final=None, records=(RECORD,)) -> str:
  """A run's workdir: config.json, final_metrics.json (unless None), provenance.jsonl."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config, f)
  if final is not None:
    with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
      json.dump(final, f)
  with open(os.path.join(workdir, "provenance.jsonl"), "w") as f:
    f.writelines(json.dumps(record) + "\n" for record in records)
  return str(workdir)


def changed(tree: dict, **groups) -> dict:
  """`tree` with groups' keys replaced: changed(CONFIG, model={"kind": "gru"})."""
  return {**tree, **{group: {**tree[group], **values} for group, values in groups.items()}}


def no_warnings(paths):
  with warnings.catch_warnings():
    warnings.simplefilter("error", MixedRunsWarning)
    return compare_runs(paths)


def test_a_sweep_gives_a_row_per_point_in_its_order_whatever_its_status(tmp_path):
  names = ["model.kind=rnn", "model.kind=gru", "model.kind=lstm", "model.kind=mgu"]
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"config": CONFIG, "points": names}, f)
  message = "loss is nan at step 5; stopping"
  write_run(tmp_path / names[0], final={"eval/loss": 0.5, "perf/train_step_traces": 1})
  write_run(tmp_path / names[1], changed(CONFIG, model={"kind": "gru"}), {"diverged": message})
  write_run(tmp_path / names[2], changed(CONFIG, model={"kind": "lstm"}))   # still training
  table = no_warnings(tmp_path)                                        # names[3]: not begun
  assert list(table["workdir"]) == [str(tmp_path / name) for name in names]
  assert list(table["status"]) == ["finished", "diverged", "unfinished", "not started"]
  assert list(table["model.kind"]) == ["rnn", "gru", "lstm", None]
  assert table.at[0, "eval/loss"] == 0.5 and table["eval/loss"][1:].isna().all()
  assert table.at[1, "diverged"] == message and pandas.isna(table.at[0, "diverged"])
  assert list(table.columns[:3]) == ["workdir", "status", "model.kind"]   # nothing else differs


def test_only_the_config_keys_that_differ_are_columns_their_values_as_written(tmp_path):
  old = {**CONFIG, "model": {"kind": "rnn", "hidden_size": 16}}   # before model.positions
  runs = [write_run(tmp_path / "a", old),
          write_run(tmp_path / "b", changed(CONFIG, train={"learning_rate": 0.1})),
          write_run(tmp_path / "c", changed(CONFIG, model={"state_size": 8}))]
  table = no_warnings(runs)
  assert list(table.columns[2:4]) == ["train.learning_rate", "model.state_size"]   # as first held
  assert list(table["model.state_size"]) == [None, None, 8]        # an int, not 8.0
  assert list(table["train.learning_rate"]) == [0.01, 0.1, 0.01]
  positions = changed(CONFIG, model={"positions": "none"})
  table = no_warnings([runs[0], write_run(tmp_path / "d", positions)])
  assert list(table["model.positions"]) == ["sinusoidal", "none"]  # what run a ran with


def test_runs_and_sweeps_together_each_run_once(tmp_path):
  run = write_run(tmp_path / "run", final={"eval/loss": 1.0})
  point = write_run(tmp_path / "sweep" / "seed=1", changed(CONFIG, model={"kind": "gru"}),
                    {"eval/loss": 2.0})
  table = no_warnings([run, str(tmp_path / "sweep"), point, tmp_path / "run"])
  assert list(table["workdir"]) == [run, point]
  assert list(table["eval/loss"]) == [1.0, 2.0]
  assert list(no_warnings(run)["workdir"]) == [run]                 # one path, not a list


def other(**groups) -> dict:
  return {**RECORD, **{group: {**RECORD[group], **values} for group, values in groups.items()}}


@pytest.mark.parametrize("records, message", [
    ([[RECORD], [other(git={"changes": True})], [other(git={"commit": "b" * 40})]],
     f"the rows mix commits: {'a' * 12} (1 row), {'a' * 12} with changes (1 row), "
     f"{'b' * 12} (1 row)"),
    ([[RECORD], [RECORD, other(git={"commit": None, "reason": "not a git checkout"})]],
     f"the rows mix commits: {'a' * 12} (2 rows), no commit (not a git checkout) (1 row)"),
    ([[RECORD], [other(devices={"kind": "NVIDIA H200", "platform": "gpu"})],
      [other(devices={"count": 8, "processes": 2})]],
     "the rows mix devices: 1 × cpu (1 row), 1 × NVIDIA H200 (1 row), 8 × cpu in 2 processes "
     "(1 row)"),
    ([[RECORD], [other(versions={"jax": "0.11.2", "jaxlib": "0.11.2"})]],
     "the rows mix versions: jax 0.10.2 (1 row), 0.11.2 (1 row); jaxlib 0.10.2 (1 row), "
     "0.11.2 (1 row)"),
    ([[RECORD], [other(host={"name": "vm-2"})], [other(host={"cores": 1})]],
     "the rows mix machines: vm-1 (2 of 2 cores) (1 row), vm-2 (2 of 2 cores) (1 row), "
     "vm-1 (1 of 2 cores) (1 row)"),
    ([[RECORD], [other(host={"side_by_side": 2})], [RECORD, other(host={"side_by_side": 2})]],
     "2 of 3 rows shared their machine with other runs (2 side by side (2 rows)): their "
     "perf/* figures are not those of a run alone"),
    ([[RECORD], []], "1 of 2 rows record no provenance (provenance.jsonl; "),
])
def test_rows_that_mix_commits_devices_or_versions_warn_in_one_line(tmp_path, records, message):
  runs = [write_run(tmp_path / str(i), changed(CONFIG, train={"num_steps": i}), {"x/y": i},
                    starts) for i, starts in enumerate(records)]
  with pytest.warns(MixedRunsWarning) as warned:
    table = compare_runs(runs)
  assert [str(w.message)[:len(message)] for w in warned] == [message]
  assert "\n" not in str(warned[0].message) and warned[0].filename == __file__
  last = [starts[-1]["git"]["commit"] if starts else None for starts in records]
  assert list(table["provenance/commit"]) == last                  # the last start's


def written(name: str, text: str):
  """A maker of the path to compare: `name` (in a test's tmp_path) holding `text`, and the
  directory itself for a name inside it."""
  def make(directory):
    (directory / name).write_text(text)
    return directory / name if "." not in name else directory
  return make


@pytest.mark.parametrize("make, error, message", [
    (lambda directory: directory / "absent", WorkdirError, "absent does not exist; give a "),
    (lambda directory: directory, WorkdirError,
     "holds no run (config.json) and no sweep (sweep.json, or subdirectories holding a "),
    (written("file", ""), WorkdirError, "file is a file; give a run's workdir or a sweep's"),
    (written("sweep.json", '{"points": 3}'), WorkdirError, "sweep.json is no sweep's record"),
    (written("config.json", "{"), WorkdirError, "cannot be compared: "),
    (lambda directory: [], InputError, "compare_runs needs at least one path"),
])
def test_refusals_name_the_path(tmp_path, make, error, message):
  with pytest.raises(error) as refused:
    compare_runs(make(tmp_path))
  assert message in str(refused.value) and "\n" not in str(refused.value)


def test_without_pandas_one_line_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "pandas", None)
  with pytest.raises(ModuleNotFoundError, match=r'^compare_runs needs pandas, which is not '
                                                r'installed: pip install -e "\.\[compare\]"$'):
    compare_runs(write_run(tmp_path))
