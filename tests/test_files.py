"""Files written whole or not at all, and read back with the fault named."""

import json
import os

import pytest

from research import files


def test_a_write_that_fails_leaves_the_previous_file_and_no_temporary(tmp_path):
  path = tmp_path / "final_metrics.json"
  files.write_json(path, {"eval/loss": 1.5})
  with pytest.raises(RuntimeError), files.atomic_write(path) as f:
    f.write('{"eval/lo')                             # killed here, in effect
    raise RuntimeError
  assert json.loads(path.read_text()) == {"eval/loss": 1.5}
  assert os.listdir(tmp_path) == ["final_metrics.json"]


def test_a_written_file_has_the_umasks_permissions(tmp_path):
  previous = os.umask(0o022)
  try:
    files.write_text(tmp_path / "summary.md", "| a |\n")
  finally:
    os.umask(previous)
  assert (tmp_path / "summary.md").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("content, fault", [
    (b"", "is empty"),
    (b'{\n  "eval/loss": 0.1,\n  "eval/acc', r"is cut short or not JSON \(Unterminated string"),
    (b"[1, 2]", "holds a JSON list, not an object"),
    (b'{"a": "caf\xe9"}', r"is not UTF-8 text \(invalid continuation byte at byte 10\)"),
])
def test_a_file_that_cannot_be_read_back_is_named_with_its_fault(tmp_path, content, fault):
  path = tmp_path / "config.json"
  path.write_bytes(content)
  with pytest.raises(files.UnreadableFile, match=f"{path} {fault}"):
    files.read_json(path)


def test_a_missing_file_is_not_an_unreadable_one(tmp_path):
  with pytest.raises(FileNotFoundError):
    files.read_json(tmp_path / "config.json")
