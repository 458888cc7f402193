"""tools/record_run.py copies finished runs into results/ and refuses a stopped one there."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import record_run  # noqa: E402


def make_run(directory, finished: bool) -> None:
  os.makedirs(directory)
  for name in ("config.json", "metrics.jsonl", "provenance.jsonl", "checkpoint.bin") + (
      ("final_metrics.json",) if finished else ()):
    with open(os.path.join(directory, name), "w") as f:
      json.dump({"name": name}, f)


def test_a_finished_sweep_is_copied_without_its_checkpoints(tmp_path):
  sweep = tmp_path / "runs" / "sweep"
  make_run(sweep / "a=1", finished=True)
  make_run(sweep / "a=2", finished=True)
  (sweep / "summary.md").write_text("| a |\n|---|\n| 1 |\n")
  (sweep / "sweep.json").write_text('{"points": ["a=1", "a=2"]}')
  written = record_run.record(str(sweep), str(tmp_path / "results" / "sweep"))
  assert sorted(os.path.relpath(p, tmp_path / "results" / "sweep") for p in written) == [
      "a=1/config.json", "a=1/final_metrics.json", "a=1/metrics.jsonl", "a=1/provenance.jsonl",
      "a=2/config.json", "a=2/final_metrics.json", "a=2/metrics.jsonl", "a=2/provenance.jsonl",
      "summary.md", "sweep.json"]
  with open(tmp_path / "results" / "sweep" / "a=2" / "final_metrics.json") as f:
    assert json.load(f) == {"name": "final_metrics.json"}


def test_a_stopped_run_is_refused_and_nothing_is_copied(tmp_path):
  sweep = tmp_path / "runs" / "sweep"
  make_run(sweep / "a=1", finished=True)
  make_run(sweep / "a=2", finished=False)
  with pytest.raises(record_run.RecordError, match=r"a=2 has no final_metrics\.json"):
    record_run.record(str(sweep), str(tmp_path / "results" / "sweep"))
  assert not os.path.exists(tmp_path / "results")


def test_exploratory_runs_go_under_results_exploratory_only(tmp_path, monkeypatch):
  monkeypatch.setattr(record_run, "ROOT", str(tmp_path))
  make_run(tmp_path / "runs" / "probe", finished=False)
  with pytest.raises(record_run.RecordError, match="results/exploratory/"):
    record_run.record(str(tmp_path / "runs" / "probe"), str(tmp_path / "results" / "probe"),
                      exploratory=True)
  written = record_run.record(str(tmp_path / "runs" / "probe"),
                              str(tmp_path / "results" / "exploratory" / "probe"), exploratory=True)
  assert sorted(os.path.basename(p) for p in written) == ["config.json", "metrics.jsonl",
                                                           "provenance.jsonl"]
  assert record_run.main(["--exploratory", str(tmp_path / "runs" / "probe"),
                          str(tmp_path / "results" / "probe")]) == 2
