"""Two launch.py processes on this machine (loopback, 4 simulated CPU devices each) as one
run, against one process with 8 devices."""

import os
import socket
import subprocess

import pytest
import tiny

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("multiprocess")]

RUN = {"train.num_steps": 40, "train.batch_size": 16, "train.eval_every": 20}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _two_processes(workdir: str, **overrides) -> list[tuple[int, str]]:
  """(exit status, stderr) of processes 0 and 1 of one run."""
  port = _free_port()
  processes = [subprocess.Popen(
      tiny.launch_command(workdir, **overrides) + [
          f"--config.distributed.coordinator_address=localhost:{port}",
          "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}"],
      env=tiny.environment(devices=4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  return [(p.wait(timeout=600), p.communicate()[1]) for p in processes]


def _progress_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("step ")]


def _assert_same_records(records, reference):
  assert [r["step"] for r in records] == [r["step"] for r in reference]
  for record, expected in zip(records, reference, strict=True):
    assert record == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_two_processes_train_resume_and_set_aside_like_one_process_with_8_devices(tmp_path):
  reference = tiny.run(str(tmp_path / "one"), devices=8, **RUN)
  assert reference.returncode == 0, reference.stderr[-2000:]
  reference = tiny.records(str(tmp_path / "one"))
  workdir = str(tmp_path / "two")

  first = _two_processes(workdir, **RUN)
  for status, stderr in first:
    assert status == 0, stderr[-3000:]
  _assert_same_records(tiny.records(workdir), reference)
  assert _progress_lines(first[0][1]) and not _progress_lines(first[1][1])  # process 0 writes
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int) == ["20", "40"]

  for root, _, names in os.walk(os.path.join(workdir, "checkpoints", "40", "state")):
    for name in names:
      open(os.path.join(root, name), "w").close()               # the latest is unreadable
  second = _two_processes(workdir, **RUN)
  for status, stderr in second:
    assert status == 0, stderr[-3000:]
  assert "checkpoint at step 40 cannot be read" in second[0][1]
  assert "cannot be read" not in second[1][1]                    # process 0 moved it, once
  assert os.listdir(os.path.join(workdir, "checkpoints_unreadable")) == ["40"]
  assert "resuming from the checkpoint at step 20" in second[0][1]
  _assert_same_records(tiny.records(workdir), reference)       # both went on from step 20


def test_pmap_with_several_processes_is_refused_before_compiling(tmp_path):
  for status, stderr in _two_processes(str(tmp_path), **{**RUN, "train.parallelism": "pmap"}):
    assert status == 2
    assert stderr.strip().splitlines()[-1] == (
        "error: config.train.parallelism='pmap' runs on one process, not 2; use 'jit' (a mesh "
        "over every host's devices)")
