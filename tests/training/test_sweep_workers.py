"""Sweeps over worker processes and shards: the same points, the same numbers as the serial
sweep, one summary, the shards' locks, and errors that reach the sweep as they would serially."""

import csv
import json
import os
import pickle
import platform
import re
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny

import research.experiments  # noqa: F401 - restore() finds the tiny run's experiment
from research.errors import ConfigError, WorkdirError
from research.training import restore, sweep, sweep_workers
from research.training import workdir as workdirs
from research.training.command import UnknownFlag
from research.training.sweep import check_shard, parse_shard, run_sweep

CORES = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, shard", [("0/2", (0, 2)), (" 1/3 ", (1, 3)), ("0/1", (0, 1))])
def test_parse_shard_reads_i_of_n(text, shard):
  assert parse_shard(text) == shard


@pytest.mark.parametrize("text", ["2/2", "1/0", "0/0", "-1/2", "1", "1/2/3", "a/b", ""])
def test_parse_shard_refuses_what_is_no_shard_in_one_line(text):
  with pytest.raises(ConfigError, match=r"^sweep shard .*: give I/N, shard I of N with "
                                        r"0 <= I < N \(e\.g\. 0/2 on one machine") as refused:
    parse_shard(text)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("shard", [(2, 2), (0, 0), (1,), (0.0, 2), (True, 2), "0/2"])
def test_check_shard_refuses_what_is_no_shard(shard):
  with pytest.raises(ConfigError, match=r"^sweep shard .*: give \(I, N\), shard I of N"):
    check_shard(shard)


def test_workers_share_the_cores_in_contiguous_parts(tmp_path, monkeypatch):
  """Each worker's share of 8 cores (this process's affinity, wherever they are numbered)
  on a host without accelerators (`root`: an empty directory)."""
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 2, 3, 5, 8, 9, 10, 11})
  root = str(tmp_path)
  assert [slot.cores for slot in sweep_workers.check_workers(3, root)] == [
      (1, 2), (3, 5, 8), (9, 10, 11)]
  assert {slot.gpu for slot in sweep_workers.check_workers(8, root)} == {None}
  for workers in (0, 9, 1.5, "2", True, None):
    with pytest.raises(ConfigError, match=rf"^sweep workers={workers!r}: give a whole number "
                                          r"from 1 to 8 \(one per CPU core: this process has 8\)$"):
      sweep_workers.check_workers(workers, root)


def test_a_gpu_host_gives_each_worker_one_gpu(tmp_path, monkeypatch):
  """The driver's device files say how many GPUs there are, CUDA_VISIBLE_DEVICES which ones."""
  (tmp_path / "dev").mkdir()
  for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
    (tmp_path / "dev" / name).write_text("")
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  slots = sweep_workers.check_workers(4, root=str(tmp_path))
  assert [slot.gpu for slot in slots] == ["0", "1", "2", "3"]
  assert [len(slot.cores) for slot in slots] == [4, 4, 4, 4]
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
  assert [slot.gpu for slot in sweep_workers.check_workers(2, root=str(tmp_path))] == ["3", "1"]
  with pytest.raises(ConfigError, match=r"from 1 to 2 \(one per GPU and per CPU core: this "
                                        r"process has 2 and 16\)"):
    sweep_workers.check_workers(3, root=str(tmp_path))


def test_a_tpu_host_takes_one_worker(tmp_path):
  device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
  device.mkdir(parents=True)
  (device / "vendor").write_text("0x1ae0\n")
  (device / "device").write_text("0x0062\n")
  assert len(sweep_workers.check_workers(1, root=str(tmp_path))) == 1
  with pytest.raises(ConfigError, match=r"workers=2: give a whole number from 1 to 1 \(on a "
                                        r"TPU host: one process holds its chips"):
    sweep_workers.check_workers(2, root=str(tmp_path))


def test_an_experiment_a_worker_cannot_import_is_refused_before_anything_runs(tmp_path):
  if len(CORES) < 2:
    pytest.skip("needs 2 CPU cores")
  task = tiny.task()
  local = task._replace(build=lambda config: task.build(config))
  with pytest.raises(ConfigError, match=r"^sweep workers=2: the experiment cannot be sent to a "
                                        r"worker process \(.*\); define it in an importable "
                                        r"module, or give workers=1$"):
    run_sweep(tiny.config(), [{"seed": 0}, {"seed": 1}], str(tmp_path / "sweep"), local,
              workers=2)
  assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("name", sorted(research.experiments.names()))
def test_every_experiment_can_be_sent_to_a_worker(name):
  """--workers pickles the experiment by reference: a lambda in its registration (listops'
  and lra's build_shapes were) refuses every sweep of that experiment on workers."""
  experiment = research.experiments.get(name)
  assert pickle.loads(pickle.dumps(experiment)) == experiment


