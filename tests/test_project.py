"""project.py's benchmark recording: output shown and kept in results/NAME.md, whole, with
the command that made it; a failed benchmark leaves the committed file as it was."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("project", os.path.join(ROOT, "project.py"))
project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(project)


def test_a_benchmarks_output_is_recorded_with_its_command(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(project, "PYTHON", sys.executable)
  path = tmp_path / "results" / "demo.md"
  script = "print('| L | speed |'); print('|---|---|'); print('| 1024 | 2.00× |')"
  assert project.run_recorded(["-c", script], path) == 0
  header, *table = path.read_text(encoding="utf-8").splitlines()
  assert header.startswith("<!-- python3 project.py bench demo ") and header.endswith("-->")
  assert table == ["| L | speed |", "|---|---|", "| 1024 | 2.00× |"]
  assert capsys.readouterr().out.splitlines() == table


def test_a_failed_benchmark_keeps_the_previous_file(tmp_path, monkeypatch):
  monkeypatch.setattr(project, "PYTHON", sys.executable)
  path = tmp_path / "demo.md"
  path.write_text("kept\n", encoding="utf-8")
  assert project.run_recorded(["-c", "print('half'); raise SystemExit(3)"], path) == 3
  assert path.read_text(encoding="utf-8") == "kept\n"
  assert not list(tmp_path.glob("*.tmp"))
