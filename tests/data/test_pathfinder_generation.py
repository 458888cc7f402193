"""Pathfinder's generated sets under their lock: two processes generating one set at once both
read all of it, a generation killed midway leaves nothing a reader takes as complete (the next
call completes it), a reader waits for a writer, readers do not wait for each other, and a set
read back holds every image its record names."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from research import files
from research.data import pathfinder
from research.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPLITS = ("train", "val", "test")

# Reads the generated set at argv[1] (1000 images, seed 7, drawn and written FOLDER_SIZE =
# argv[2] at a time) as soon as the file argv[3] exists: prints the number of images read and the
# md5 of their tokens and labels.
READ = """
import hashlib, os, sys, time
from research.data import pathfinder
pathfinder.FOLDER_SIZE = int(sys.argv[2])
while not os.path.exists(sys.argv[3]):
  time.sleep(0.005)
splits = pathfinder.read_generated(sys.argv[1], 32, "easy", 1000, 7)
print(sum(len(splits[s]["labels"]) for s in splits), hashlib.md5(b"".join(
    splits[s][k].tobytes() for s in ("train", "val", "test") for k in ("tokens", "labels"))
    ).hexdigest())
"""

# Generates 100 images, 40 a folder, into argv[1] (seed 5), and is killed (SIGKILL) once the
# first folder is written, as it starts drawing the second.
KILLED_MIDWAY = """
import os, signal, sys
from research.data import pathfinder
draw = pathfinder.draw_samples
def killed_after_the_first_folder(seed, count, recipe, start=0):
  if start:
    os.kill(os.getpid(), signal.SIGKILL)
  return draw(seed, count, recipe, start=start)
