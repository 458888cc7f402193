"""Issue 45's refusals through launch.py, as a user meets them: a rerun refused in a finished
workdir, a workdir (or a directory or file in it the run writes) that cannot be written, a
compilation cache that cannot hold the cache, kernel_regression's model.dtype. Each is one
line `error: ...`, exit status 2, nothing compiled, every workdir as it was found (run.lock
byte for byte, its modification time too). The commands run in forked children of one
start-up (forked_launch.py)."""

import contextlib
import os
import shutil

import forked_launch
import pytest
import tiny

from research.training import workdir as workdirs

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("refusals")]

FINISHED = {"train.num_steps": 20, "train.checkpoint_every": 20, "train.eval_every": 20}


def _stat_of_lock(workdir: str) -> tuple[bytes, int] | None:
  path = os.path.join(workdir, workdirs.LOCK_FILE)
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    return f.read(), os.stat(path).st_mtime_ns


def test_each_refusal_is_one_line_exit_2_nothing_compiled_every_workdir_as_found(tmp_path):
  root = str(tmp_path)
  finished = os.path.join(root, "finished")
  run = tiny.run(finished, **FINISHED)
  assert run.returncode == 0, run.stderr[-2000:]
  for name in ("whole", "checkpoints", "metrics"):
    shutil.copytree(finished, os.path.join(root, name))
  for name in ("empty", "cache"):
    os.makedirs(os.path.join(root, name))
  (tmp_path / "file").write_text("not a directory")

  def command(workdir: str, *flags: str, **overrides) -> list[str]:
    """launch.py's arguments for the tiny config into workdir."""
    return tiny.launch_command(workdir, flags, **{**FINISHED, **overrides})[2:]

  cannot = "cannot be written"
  cases = {
      "a rerun of another config into a finished run": (
          command(finished, **{"data.length": 13}),
          f"workdir {finished} holds checkpoints of a run with a different config "
          "(config.data.length 12 there, 13 now); use a new --workdir"),
      "an immutable new workdir's parent": (command(f"{root}/empty/run"),
                                            f"workdir {root}/empty/run cannot be created ("),
      "an immutable empty workdir": (command(f"{root}/cache"),
                                     f"workdir {root}/cache {cannot} ("),
      "an immutable finished workdir": (command(f"{root}/whole"),
                                        f"workdir {root}/whole {cannot} ("),
      "its checkpoints immutable": (command(f"{root}/checkpoints"),
                                    f"workdir {root}/checkpoints {cannot}: "
                                    f"{root}/checkpoints/checkpoints ("),
      "its metrics.jsonl immutable": (command(f"{root}/metrics"),
                                      f"workdir {root}/metrics {cannot}: "
                                      f"{root}/metrics/metrics.jsonl ("),
      "a compilation cache that is a file": (
          command(f"{root}/new-a", f"--compilation_cache={root}/file"),
          f"--compilation_cache={root}/file: not a directory; give a directory you can write "
          "to, or --compilation_cache= to run without the cache"),
      "a compilation cache that cannot be written": (
          command(f"{root}/new-b", f"--compilation_cache={root}/cache"),
          f"--compilation_cache={root}/cache: {cannot} ("),
      "kernel_regression's model.dtype": (
          [f"--config={tiny.ROOT}/experiments/kernel_regression.py", f"--workdir={root}/new-c",
           "--config.model.dtype=float64"],
          "config.model.dtype='float64' is not allowed; choose one of: 'float32', 'bfloat16', "
          "'float16'"),
  }
  output = os.path.join(root, "output")
  os.makedirs(output)
  locks = {name: _stat_of_lock(os.path.join(root, name)) for name in os.listdir(root)}
  before = tiny.files_under(root)
  with contextlib.ExitStack() as stack:
    for path in ("empty", "whole", "checkpoints/checkpoints", "metrics/metrics.jsonl", "cache"):
      stack.enter_context(tiny.unwritable(os.path.join(root, path)))
    results = forked_launch.run_all({name: argv for name, (argv, _) in cases.items()}, output)
  assert {k: v for k, v in tiny.files_under(root).items() if not k.startswith("output")} == before
  assert {name: _stat_of_lock(os.path.join(root, name)) for name in locks} == locks
  assert locks["finished"][0].startswith(b"pid ")                 # the finished run's own
  for name, (_, message) in cases.items():
    status, _, stderr = results[name]
    assert status == 2, (name, stderr[-2000:])
    (line,) = stderr.strip().splitlines()          # nothing compiled: JAX logs every compile
    assert line.startswith(f"error: {message}"), (name, line)
