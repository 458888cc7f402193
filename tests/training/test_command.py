"""An exception in another thread, or one raised where nothing can catch it, ends the run in
one line `error: ...` and status 1, the last complete checkpoint readable
(research/training/command.py): launch.py commands of the tiny config, each run in
a forked child of this file run as a script, with a failure injected into the child."""

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import weakref

import forked_launch
import jax
import pytest
import tiny

from research.training import command
from research.training.checkpoints import Checkpoints
from research.training.train_step import init_state, make_optimizer

OVERRIDES = {"train.num_steps": 200, "train.checkpoint_every": 20, "train.log_every": 10,
             "train.eval_every": 100}
STEP = 40                # the failure comes while the metrics of this step are logged
KEEP_GOING = ("run the same command again to resume from it")
CASES = {
    # name: the failure injected, and the one line expected on stderr
    "thread": ("thread 'injected' failed: ValueError: injected failure; stopping at step 40: "
               "the last complete checkpoint (step 40) is kept; " + KEEP_GOING),
    "unraisable": ("an exception raised where nothing could catch it (in Leaky.__del__): "
                   "OSError: injected failure; stopping at step 40: the last complete "
                   "checkpoint (step 40) is kept; " + KEEP_GOING),
    "blocked": ("thread 'injected' failed: ValueError: injected failure; the main thread did not "
                "stop within 1 s, ending the process (every complete checkpoint is kept: run "
                "the same command again to resume)"),
    "after the run": ("thread 'late' failed: ValueError: injected failure; after the command's "
                      "work was done (what it wrote is complete)"),
    "at exit": "thread 'at exit' failed: ValueError: injected failure",
}


def _fail() -> None:
  raise ValueError("injected failure")


class Leaky:
  def __del__(self):
    raise OSError("injected failure")


def _wait_for(path: str) -> None:
  while not os.path.exists(path):
    threading.Event().wait(0.01)


def _inject(case: str) -> None:
  """Makes the launch.py run of this (forked) process meet the failure of `case`."""
  from research.training import metrics  # noqa: PLC0415

  write = metrics.MetricsWriter.write
  command.GRACE_SECONDS = 1

  def failing_write(self, step: int, values: dict) -> None:
    write(self, step, values)
    if step != STEP or "train/loss" not in values or case == "at exit":
      return
    if case == "unraisable":
      Leaky()                             # its __del__ raises as it is dropped
    elif case == "after the run":         # fails once the run's last file is written
      final = os.path.join(os.path.dirname(self.path), "final_metrics.json")
      threading.Thread(target=lambda: (_wait_for(final), _fail()), name="late").start()
    else:
      if case == "blocked":               # under load an async save can lag: step 20's first
        _wait_for(os.path.join(os.path.dirname(self.path), "checkpoints", "20"))
      thread = threading.Thread(target=_fail, name="injected")
      thread.start()
      thread.join()
      if case == "blocked":
        threading.Event().wait()          # what the failed thread was to set, never set

  metrics.MetricsWriter.write = failing_write
  if case == "at exit":                   # once launch.py has ended with status 0
    ending = command.ending

    def ending_then_failing(status: int) -> None:
      ending(status)
      thread = threading.Thread(target=_fail, name="at exit", daemon=True)
      thread.start()
      thread.join()

    command.ending = ending_then_failing


def _run_cases(directory: str) -> None:
  """Each case in its own forked child (see forked_launch.py), its output in files."""
  import launch  # noqa: F401, PLC0415 - once, before forking

  statuses = {}
  for case in CASES:
    pid = os.fork()
    if pid == 0:
      _inject(case)
      argv = tiny.launch_command(os.path.join(directory, case), **OVERRIDES)[2:]
      os._exit(forked_launch._child(argv, directory, case))
    statuses[case] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
  with open(os.path.join(directory, "statuses.json"), "w") as f:
    json.dump(statuses, f)


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def runs(tmp_path_factory):
  """{case: (exit status, stderr lines but the progress lines, stdout, workdir)}."""
  directory = str(tmp_path_factory.mktemp("thread_failures"))
  driver = subprocess.run([sys.executable, __file__, directory], env=tiny.environment(),
                          capture_output=True, text=True, timeout=600)
  assert driver.returncode == 0, driver.stderr[-3000:]
  with open(os.path.join(directory, "statuses.json")) as f:
    statuses = json.load(f)
  results = {}
  for case, status in statuses.items():
    with open(os.path.join(directory, f"{case}.err")) as err, open(
        os.path.join(directory, f"{case}.out")) as out:
      lines = [line for line in err.read().splitlines() if not line.startswith("step ")]
      results[case] = (status, lines, out.read(), os.path.join(directory, case))
  return results


def _latest_checkpoint(workdir: str) -> int:
  """The step of the workdir's latest readable checkpoint, restored for real."""
  config = tiny.config(**OVERRIDES)
  like = init_state(tiny.task().build(config), make_optimizer(config.train), jax.random.key(0))
  restored = Checkpoints(os.path.join(workdir, "checkpoints"), 3).restore_latest(like)
  assert int(restored.state.step) == restored.step
  return restored.step


@pytest.mark.slow
@pytest.mark.xdist_group("thread_failures")          # on one worker: the fixture runs once
@pytest.mark.parametrize("case", CASES)
def test_a_failure_outside_the_main_thread_ends_the_run_in_one_line_with_status_1(runs, case):
  status, lines, stdout, workdir = runs[case]
  assert status == 1, lines[-30:]
  assert lines == [f"error: {CASES[case]}"]
  if case in ("after the run", "at exit"):     # every step trained, every file written
    assert _latest_checkpoint(workdir) == OVERRIDES["train.num_steps"]
    assert os.path.exists(os.path.join(workdir, "final_metrics.json"))
    assert f"workdir: {workdir}" in stdout     # what was printed before it is kept
    return
  kept = 20 if case == "blocked" else STEP     # blocked before the save of STEP
  assert _latest_checkpoint(workdir) == kept
  assert tiny.records(workdir, "train/loss")[-1][0] == STEP     # it went no further


def _unraisable(make_and_drop) -> object:
  """The UnraisableHookArgs that make_and_drop() causes."""
  seen = []
  hook, sys.unraisablehook = sys.unraisablehook, seen.append
  try:
    make_and_drop()
    gc.collect()
  finally:
    sys.unraisablehook = hook
  (args,) = seen
  return args


@pytest.mark.slow
def test_only_a_closed_event_loops_late_callback_from_native_code_is_benign():
  """tensorstore completes a future after the event loop awaiting it (an abandoned Orbax
  save's) has closed: native code calls loop.call_soon_threadsafe, which raises. A weakref
  callback is native code calling it too."""
  loop = asyncio.new_event_loop()
  loop.close()

  def late_callback():
    thing = type("Thing", (), {})()
    ref = weakref.ref(thing, loop.call_soon_threadsafe)    # noqa: F841 - called as thing dies
    del thing

  def same_error_of_our_own():
    def callback(_):
      raise RuntimeError("Event loop is closed")
    thing = type("Thing", (), {})()
    ref = weakref.ref(thing, callback)    # noqa: F841
    del thing

  benign = _unraisable(late_callback)
  assert benign.exc_type is RuntimeError and command.is_benign(benign)
  assert not command.is_benign(_unraisable(same_error_of_our_own))
  assert not command.is_benign(_unraisable(lambda: Leaky()))


if __name__ == "__main__":
  sys.path.insert(0, tiny.ROOT)
  _run_cases(sys.argv[1])
