"""Runs that are killed, signalled, doubled or starved of disk, through launch.py as a user
runs it; each is compared with one uninterrupted run of the same config."""

import os
import resource
import signal
import subprocess

import jax
import pytest
import tiny

from research.training.checkpoints import Checkpoints
from research.training.train_step import init_state, make_optimizer

# One worker runs them all (project.py passes --dist loadgroup), so `reference` runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]

# Each update from 2 microbatches (train.grad_accum_steps): a killed or signalled run
# resumes bit for bit with accumulation too (every other runtime test updates from 1).
LONG = {"train.num_steps": 600, "train.checkpoint_every": 100, "train.log_every": 50,
        "train.eval_every": 300, "train.grad_accum_steps": 2}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """launch.py's flag for a compilation cache of these runs alone, empty at first."""
  return (f"--compilation_cache={tmp_path_factory.mktemp('compilation-cache')}",)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
  """metrics.jsonl's records of the uninterrupted run (the first into `cache`: it loads no
  compiled program from there)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  run = tiny.run(workdir, flags=cache, **LONG)
  assert run.returncode == 0, run.stderr[-2000:]
  assert tiny.read_json(f"{workdir}/final_metrics.json")["perf/compile_cache_hits"] == 0
  return tiny.records(workdir)


def _restore(workdir: str, **overrides):
  """The workdir's latest readable checkpoint."""
  config = tiny.config(**{**LONG, **overrides})
  like = init_state(tiny.task().build(config), make_optimizer(config.train), jax.random.key(0))
  return Checkpoints(os.path.join(workdir, "checkpoints"), 3).restore_latest(like)


def _user_lines(stderr: str) -> list[str]:
  """stderr without the progress lines."""
  return [line for line in stderr.splitlines() if not line.startswith("step ")]


def test_kill_9_then_rerun_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, reference,
                                                                        cache):
  workdir = str(tmp_path)
  victim = tiny.start(workdir, flags=cache, **LONG)
  tiny.wait_for_step(workdir, 250, victim)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  killed_at = tiny.records(workdir)[-1]["step"]
  assert killed_at < LONG["train.num_steps"]
  resumed = tiny.run(workdir, flags=cache, **LONG)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  # the resumed run's train and eval steps (and the reference's others) come from the cache
  assert tiny.read_json(f"{workdir}/final_metrics.json")["perf/compile_cache_hits"] >= 2
  start = int(resumed.stderr.split("resuming from the checkpoint at step ")[1].split()[0])
  assert start % LONG["train.checkpoint_every"] == 0 and start <= killed_at
  assert tiny.records(workdir) == reference          # every metric, exact float equality
  if killed_at > start:                              # records past the checkpoint moved aside
    with open(os.path.join(workdir, f"metrics.after_step_{start}.jsonl")) as f:
      assert [int(line.split(",")[0].split(":")[1]) for line in f][-1] == killed_at


def _signal_after_step_120(workdir: str, signum: int) -> tuple[int, str, int]:
  """(exit status, stderr, the step it saved) of a run sent `signum` after step 120."""
  process = tiny.start(workdir, **LONG)
  tiny.wait_for_step(workdir, 120, process)
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=300)
  name = signal.Signals(signum).name
  step = int(stderr.split(f"{name} at step ")[1].split(":")[0]) if name in stderr else -1
  return process.returncode, stderr, step


@pytest.mark.long
def test_sigterm_saves_the_current_step_and_exits_0(tmp_path):
  workdir = str(tmp_path)
  status, stderr, step = _signal_after_step_120(workdir, signal.SIGTERM)
  assert status == 0, stderr[-2000:]
  assert 120 <= step < LONG["train.num_steps"]
  restored = _restore(workdir)
  assert restored.step == step == int(restored.state.step) == restored.data["step"]


def test_ctrl_c_saves_the_current_step_exits_130_and_a_rerun_matches_bit_for_bit(tmp_path,
                                                                                 reference):
  workdir = str(tmp_path)
  status, stderr, step = _signal_after_step_120(workdir, signal.SIGINT)
  assert status == 130, stderr[-2000:]
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
  (line,) = _user_lines(stderr)
  assert line.startswith(f"SIGINT at step {step}: checkpoint saved in ")
  assert 120 <= step < LONG["train.num_steps"]
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(step)))
  resumed = tiny.run(workdir, **LONG)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resuming from the checkpoint at step {step}" in resumed.stderr
  assert tiny.records(workdir) == reference


def test_a_second_run_into_a_live_workdir_exits_2_and_the_first_finishes_as_alone(
    tmp_path, reference):
  workdir = str(tmp_path)
  first = tiny.start(workdir, **LONG)
  tiny.wait_for_step(workdir, 100, first)
  first.send_signal(signal.SIGSTOP)       # alive, holding the workdir, not finishing meanwhile
  try:
    second = tiny.run(workdir, **LONG)
  finally:
    first.send_signal(signal.SIGCONT)
  assert second.returncode == 2, second.stderr[-2000:]
  assert second.stderr.splitlines() == [
      f"error: workdir {workdir} is in use by a live run (pid {first.pid} on "
      + second.stderr.split(f"(pid {first.pid} on ")[1].strip()]
  assert "wait for it to end or give another --workdir" in second.stderr
  assert first.wait(timeout=300) == 0, first.communicate()[1][-2000:]
  assert tiny.records(workdir) == reference


def _limit_file_size_to_zero_after(process: subprocess.Popen) -> None:
  process.send_signal(signal.SIGSTOP)
  resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (0, 0))   # every write now fails
  process.send_signal(signal.SIGCONT)


def test_a_failed_write_stops_at_once_with_one_message_and_keeps_the_last_checkpoint(tmp_path):
  """A full disk, made by lowering the running process's file size limit to 0."""
  workdir, overrides = str(tmp_path), {**LONG, "train.num_steps": 5000}
  process = subprocess.Popen(
      tiny.launch_command(workdir, **overrides), env=tiny.environment(), text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))  # EFBIG, not a kill
  tiny.wait_for_step(workdir, 200, process)
  tiny.wait_for_checkpoint(workdir, 100, process)   # under load, an async save can lag behind
  _limit_file_size_to_zero_after(process)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 1, stderr[-2000:]
  assert "Traceback" not in stderr
  (line,) = _user_lines(stderr)
  assert line.startswith("error: ") and "File too large" in line, line
  kept = int(line.split("The last complete checkpoint (step ")[1].split(")")[0])
  stopped_at = tiny.records(workdir, "train/loss")[-1][0]
  assert stopped_at < kept + 2 * LONG["train.checkpoint_every"]    # at once, not much later
  restored = _restore(workdir, **overrides)
  assert restored.step == kept == int(restored.state.step)