def test_shards_hold_the_root_side_by_side_and_refuse_a_whole_sweep(tmp_path):
  """Shards share run.lock and each holds its own; a run (or a whole sweep) holds run.lock
  alone. A refused holder leaves the lock files as it found them."""
  root = str(tmp_path)
  with workdirs.hold(root, shard=(0, 2)), workdirs.hold(root, shard=(1, 2)):
    with pytest.raises(WorkdirError, match=r"in use by a live run of sweep shard 1/2 \(pid "
                                           rf"{os.getpid()} on "):
      with workdirs.hold(root, shard=(1, 2)):
        pass
    with pytest.raises(WorkdirError, match=r"in use by a live run \(sweep shards, each named "
                                           r"in its shard-I-of-N\.lock\)"):
      with workdirs.hold(root):
        pass
    assert (tmp_path / "shard-1-of-2.lock").read_text().startswith(f"pid {os.getpid()} on ")
  with workdirs.hold(root):
    before = _files(tmp_path)
    with pytest.raises(WorkdirError, match=rf"in use by a live run \(pid {os.getpid()} on "):
      with workdirs.hold(root, shard=(0, 2)):
        pass
    assert _files(tmp_path) == before


def test_a_refused_shard_leaves_a_lock_file_it_made_only_where_no_shard_holds_it(tmp_path):
  class Refused(Exception):
    pass

  fresh = tmp_path / "fresh"
  with pytest.raises(Refused), workdirs.hold(str(fresh), shard=(0, 2)):
    raise Refused
  assert not fresh.exists()
  with workdirs.hold(str(tmp_path), shard=(1, 2)):
    with pytest.raises(Refused), workdirs.hold(str(tmp_path), shard=(0, 2)):
      raise Refused
    assert sorted(os.listdir(tmp_path)) == ["run.lock", "shard-1-of-2.lock"]


def _fake_train(config, point_dir, experiment, on_start=None):
  """A point 'trained' in no time: its final metrics written as train's are."""
  on_start()
  final = {"eval/loss": float(config.seed) / 4}
  os.makedirs(point_dir, exist_ok=True)
  workdirs.write_json(os.path.join(point_dir, workdirs.FINAL_METRICS), final)
  return final


def test_shards_split_the_points_and_write_one_summary(tmp_path, monkeypatch):
  """Shard I trains the points whose index % N == I; the summary lists every point, those
  not finished yet as pending (last column), until the last shard completes it; a rerun of a
  shard trains nothing."""
  monkeypatch.setattr(sweep, "train", _fake_train)
  config, points = tiny.config(), [{"seed": seed} for seed in range(5)]
  root = str(tmp_path)
  rows = run_sweep(config, points, root, tiny.task(), shard=(1, 3))
  assert rows == [{"seed": 0, "pending": True}, {"seed": 1, "eval/loss": 0.25},
                  {"seed": 2, "pending": True}, {"seed": 3, "pending": True},
                  {"seed": 4, "eval/loss": 1.0}]
  with open(tmp_path / "summary.csv") as f:
    assert f.readline().strip() == "seed,eval/loss,pending"
  run_sweep(config, points, root, tiny.task(), shard=(0, 3))
  monkeypatch.setattr(sweep, "train", lambda *args, **kwargs: pytest.fail("trained again"))
  assert run_sweep(config, points, root, tiny.task(), shard=(1, 3)) == [
      {"seed": 0, "eval/loss": 0.0}, rows[1], rows[2], {"seed": 3, "eval/loss": 0.75}, rows[4]]
  monkeypatch.setattr(sweep, "train", _fake_train)
  whole = run_sweep(config, points, root, tiny.task(), shard=(2, 3))
  assert whole == [{"seed": seed, "eval/loss": seed / 4} for seed in range(5)]
  with open(tmp_path / "summary.csv") as f:
    assert [row["eval/loss"] for row in csv.DictReader(f)] == ["0.0", "0.25", "0.5", "0.75",
                                                                "1.0"]


def _build_diverging(config):
  """The tiny task's workload; at a learning rate above 0.05 its batches are NaN from step 5
  on (a rate too high, as a sweep finds one). Module-level: a worker imports it."""
  workload = tiny.task().build(config)
  if config.train.learning_rate > 0.05:
    workload = workload._replace(train_data=tiny.PoisonedStream(workload.train_data, first_bad=5))
  return workload


def _params(workdir) -> list[np.ndarray]:
  """The parameters of the run's latest checkpoint."""
  return [np.asarray(leaf) for leaf in jax.tree.leaves(restore(str(workdir)).params)]


def _without_perf(row: dict) -> dict:
  """A summary row without its timings (perf/*), which differ from run to run."""
  return {key: value for key, value in row.items() if not key.startswith("perf/")}


