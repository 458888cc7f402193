"""One writer per workdir, and workdirs that cannot be used, in process."""

import os
import subprocess
import sys

import pytest

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
