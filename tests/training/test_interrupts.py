"""Ctrl-C's message is true however many come and whenever: it names the latest checkpoint
saved in the workdir (a second Ctrl-C while the first one's checkpoint is written, one before
the loop), or says there is none. launch.py runs, and the loop in process."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tiny

from research.training import loop
from research.training.workdir import latest_checkpoint, saved_steps

# Checkpoints every 20 steps, and more steps than the test waits for.
ENDLESS = {"train.num_steps": 100_000, "train.checkpoint_every": 20, "train.log_every": 10,
           "train.eval_every": 100_000}
NAMED = re.compile(r"(?:SIGINT at step (\d+): checkpoint saved in (\S+);|"
                   r"interrupted \(Ctrl-C\): the latest saved checkpoint is step (\d+) in (\S+);)")


def _user_lines(stderr: str) -> list[str]:
  """stderr without the progress lines."""
  return [line for line in stderr.splitlines() if not line.startswith("step ")]


@pytest.mark.slow
@pytest.mark.parametrize("signals, gap", [pytest.param(2, 0.0, marks=pytest.mark.long), (2, 0.05),
                                          pytest.param(5, 0.01, marks=pytest.mark.long)],
                         ids=["2 at once", "2 50 ms apart", "5 10 ms apart"])
def test_ctrl_c_twice_or_more_names_the_latest_saved_checkpoint(tmp_path, signals, gap):
  workdir = str(tmp_path)
  process = tiny.start(workdir, **ENDLESS)
  tiny.wait_for_checkpoint(workdir, 40, process)
  for i in range(signals):
    if i:
      time.sleep(gap)
    process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr[-2000:]
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
  (line,) = _user_lines(stderr)
  found = NAMED.match(line)
  assert found, line
  step = int(found.group(1) or found.group(3))
  directory = found.group(2) or found.group(4)
  assert directory == os.path.join(workdir, "checkpoints")
  assert step == saved_steps(directory)[-1] >= 40, (line, saved_steps(directory))
  assert "nothing to save" not in line


@pytest.mark.slow
@pytest.mark.long
def test_a_rerun_resumes_from_the_checkpoint_the_line_named(tmp_path):
  workdir = str(tmp_path)
  process = tiny.start(workdir, **ENDLESS)
  tiny.wait_for_checkpoint(workdir, 40, process)
  process.send_signal(signal.SIGINT)
  time.sleep(0.05)
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  (line,) = _user_lines(stderr)
  found = NAMED.match(line)
  assert found, line
  step = int(found.group(1) or found.group(3))
  resumed = tiny.run(workdir, **{**ENDLESS, "train.num_steps": step + 10})
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resuming from the checkpoint at step {step}\n" in resumed.stderr


class _Interrupting:
  """The tiny experiment, Ctrl-C arriving while its workload is built (before the loop)."""

  def __getattr__(self, name):
    return getattr(tiny.task(), name)

  def build(self, config):
    raise KeyboardInterrupt


def _step_directories(workdir, steps) -> str:
  directory = os.path.join(workdir, "checkpoints")
  for step in steps:
    os.makedirs(os.path.join(directory, str(step)))
  return directory


def test_ctrl_c_before_the_loop_names_the_checkpoint_a_rerun_resumes(tmp_path):
  directory = _step_directories(str(tmp_path), (20, 40, 100))
  os.makedirs(os.path.join(directory, "120.orbax-checkpoint-tmp-7"))    # a save not finished
  with pytest.raises(loop.Interrupted) as interrupted:
    loop.train(tiny.config(), str(tmp_path), _Interrupting())
  assert interrupted.value.signum == signal.SIGINT
  assert str(interrupted.value) == (f"interrupted (Ctrl-C): the latest saved checkpoint is step "
                                    f"100 in {directory}; run the same command again to resume "
                                    "from it")
  assert not os.path.exists(tmp_path / "run.lock")      # refused before it started: as found


def test_ctrl_c_before_any_checkpoint_says_there_is_none(tmp_path):
  workdir = str(tmp_path / "new")
  with pytest.raises(loop.Interrupted) as interrupted:
    loop.train(tiny.config(), workdir, _Interrupting())
  assert str(interrupted.value) == (f"interrupted (Ctrl-C): no checkpoint saved in {workdir}; "
                                    "run the same command again to start")
  assert not os.path.exists(workdir)


def test_a_sweeps_latest_checkpoint_is_the_point_written_last(tmp_path):
  first = _step_directories(str(tmp_path / "seed=0"), (20, 40))
  last = _step_directories(str(tmp_path / "seed=1"), (20,))
  os.utime(os.path.join(first, "40"), ns=(10**18, 10**18))
  os.utime(os.path.join(last, "20"), ns=(2 * 10**18, 2 * 10**18))
  assert latest_checkpoint(str(tmp_path)) == (last, 20)
  os.utime(os.path.join(first, "40"), ns=(3 * 10**18, 3 * 10**18))
  assert latest_checkpoint(str(tmp_path)) == (first, 40)
  assert latest_checkpoint(str(tmp_path / "seed=2")) is None


class _Closer:
  def __init__(self):
    self.closed = False

  def close(self):
    self.closed = True


@pytest.mark.parametrize("error, waits", [(KeyboardInterrupt, False), (RuntimeError, True)])
def test_a_second_ctrl_c_does_not_wait_for_the_checkpoint_it_cut(error, waits):
  # A KeyboardInterrupt raised inside Orbax's wait for a save may leave that wait unable to
  # return: closing the checkpoints again would hang. Other failures close everything.
  checkpoints, progress, writer = _Closer(), _Closer(), _Closer()
  with pytest.raises(error), loop._closing(checkpoints, progress, writer):
    raise error
  assert (checkpoints.closed, progress.closed, writer.closed) == (waits, True, True)


ENDS_WITH_A_THREAD_LEFT = """
import sys, threading
sys.path.insert(0, sys.argv[2])
from research.training import command
def work():
  threading.Thread(target=threading.Event().wait).start()   # a library thread that never ends
  raise command.Interrupted(sys.argv[1])
command.run(work, False)
"""


def test_a_second_ctrl_c_ends_the_process_without_waiting_for_library_threads(tmp_path):
  directory = _step_directories(str(tmp_path), (20,))
  ended = subprocess.run([sys.executable, "-c", ENDS_WITH_A_THREAD_LEFT, str(tmp_path),
                          tiny.ROOT], capture_output=True, text=True, timeout=120,
                         env=tiny.environment())
  assert ended.returncode == 130, ended.stderr[-2000:]
  assert ended.stderr.strip().splitlines()[-1] == (
      f"interrupted (Ctrl-C): the latest saved checkpoint is step 20 in {directory}; run the "
      "same command again to resume from it")