@pytest.mark.slow
def test_workers_and_shards_train_every_point_bit_for_bit_as_the_serial_sweep(tmp_path,
                                                                              capsys):
  """3 points (one diverging) trained one after another in this process, by 2 workers (one
  CPU core each), and by shards 1/2 then 0/2: the same final metrics, the same parameters
  in every point's final checkpoint, the same divergence recorded."""
  if len(CORES) < 2:
    pytest.skip("needs 2 CPU cores")
  config = tiny.config(**{"train.num_steps": 10, "train.eval_every": 10,
                          "train.log_every": 5, "train.checkpoint_every": 5})
  points = [{"model.kind": "rnn"}, {"model.kind": "gru"},
            {"model.kind": "lstm", "train.learning_rate": 0.1}]
  task = tiny.task()._replace(build=_build_diverging)
  serial = run_sweep(config, points, str(tmp_path / "serial"), task)
  capsys.readouterr()
  by_workers = run_sweep(config, points, str(tmp_path / "workers"), task, workers=2)
  printed = capsys.readouterr().err
  assert ("[point 2 (model.kind=lstm,train.learning_rate=0.1)] sweep point 2 "
          "(model.kind=lstm,train.learning_rate=0.1): loss is nan at step 5;") in printed
  assert "[point 0 (model.kind=rnn)] step 10/10  loss " in printed
  first = run_sweep(config, points, str(tmp_path / "shards"), task, shard=(1, 2))
  assert [row.get("pending") for row in first] == [True, None, True]
  by_shards = run_sweep(config, points, str(tmp_path / "shards"), task, shard=(0, 2))

  assert serial[2] == {**points[2], "diverged": "loss is nan at step 5; stopping: no "
                                                "checkpoint was written yet"}
  assert "eval/loss" in serial[0] and "eval/loss" in serial[1]
  for rows in (by_workers, by_shards):
    assert [_without_perf(row) for row in rows] == [_without_perf(row) for row in serial]
  for name in ("model.kind=rnn", "model.kind=gru"):
    reference = _params(tmp_path / "serial" / name)
    for root in ("workers", "shards"):
      params = _params(tmp_path / root / name)
      assert all(np.array_equal(a, b) for a, b in zip(params, reference, strict=True)), root
  with open(tmp_path / "serial" / "summary.csv") as f:
    expected = [_without_perf(row) for row in csv.DictReader(f)]
  for root in ("workers", "shards"):
    with open(tmp_path / root / "summary.csv") as f:
      assert [_without_perf(row) for row in csv.DictReader(f)] == expected
  for root, cores, side_by_side in (("serial", len(CORES), 1), ("workers", 1, 2)):
    (host,) = {json.dumps(record["host"]) for name in ("model.kind=rnn", "model.kind=gru")
               for record in workdirs.read_provenance(str(tmp_path / root / name))}   # one each
    assert json.loads(host) == {"name": platform.node(), "cores": cores,
                                "cpus": os.cpu_count(), "side_by_side": side_by_side}, root


@pytest.mark.slow
def test_a_points_error_in_a_worker_is_the_serial_sweeps_error(tmp_path):
  """A point whose workdir cannot take its run: the same class and line from a worker as
  from the serial sweep; the other worker's point is stopped and can be resumed."""
  if len(CORES) < 2:
    pytest.skip("needs 2 CPU cores")
  config, points = tiny.config(), [{"model.kind": "gru"}, {"model.kind": "rnn"}]
  errors = []
  for workers in (1, 2):
    root = tmp_path / f"workers-{workers}"
    (root / "model.kind=gru").mkdir(parents=True)
    (root / "model.kind=gru" / "checkpoints").write_text("a file where a directory goes")
    with pytest.raises(WorkdirError) as refused:
      run_sweep(config, points, str(root), tiny.task(), workers=workers)
    errors.append(str(refused.value).replace(str(root), "ROOT"))
  assert errors[0] == errors[1]
  assert errors[0].startswith("sweep point 0 (model.kind=gru): workdir ROOT/model.kind=gru: the "
                              "run writes a directory checkpoints there")


def _long_sum() -> bytes:
  """A sum of 2^20 floats: long enough for XLA to split it over its CPU threads, so its last
  digits depend on how many there are."""
  numbers = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
  return np.asarray(jax.jit(jnp.sum)(numbers)).tobytes()


def _cores_xla_threads_and_long_sum() -> tuple[list[int], int, bytes]:
  """This process's CPU cores, the threads of XLA's CPU pool (named tf_XLAEigen) and
  `_long_sum`. Module-level: a worker imports it."""
  total = _long_sum()
  names = []
  for thread in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{thread}/comm") as f:
      names.append(f.read().strip())
  return sorted(os.sched_getaffinity(0)), names.count("tf_XLAEigen"), total


