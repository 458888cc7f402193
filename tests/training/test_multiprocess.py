"""Two launch.py processes on this machine (loopback, 4 simulated CPU devices each) as one
run, against one process with 8 devices."""

import os
import signal
import socket
import subprocess
import sys

import pytest
import tiny

from research.training.parallel import STOP_LAG

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("multiprocess")]

RUN = {"train.num_steps": 80, "train.batch_size": 16, "train.eval_every": 40,
       "train.checkpoint_every": 40}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start_two(workdir: str, **overrides) -> list[subprocess.Popen]:
  """Processes 0 and 1 of one run, started."""
  port = _free_port()
  return [subprocess.Popen(
      tiny.launch_command(workdir, **overrides) + [
          f"--config.distributed.coordinator_address=localhost:{port}",
          "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}"],
      env=tiny.environment(devices=4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]


def _two_processes(workdir: str, **overrides) -> list[tuple[int, str]]:
  """(exit status, stderr) of processes 0 and 1 of one run."""
  return [(p.wait(timeout=600), p.communicate()[1]) for p in _start_two(workdir, **overrides)]


def _progress_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("step ")]


def _assert_same_records(records, reference):
  assert [r["step"] for r in records] == [r["step"] for r in reference]
  for record, expected in zip(records, reference, strict=True):
    assert record == pytest.approx(expected, rel=1e-5, abs=1e-7)


def _checkpoints(workdir: str) -> list[int]:
  return sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")))


# Process PROCESS of two, at ADDRESS: process 1 gets SIGTERM after step 4; prints the step
# it stops after and the signal.
AGREEMENT = """
import sys
import jax
address, process = sys.argv[1], int(sys.argv[2])
jax.distributed.initialize(address, num_processes=2, process_id=process)
from research.training.parallel import StopAgreement
agreement = StopAgreement()
for step in range(1, 30):
  stop = agreement.stop_signal(step, 15 if process == 1 and step >= 4 else 0)
  if stop:
    break
print(step, stop)
"""


def test_two_processes_agree_on_the_step_and_the_signal_to_stop_with():
  """Through the gather across the processes: both stop after step 4 + STOP_LAG, with the
  SIGTERM that process 1 alone got."""
  address = f"localhost:{_free_port()}"
  processes = [subprocess.Popen([sys.executable, "-c", AGREEMENT, address, str(i)],
                                cwd=tiny.ROOT, env=tiny.environment(devices=2),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
  for p in processes:
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr[-3000:]
    assert stdout.splitlines()[-1] == f"{4 + STOP_LAG} 15"   # after Gloo's lines


@pytest.mark.long
def test_two_processes_stop_together_resume_and_set_aside_like_one_process(tmp_path):
  """A SIGTERM to process 1 alone stops both after the same step, saved; the rerun resumes
  there, and the records equal one process's with 8 devices; a rerun from an earlier
  checkpoint (the latest made unreadable) repeats the same records bit for bit."""
  reference = tiny.run(str(tmp_path / "one"), devices=8, **RUN)
  assert reference.returncode == 0, reference.stderr[-2000:]
  reference = tiny.records(str(tmp_path / "one"))
  workdir = str(tmp_path / "two")

  processes = _start_two(workdir, **RUN)
  tiny.wait_for_step(workdir, 10, processes[0])
  processes[1].send_signal(signal.SIGTERM)
  stopped = [(p.wait(timeout=600), p.communicate()[1]) for p in processes]
  steps = set()
  for status, stderr in stopped:
    assert status == 0, stderr[-3000:]
    steps.add(int(stderr.split("SIGTERM at step ")[1].split(":")[0]))
  (step,) = steps                                     # the same step on both processes
  assert 10 <= step < RUN["train.num_steps"] and step in _checkpoints(workdir)
  assert _progress_lines(stopped[0][1]) and not _progress_lines(stopped[1][1])  # process 0 writes

  resumed = _two_processes(workdir, **RUN)
  for status, stderr in resumed:
    assert status == 0, stderr[-3000:]
  assert f"resuming from the checkpoint at step {step}" in resumed[0][1]
  records = tiny.records(workdir)
  _assert_same_records(records, reference)

  latest, earlier = _checkpoints(workdir)[-1], _checkpoints(workdir)[-2]
  for root, _, names in os.walk(os.path.join(workdir, "checkpoints", str(latest), "state")):
    for name in names:
      open(os.path.join(root, name), "w").close()               # the latest is unreadable
  second = _two_processes(workdir, **RUN)
  for status, stderr in second:
    assert status == 0, stderr[-3000:]
  assert f"checkpoint at step {latest} cannot be read" in second[0][1]
  assert "cannot be read" not in second[1][1]                    # process 0 moved it, once
  assert os.listdir(os.path.join(workdir, "checkpoints_unreadable")) == [str(latest)]
  assert f"resuming from the checkpoint at step {earlier}" in second[0][1]
  assert tiny.records(workdir) == records                       # bit for bit


def test_pmap_with_several_processes_is_refused_before_compiling(tmp_path):
  for status, stderr in _two_processes(str(tmp_path), **{**RUN, "train.parallelism": "pmap"}):
    assert status == 2
    assert stderr.strip().splitlines()[-1] == (
        "error: config.train.parallelism='pmap' runs on one process, not 2; use 'jit' (a mesh "
        "over every host's devices)")