pathfinder.draw_samples = killed_after_the_first_folder
pathfinder.FOLDER_SIZE = 40
pathfinder.ensure_generated(sys.argv[1], 32, "easy", 100, 5)
"""


def python(code: str, *args: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def digest(splits) -> str:
  return hashlib.md5(b"".join(splits[s][k].tobytes() for s in SPLITS
                              for k in ("tokens", "labels"))).hexdigest()


def expected(seed: int, count: int):
  """The splits of `generate`'s images, as read_release splits them (80/10/10)."""
  images, labels = pathfinder.generate(seed, count, 32, "easy")
  tokens = images.reshape(count, -1)
  ends = (0, count * 8 // 10, count * 9 // 10, count)
  return {s: {"tokens": tokens[a:b], "labels": labels[a:b].astype(np.int32)}
          for s, a, b in zip(SPLITS, ends[:-1], ends[1:], strict=True)}


def folder_and_lock(root):
  folder = pathfinder.release_folder(root, 32, "easy")
  return folder, pathfinder.generation_lock(root, 32, "easy")


@pytest.mark.slow
@pytest.mark.parametrize("second", ["at once", "late in the first's generation"])
def test_two_processes_generating_one_set_both_read_all_of_it(tmp_path, second):
  """Started late, the second is the worst case without a lock: it removes the first's
  folders, the first writes its last ones and then reads what is there."""
  root = tmp_path / "data"
  runs = [python(READ, str(root), "100", str(tmp_path / go)) for go in ("go0", "go1")]
  (tmp_path / "go0").touch()
  if second != "at once":                      # the first has written 7 of its 10 folders
    written = [os.path.join(root, "pathfinder32", name, "metadata", "6.npy")
               for name in ("curv_baseline", ".curv_baseline.partial")]
    while not any(map(os.path.exists, written)) and runs[0].poll() is None:
      time.sleep(0.002)
  (tmp_path / "go1").touch()
  want = digest(expected(7, 1000))
  results = [run.communicate(timeout=300) for run in runs]
  assert [run.returncode for run in runs] == [0, 0], results
  assert [out.split() for out, _ in results] == [["1000", want]] * 2
  errors = [err for _, err in results]
  assert errors[1].startswith("waiting for another process") or (
      second == "at once" and errors[0].startswith("waiting for another process")), errors
  assert all(err.count("\n") <= 1 for err in errors), errors          # one line at most
  parent = os.path.dirname(pathfinder.release_folder(root, 32, "easy"))
  assert sorted(os.listdir(parent)) == ["curv_baseline", "curv_baseline.lock"]


@pytest.mark.slow
@pytest.mark.parametrize("before", ["nothing", "a set of another count"])
def test_a_generation_killed_midway_leaves_nothing_taken_as_complete(tmp_path, before):
  folder, _ = folder_and_lock(tmp_path)
  if before != "nothing":
    pathfinder.ensure_generated(tmp_path, 32, "easy", 20, 5)
  run = python(KILLED_MIDWAY, str(tmp_path))
  run.communicate(timeout=120)
  assert run.returncode == -signal.SIGKILL
  partial = os.path.join(os.path.dirname(folder), ".curv_baseline.partial")
  assert os.path.isfile(os.path.join(partial, "imgs", "0", "sample_39.png"))    # midway
  assert not pathfinder.is_generated(tmp_path, 32, "easy", 100, 5)
  if before == "nothing":
    assert not os.path.exists(folder)
    with pytest.raises(InputError, match="no such folder"):
      pathfinder.read_release(tmp_path, 32, "easy")
  else:                                         # the set that was there is still whole
    assert pathfinder.is_generated(tmp_path, 32, "easy", 20, 5)
    assert digest(pathfinder.read_release(tmp_path, 32, "easy")) == digest(expected(5, 20))
  splits = pathfinder.read_generated(tmp_path, 32, "easy", 100, 5)      # the next call
  assert digest(splits) == digest(expected(5, 100))
  assert pathfinder.is_generated(tmp_path, 32, "easy", 100, 5)
  assert sorted(os.listdir(os.path.dirname(folder))) == ["curv_baseline", "curv_baseline.lock"]


def test_a_reader_waits_for_the_writer_and_reads_the_whole_set(tmp_path, monkeypatch, capsys):
  folder, lock = folder_and_lock(tmp_path)
  midway, go = threading.Event(), threading.Event()
  draw = pathfinder.draw_samples

  def held_midway(seed, count, recipe, start=0):
    if start:                              # the first folder written: the writer holds here
      midway.set()
      go.wait(60)
    return draw(seed, count, recipe, start=start)

  monkeypatch.setattr(pathfinder, "FOLDER_SIZE", 20)
  monkeypatch.setattr(pathfinder, "draw_samples", held_midway)
  writer = threading.Thread(target=pathfinder.ensure_generated,
                            args=(tmp_path, 32, "easy", 60, 2))
  writer.start()
  assert midway.wait(60)
  read = {}
  reader = threading.Thread(
      target=lambda: read.update(pathfinder.read_generated(tmp_path, 32, "easy", 60, 2)))
  reader.start()
  reader.join(0.5)
  assert reader.is_alive() and not read and not os.path.exists(folder)   # waiting, not reading
  go.set()
  writer.join(60)
  reader.join(60)
  assert digest(read) == digest(expected(2, 60))
  assert capsys.readouterr().err == (f"waiting for another process generating {folder} "
                                     f"(lock {lock})\n")


def test_readers_share_the_lock_and_a_writer_waits_for_them(tmp_path, capsys):
  folder, lock = folder_and_lock(tmp_path)
  pathfinder.ensure_generated(tmp_path, 32, "easy", 20, 3)
  with files.locked(lock, "a test reading", shared=True):
    assert digest(pathfinder.read_generated(tmp_path, 32, "easy", 20, 3)) == digest(expected(3, 20))
  assert capsys.readouterr().err == ""                 # a reader did not wait for a reader
  done = threading.Event()
  with files.locked(lock, "a test reading", shared=True):
    writer = threading.Thread(target=lambda: (pathfinder.ensure_generated(
        tmp_path, 32, "easy", 20, 3), done.set()))
    writer.start()
    writer.join(0.5)
    assert not done.is_set()                           # the writer waits for the reader
  writer.join(60)
  assert done.is_set()
  assert capsys.readouterr().err.startswith("waiting for another process reading or generating")


def test_a_set_missing_an_image_since_is_refused_not_read_short(tmp_path):
  folder, _ = folder_and_lock(tmp_path)
  pathfinder.ensure_generated(tmp_path, 32, "easy", 20, 3)
  open(os.path.join(folder, "imgs", "0", "sample_7.png"), "wb").close()   # LRA drops empty ones
  with pytest.raises(InputError) as error:
    pathfinder.read_generated(tmp_path, 32, "easy", 20, 3)
  assert str(error.value) == (f"{folder}: 19 readable images, its generated.json records 20 "
                              f"(generated images, changed since: delete {folder} to generate "
                              "them again)")


@pytest.mark.parametrize("content", ["an empty folder", "a stray file"])
def test_only_an_empty_folder_or_one_of_ours_is_replaced(tmp_path, content):
  folder, _ = folder_and_lock(tmp_path)
  os.makedirs(os.path.join(folder, "imgs"))
  if content == "a stray file":
    with open(os.path.join(folder, "imgs", "notes.txt"), "w") as f:
      f.write("mine")
    for call in (pathfinder.ensure_generated, pathfinder.read_generated):
      with pytest.raises(InputError, match="did not write"):
        call(tmp_path, 32, "easy", 10, 0)
    assert os.listdir(os.path.join(folder, "imgs")) == ["notes.txt"]
    assert os.listdir(folder) == ["imgs"]
    assert os.listdir(os.path.dirname(folder)) == ["curv_baseline"]     # no lock file made
  else:
    os.rmdir(os.path.join(folder, "imgs"))
    pathfinder.ensure_generated(tmp_path, 32, "easy", 10, 0)
    assert pathfinder.is_generated(tmp_path, 32, "easy", 10, 0)


def test_a_complete_set_is_read_where_no_lock_file_can_be_made(tmp_path, monkeypatch):
  """A read-only data directory (faked: tests may run as root) holds no writer to wait for."""
  folder, lock = folder_and_lock(tmp_path)
  pathfinder.ensure_generated(tmp_path, 32, "easy", 20, 3)
  os.remove(lock)

  def read_only(path, mode="r", **kwargs):
    if path == lock and "a" in mode:
      raise OSError(errno.EROFS, "Read-only file system", path)
    return open(path, mode, **kwargs)

  monkeypatch.setattr(files, "open", read_only, raising=False)
  assert digest(pathfinder.read_generated(tmp_path, 32, "easy", 20, 3)) == digest(expected(3, 20))
  assert not os.path.exists(lock)
  with pytest.raises(OSError, match="Read-only"):      # generating needs the lock
    pathfinder.read_generated(tmp_path, 32, "easy", 30, 3)