@pytest.mark.long
def test_each_worker_runs_on_its_cores_with_the_sweeps_xla_threads_and_its_sums(capsys):
  """Each worker's threads on its share of the cores, XLA's pool as large as this process's
  (every core), so a long sum has this process's bits (it differed on one core's pool)."""
  if len(CORES) < 2:
    pytest.skip("needs 2 CPU cores")
  slots = sweep_workers.check_workers(2)
  jobs = [sweep_workers.Job(k, f"job {k}", _cores_xla_threads_and_long_sum, ())
          for k in range(2)]
  started = []
  results = dict(sweep_workers.run(jobs, slots, on_start=started.append))
  assert sorted(results.values()) == sorted((list(slot.cores), len(CORES), _long_sum())
                                            for slot in slots)
  assert started == []                 # the jobs never called report_start
  assert capsys.readouterr().err == ""


def test_without_affinity_the_workers_share_every_core(tmp_path, monkeypatch):
  """macOS and Windows have no CPU affinity: the cores are os.cpu_count()'s."""
  monkeypatch.delattr(os, "sched_getaffinity")
  monkeypatch.setattr(os, "cpu_count", lambda: 4)
  assert [slot.cores for slot in sweep_workers.check_workers(2, str(tmp_path))] == [(0, 1),
                                                                                    (2, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("job, message", [
    ((os._exit, (3,)), r"^job 0: its worker process exited with status 3 before it reported "
                       r"\(its output is above\)"),
    ((int, ("x",)), r"^job 0: ValueError: invalid literal for int\(\) with base 10: 'x' \(in a "
                    r"worker: its traceback is above\)$")])
def test_a_worker_that_dies_or_fails_on_a_bug_ends_the_run_in_one_line(job, message, capsys):
  function, args = job
  with pytest.raises(sweep_workers.WorkerFailed, match=message):
    list(sweep_workers.run([sweep_workers.Job(0, "job 0", function, args)],
                           sweep_workers.check_workers(1), on_start=print))
  if function is int:
    assert "[job 0] Traceback (most recent call last):" in capsys.readouterr().err


def _files(directory) -> dict:
  """{path: bytes} of every file under directory."""
  contents = {}
  for root, _, names in os.walk(directory):
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        contents[os.path.join(root, name)] = f.read()
  return contents


@pytest.mark.long
def test_a_stop_signal_reaches_every_worker_once_and_each_point_keeps_a_checkpoint(tmp_path):
  """SIGTERM to the sweep while both workers train: each saves a checkpoint of its step and
  stops; the sweep raises WorkersStopped (a Stopped: launch.py's exit status for SIGTERM)
  naming both points."""
  if len(CORES) < 2:
    pytest.skip("needs 2 CPU cores")
  config = tiny.config(**{"train.num_steps": 100_000, "train.checkpoint_every": 10,
                          "train.log_every": 10, "train.eval_every": 100_000})
  points = [{"model.kind": "rnn"}, {"model.kind": "gru"}]
  checkpoints = [tmp_path / point_name / "checkpoints" for point_name in
                 ("model.kind=rnn", "model.kind=gru")]

  def stop_once_both_train():
    while not all(directory.is_dir() and any(name.isdigit() for name in os.listdir(directory))
                  for directory in checkpoints):
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=stop_once_both_train, daemon=True).start()
  with pytest.raises(sweep_workers.WorkersStopped) as stopped:
    run_sweep(config, points, str(tmp_path), tiny.task(), workers=2)
  assert stopped.value.signum == signal.SIGTERM
  assert re.fullmatch(r"SIGTERM stopped the sweep's workers: point 0 \(model.kind=rnn\): "
                      r"SIGTERM at step (\d+): checkpoint saved in \S+model.kind=rnn/checkpoints; "
                      r"run the same command again to resume; point 1 \(model.kind=gru\): "
                      r"SIGTERM at step (\d+): checkpoint saved in \S+model.kind=gru/checkpoints; "
                      r"run the same command again to resume", str(stopped.value))
  for directory, step in zip(checkpoints, re.findall(r"at step (\d+)", str(stopped.value)),
                             strict=True):
    assert step in os.listdir(directory)


def test_a_workers_error_is_raised_as_its_class_or_the_nearest_that_takes_its_line():
  """What a worker reports (its error's class and line) raised here: the same class where it
  takes the message alone (WorkdirError), else its nearest base that does (UnknownFlag needs
  a flag's name: a ConfigError); a bug's is none of ours (WorkerFailed names it instead)."""
  assert type(sweep_workers._rebuilt(WorkdirError, "line")) is WorkdirError
  rebuilt = sweep_workers._rebuilt(UnknownFlag, "line")
  assert type(rebuilt) is ConfigError and str(rebuilt) == "line"
  assert sweep_workers._rebuilt(ValueError, "line") is None
  assert sweep_workers._rebuilt(None, "line") is None
