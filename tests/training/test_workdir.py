"""One writer per workdir, and workdirs that cannot be used, in process."""

import fcntl
import os
import subprocess
import sys

import pytest
import tiny

from research.errors import WorkdirError
from research.training import workdir


def test_a_held_workdir_is_refused_naming_its_holder(tmp_path):
  with workdir.hold(str(tmp_path)):
    with pytest.raises(WorkdirError, match=rf"in use by a live run \(pid {os.getpid()} on "):
      with workdir.hold(str(tmp_path)):
        pass
  with workdir.hold(str(tmp_path)):                   # released when the holder is done
    pass


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
  holder = subprocess.run(
      [sys.executable, "-c", "import os, sys; from research.training import workdir\n"
       f"with workdir.hold({str(tmp_path)!r}): os._exit(9)"], capture_output=True, text=True)
  assert holder.returncode == 9, holder.stderr
  left = (tmp_path / workdir.LOCK_FILE).read_text()
  assert left.startswith("pid ") and f"pid {os.getpid()} " not in left
  with workdir.hold(str(tmp_path)):
    assert (tmp_path / workdir.LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")


def test_a_file_or_a_path_through_a_file_is_not_a_workdir(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(WorkdirError, match="is a file, not a directory"):
    with workdir.hold(str(tmp_path / "file")):
      pass
  with pytest.raises(WorkdirError, match=r"cannot be created \(Not a directory\)"):
    with workdir.hold(str(tmp_path / "file" / "run")):
      pass


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's sysfs")
def test_a_location_that_cannot_be_written_is_refused():
  """sysfs refuses new directories even to root, so this holds whoever runs the tests."""
  with pytest.raises(WorkdirError, match=r"workdir /sys/research-workdir cannot be created \("):
    with workdir.hold("/sys/research-workdir"):
      pass


class Refused(Exception):
  pass


def test_a_run_refused_before_it_starts_leaves_no_trace(tmp_path):
  fresh = tmp_path / "runs" / "fresh"
  with pytest.raises(Refused), workdir.hold(str(fresh)):
    assert (fresh / workdir.LOCK_FILE).exists()
    raise Refused
  assert os.listdir(tmp_path) == []                  # the workdir and its parent it made
  (tmp_path / "found").mkdir()
  (tmp_path / "found" / "notes").write_text("mine")
  with pytest.raises(Refused), workdir.hold(str(tmp_path / "found")):
    raise Refused
  assert os.listdir(tmp_path / "found") == ["notes"]


def test_a_started_run_and_an_earlier_lock_file_are_kept(tmp_path):
  with pytest.raises(Refused), workdir.hold(str(tmp_path / "run")) as lease:
    lease.start()
    raise Refused                                    # a run that failed after it started
  assert os.listdir(tmp_path / "run") == [workdir.LOCK_FILE]
  with pytest.raises(Refused), workdir.hold(str(tmp_path / "run")):
    raise Refused                                    # refused: the earlier lock file stays
  assert os.listdir(tmp_path / "run") == [workdir.LOCK_FILE]


def test_a_run_refused_as_busy_leaves_the_holders_lock(tmp_path):
  with workdir.hold(str(tmp_path)):
    holder = (tmp_path / workdir.LOCK_FILE).read_text()
    with pytest.raises(WorkdirError, match="in use by a live run"):
      with workdir.hold(str(tmp_path)):
        pass
    assert (tmp_path / workdir.LOCK_FILE).read_text() == holder


def test_a_lock_file_removed_between_open_and_lock_is_opened_again(tmp_path, monkeypatch):
  """A refused run removes its lock file while holding it: a run that opened the file
  just before must not hold the removed file, but the one at the path."""
  path = tmp_path / workdir.LOCK_FILE
  path.write_text("pid 1 on a host that ended\n")
  real, calls = fcntl.flock, []

  def flock(handle, operation):
    if not calls:
      os.remove(path)                                # the refused run, between open and lock
    calls.append(operation)
    return real(handle, operation)

  monkeypatch.setattr(fcntl, "flock", flock)
  with workdir.hold(str(tmp_path)):
    assert len(calls) == 2 and path.read_text().startswith(f"pid {os.getpid()} ")
    with pytest.raises(WorkdirError, match="in use by a live run"):
      with workdir.hold(str(tmp_path)):
        pass


@pytest.mark.parametrize("found", [b"pid 4242 on host-a, since 2026-01-02 03:04:05\n", b"",
                                   b"\xff\xfe not UTF-8, no newline", None])
def test_a_refused_run_leaves_the_lock_file_as_it_found_it_byte_for_byte(tmp_path, found):
  """A finished run's lock (the probe's case), an empty one, bytes no run writes, none."""
  path = tmp_path / workdir.LOCK_FILE
  if found is not None:
    path.write_bytes(found)
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
  with pytest.raises(Refused), workdir.hold(str(tmp_path)):
    assert path.read_text().startswith(f"pid {os.getpid()} on ")      # held: it names us
    raise Refused
  if found is None:
    assert not path.exists()
  else:
    assert path.read_bytes() == found
    assert os.stat(path).st_mtime_ns == 2_000_000_000
  assert os.listdir(tmp_path) == ([] if found is None else [workdir.LOCK_FILE])


def test_a_started_run_keeps_its_own_lock_file(tmp_path):
  (tmp_path / workdir.LOCK_FILE).write_text("pid 4242 on host-a\n")
  with pytest.raises(Refused), workdir.hold(str(tmp_path)) as lease:
    lease.start()
    raise Refused                                   # failed after it started: it wrote there
  assert (tmp_path / workdir.LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")


@pytest.mark.parametrize("lock_there", [False, True])
def test_a_workdir_that_takes_no_new_file_is_refused_and_left_as_found(tmp_path, lock_there):
  """An earlier run's writable run.lock in it opens as before: the probe file finds it."""
  run = tmp_path / "run"
  run.mkdir()
  if lock_there:
    (run / workdir.LOCK_FILE).write_text("pid 4242 on host-a\n")
  before = tiny.files_under(str(run))
  with tiny.unwritable(str(run)):
    with pytest.raises(WorkdirError, match=rf"^workdir {run} cannot be written \(.+\); make it "
                       "writable or give a directory you can write to with --workdir$"):
      with workdir.hold(str(run)):
        pass
  assert tiny.files_under(str(run)) == before


@pytest.mark.parametrize("name, kind", [("checkpoints", "directory"), ("tensorboard", "directory"),
                                        ("metrics.jsonl", "file"), ("config.json", "file")])
def test_an_entry_the_run_writes_that_cannot_be_written_is_named(tmp_path, name, kind):
  path = tmp_path / name
  if kind == "directory":
    path.mkdir()
    (path / "20").mkdir()
  else:
    path.write_text("{}\n")
  before = tiny.files_under(str(tmp_path))
  with tiny.unwritable(str(path)):
    with pytest.raises(WorkdirError, match=rf"^workdir {tmp_path} cannot be written: {path} \("):
      workdir.check_entries(str(tmp_path), files=("config.json", "metrics.jsonl"),
                            directories=("checkpoints", "tensorboard"))
  assert tiny.files_under(str(tmp_path)) == before


def test_a_writable_workdir_passes_and_keeps_no_probe(tmp_path):
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
  before = tiny.files_under(str(tmp_path))
  with workdir.hold(str(tmp_path)):
    workdir.check_entries(str(tmp_path), files=("metrics.jsonl", "final_metrics.json"),
                          directories=("checkpoints", "tensorboard"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "metrics.jsonl", workdir.LOCK_FILE]
    assert os.listdir(tmp_path / "checkpoints") == []
  assert {k: v for k, v in tiny.files_under(str(tmp_path)).items()
          if k != workdir.LOCK_FILE} == before
