"""Worker processes that train a sweep's points side by side (`run_sweep(..., workers=N)`):
each runs on its share of this process's CPU cores (its threads' affinity, set once JAX has
sized its CPU thread pool by every core, as the serial sweep's) and, on a GPU host, one GPU
(CUDA_VISIBLE_DEVICES, set before its interpreter starts); jobs go in and results come out
as pickles over pipes, its output is passed on line by line under its point's name, its
errors are raised here as the same one-line errors, and a stop signal is passed on once
(docs/running.md, "Sweeps").
"""

import contextlib
import glob
import os
import pickle
import re
import selectors
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
from absl import logging

import research
from research import jax_start
from research.errors import ConfigError, RunFailed, UserError
from research.training import command
from research.training.command import Stopped
from research.training.workdir import SIDE_BY_SIDE

# jax.config's settings a worker takes from the process that starts it (where JAX runs, the
# compilation cache, the numbers' types and precision); it inherits the environment whole
# (XLA_FLAGS, JAX_*), so its steps compile to the same programs.
CARRIED_SETTINGS = ("jax_platforms", "jax_enable_compilation_cache", "jax_compilation_cache_dir",
                    "jax_persistent_cache_min_compile_time_secs",
                    "jax_persistent_cache_min_entry_size_bytes", "jax_enable_x64",
                    "jax_default_matmul_precision", "jax_threefry_partitionable",
                    "jax_default_prng_impl")
# What a worker runs: python -c SERVE RESULTS_FD (`serve`).
SERVE = "from research.training import sweep_workers; sweep_workers.serve()"
_WORKER = {}      # in a worker: "send" (a message to the process that started it), "key"
                  # (of the job it runs: what report_start names), "stop" (SIGINT came)


class Slot(NamedTuple):
  """Where one worker runs."""
  cores: tuple[int, ...]      # its CPU affinity
  gpu: str | None             # its CUDA_VISIBLE_DEVICES; None on a host without NVIDIA GPUs


class Job(NamedTuple):
  """One call a worker makes: function(*args) -> a picklable value."""
  key: Any                    # what the caller knows the job by (a point's index): hashable
  label: str                  # the prefix of the lines it prints (a point's name)
  function: Callable          # importable by the worker (a module's function)
  args: tuple


class WorkerFailed(RunFailed):
  """A worker ended without reporting (killed, crashed), or a job raised an error that is
  none of ours (its traceback is printed above the message)."""


class WorkersStopped(Stopped):
  """A stop signal reached the sweep; each worker stopped its point as a run stops."""

  def __init__(self, signum: int, stops: list[str], left: int):
    self.signum = signum
    name = signal.Signals(signum).name
    Exception.__init__(self, f"{name} stopped the sweep's workers: " + "; ".join(stops)
                       if stops else f"{name} stopped the sweep before its last {left} "
                       "point(s), every point begun being done; run the same command again "
                       "to train them")


def check_workers(workers, root: str = "/") -> list[Slot]:
  """The slots of `workers` worker processes: this process's CPU cores (its affinity) in
  `workers` contiguous shares as even as they can be, and on a host with NVIDIA GPUs one GPU
  each (`visible_gpus`). ConfigError unless `workers` is a whole number from 1 to the number
  of cores (and of GPUs where there are any); a TPU host takes 1 (one process holds its
  chips: split a sweep over TPU hosts with shards)."""
  cores = _cores()
  accelerator = jax_start.visible_accelerator(root)
  gpus = visible_gpus(root) if accelerator == "gpu" else []
  if accelerator == "tpu":
    limit, why = 1, "on a TPU host: one process holds its chips; shards split a sweep over hosts"
  elif gpus:
    limit = min(len(gpus), len(cores))
    why = f"one per GPU and per CPU core: this process has {len(gpus)} and {len(cores)}"
  else:
    limit, why = len(cores), f"one per CPU core: this process has {len(cores)}"
  if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= limit:
    raise ConfigError(f"sweep workers={workers!r}: give a whole number from 1 to {limit} "
                      f"({why})")
  shares = [tuple(cores[k * len(cores) // workers:(k + 1) * len(cores) // workers])
            for k in range(workers)]
  return [Slot(share, gpus[k] if gpus else None) for k, share in enumerate(shares)]


def visible_gpus(root: str = "/") -> list[str]:
  """The NVIDIA GPUs this process may use, as CUDA_VISIBLE_DEVICES names them: that
  variable's entries where it is set, else the driver's device files (dev/nvidia0, …, under
  `root`); nothing is started or loaded."""
  chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
  if chosen is not None:
    return [name.strip() for name in chosen.split(",") if name.strip()]
  found = (re.fullmatch(r"nvidia(\d+)", os.path.basename(path))
           for path in glob.glob(os.path.join(root, "dev", "nvidia*")))
  return [str(number) for number in sorted(int(match[1]) for match in found if match)]


def keep_on_the_cpu(workers: int) -> None:
  """This process starts JAX on the CPU alone, leaving the GPUs (and their memory, which JAX
  takes most of when it starts on them) to its `workers`; ConfigError where JAX has started
  on them already."""
  jax.config.update("jax_platforms", "cpu")
  if jax.default_backend() != "cpu":        # started before: jax_platforms changes nothing
    raise ConfigError(f"sweep workers={workers}: JAX has started on this process's GPUs, "
                      "holding their memory; start the sweep before any JAX computation "
                      "(in a new process or notebook kernel), or give workers=1")


def check_sendable(value, workers: int, what: str) -> None:
  """ConfigError unless `value` (the experiment, a point's config) can be sent to a worker:
  pickled, its functions by their module's name."""
  try:
    pickle.dumps(value)
  except Exception as error:  # noqa: BLE001 - pickle raises several kinds
    raise ConfigError(f"sweep workers={workers}: {what} cannot be sent to a worker process "
                      f"({type(error).__name__}: {error}); define it in an importable "
                      "module, or give workers=1") from None


def run(jobs: list[Job], slots: list[Slot], on_start: Callable[[Any], None]
        ) -> Iterator[tuple[Any, Any]]:
  """(job.key, its value) for each job as the workers finish them, one worker per slot (at
  most one per job), each taking the next job when it is free; `on_start(key)` when a job
  calls `report_start()`. A job's error (ours: a UserError or RunFailed) stops the other
  workers as a signal would (their points save a checkpoint) and is raised once they have
  stopped, as the same class with the same message. SIGINT or SIGTERM (the first) is passed
  on once to the busy workers, and raised once they have stopped as WorkersStopped, naming
  each point's checkpoint; a second Ctrl-C is passed on too (they end at once) and raised as
  KeyboardInterrupt."""
  pool = _Pool(deque(jobs), on_start)
  try:
    pool.start(slots[:len(jobs)])
    with pool.stop_signals():
      yield from pool.results()
  finally:
    pool.close()
  pool.raise_outcome()


class _Worker:
  """One worker process and its pipes: jobs in (its stdin), results out, output out."""

  def __init__(self, slot: Slot, number: int, side_by_side: int):
    self.number, self.job, self.partial = number, None, b""
    results, results_writer = os.pipe()
    output, output_writer = os.pipe()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [_package_root(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
        SIDE_BY_SIDE: str(side_by_side)}          # in each run's provenance
    if slot.gpu is not None:
      environment["CUDA_VISIBLE_DEVICES"] = slot.gpu
    try:    # its own session: a Ctrl-C at the terminal reaches this process alone, and Linux's
      # scheduler gives it a share of its own (autogroup)
      self.process = subprocess.Popen(
          [sys.executable, "-c", SERVE, str(results_writer)], stdin=subprocess.PIPE,
          stdout=output_writer, stderr=subprocess.STDOUT, env=environment,
          start_new_session=True, pass_fds=(results_writer,))
    finally:
      os.close(output_writer)
      os.close(results_writer)
    self.results, self.output = os.fdopen(results, "rb", buffering=0), output
    os.set_blocking(self.output, False)
    settings = {name: getattr(jax.config, name) for name in CARRIED_SETTINGS
                if not (name == "jax_platforms" and slot.gpu is not None)}
    self.send({"settings": settings, "argv": sys.argv, "path": sys.path, "cores": slot.cores})

  @property
  def label(self) -> str:
    return self.job.label if self.job is not None else f"sweep worker {self.number}"

  def send(self, message) -> None:
    """`message` to the worker's stdin; a worker that has ended takes nothing (its results
    pipe says how it ended)."""
    with contextlib.suppress(BrokenPipeError):
      _write_frame(self.process.stdin, pickle.dumps(message))

  def forward(self) -> bool:
    """Passes on the complete lines the worker has printed so far, each under its label, to
    this process's stderr; True once the worker has closed its output (its last line then
    passed on too)."""
    ended = False
    with contextlib.suppress(BlockingIOError):
      while not ended:
        chunk = os.read(self.output, 1 << 16)
        self.partial += chunk
        ended = not chunk
    *lines, self.partial = self.partial.split(b"\n")
    if ended and self.partial:
      lines, self.partial = [*lines, self.partial], b""
    for line in lines:
      print(f"[{self.label}] {line.decode(errors='replace').rstrip()}", file=sys.stderr,
            flush=True)
    return ended


class _Pool:
  """The workers of `run`, the jobs left, and how the pool ends."""

  def __init__(self, jobs: deque, on_start: Callable[[Any], None]):
    self.jobs, self.on_start = jobs, on_start
    self.order = {job.key: n for n, job in enumerate(jobs)}   # the jobs' keys, in order
    self.failure: BaseException | None = None     # the first job's error, raised at the end
    self.signum = 0                               # the first stop signal
    self.stops: list[tuple] = []                  # (key, in words) of each stopped job
    self.closing = False                          # the caller has gone: no new job
    self.selector = selectors.DefaultSelector()
    self.workers: list[_Worker] = []

  def start(self, slots: list[Slot]) -> None:
    """A worker per slot, each handed its first job."""
    for number, slot in enumerate(slots):
      worker = _Worker(slot, number, side_by_side=len(slots))
      self.workers.append(worker)
      self.selector.register(worker.results, selectors.EVENT_READ, (worker, "results"))
      self.selector.register(worker.output, selectors.EVENT_READ, (worker, "output"))
      self._next(worker)

  @property
  def stopping(self) -> bool:
    return self.failure is not None or bool(self.signum) or self.closing

  def _next(self, worker: _Worker) -> None:
    """Hands `worker` the next job, or lets it end (its stdin closed)."""
    worker.job = self.jobs.popleft() if self.jobs and not self.stopping else None
    if worker.job is None:
      with contextlib.suppress(OSError):
        worker.process.stdin.close()
      return
    job = worker.job
    worker.send((job.key, pickle.dumps((job.function, job.args))))

  def results(self) -> Iterator[tuple[Any, Any]]:
    while self.selector.get_map():
      for selected, _ in self.selector.select():
        worker, kind = selected.data
        if kind == "output":
          self._forward(worker)
          continue
        message = _read_frame(worker.results)
        self._forward(worker)          # what it printed before it reported
        if message is None:
          self._ended(worker)
          continue
        kind, key, value = pickle.loads(message)
        if kind == "started":
          self.on_start(key)
          continue
        job, worker.job = worker.job, None
        if kind == "done":
          yield key, value
        else:
          self._failed(job, kind, value)
        self._next(worker)

  def _forward(self, worker: _Worker) -> None:
    if worker.forward() and worker.output in self.selector.get_map():
      self.selector.unregister(worker.output)

  def _ended(self, worker: _Worker) -> None:
    """The worker closed its results pipe: it is ending, after its last job or in the
    middle of one (a failure). What it prints until it has ended is passed on first."""
    self.selector.unregister(worker.results)
    os.set_blocking(worker.output, True)
    while not worker.forward():
      pass
    if worker.output in self.selector.get_map():
      self.selector.unregister(worker.output)
    status = worker.process.wait()
    if worker.job is not None or (self.jobs and not self.stopping):   # (or between jobs)
      how = (f"was killed by {signal.Signals(-status).name}" if status < 0
             else f"exited with status {status}")
      self._fail(WorkerFailed(f"{worker.label}: its worker process {how} before it reported "
                              "(its output is above); run the same command again to resume"))
      worker.job = None

  def _failed(self, job: Job, kind: str, value) -> None:
    if kind == "stopped":
      self.stops.append((job.key, f"{job.label}: {value}"))
      return
    error_class, message = value
    self._fail(_rebuilt(error_class, message) or WorkerFailed(
        f"{job.label}: {message} (in a worker: its traceback is above)"))

  def _fail(self, error: BaseException) -> None:
    if self.failure is None:
      self.failure = error
      self._interrupt_busy()

  def _interrupt_busy(self, signum: int = signal.SIGINT) -> None:
    """`signum` to each worker that has a job: its run stops (a checkpoint saved)."""
    for worker in self.workers:
      if worker.job is not None and worker.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.kill(worker.process.pid, signum)

  @contextlib.contextmanager
  def stop_signals(self):
    """SIGINT and SIGTERM handled while the workers run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
      yield
      return

    def handle(signum, frame):
      del frame
      if self.signum == signal.SIGINT and signum == signal.SIGINT:
        self._interrupt_busy()
        raise KeyboardInterrupt
      if not self.signum:
        self.signum = signum
        self._interrupt_busy(signum)

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      yield
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def close(self) -> None:
    """Lets every worker end (a busy one interrupted, as for a failure) and waits for it,
    passing its output on meanwhile."""
    self.closing = True
    for worker in self.workers:
      with contextlib.suppress(OSError):
        worker.process.stdin.close()
    if self.selector.get_map():
      self._interrupt_busy()
      for _ in self.results():   # (their points' results are on disk; the caller has gone)
        pass
    for worker in self.workers:
      worker.process.wait()
      worker.results.close()
      os.close(worker.output)
    self.selector.close()

  def raise_outcome(self) -> None:
    """The first failure, else WorkersStopped if a job was stopped or left untaken."""
    if self.failure is not None:
      raise self.failure
    if self.stops or self.jobs:
      raise WorkersStopped(self.signum or signal.SIGINT, [words for _, words in sorted(
          self.stops, key=lambda stop: self.order[stop[0]])], len(self.jobs))


def _rebuilt(error_class, message: str) -> BaseException | None:
  """A worker's UserError or RunFailed as this process raises it: its class, or the first
  of its bases that takes the message alone; None for another error (a bug)."""
  for candidate in error_class.__mro__ if isinstance(error_class, type) else ():
    if issubclass(candidate, (UserError, RunFailed)):
      with contextlib.suppress(TypeError):
        return candidate(message)
  return None


def _cores() -> list[int]:
  """This process's CPU cores: its affinity, or every core where the system has no
  affinity (macOS, Windows)."""
  if hasattr(os, "sched_getaffinity"):
    return sorted(os.sched_getaffinity(0))
  return list(range(os.cpu_count() or 1))


def _pin(cores: tuple[int, ...]) -> None:
  """Every thread of this process onto `cores`, once JAX's backend has started: XLA sized its
  CPU thread pool by the cores the process started with, every core of the sweep, so a
  long reduction splits over as many threads as in the serial sweep and gives its bits
  (a worker started on one core differed in the last digits). Where the system has no
  affinity (macOS, Windows) the workers share every core."""
  jax.devices()
  if hasattr(os, "sched_setaffinity"):
    for thread in os.listdir("/proc/self/task"):
      with contextlib.suppress(ProcessLookupError):     # a thread that has ended since
        os.sched_setaffinity(int(thread), cores)


def _package_root() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(research.__file__)))


def _write_frame(stream, data: bytes) -> None:
  stream.write(struct.pack("<Q", len(data)) + data)
  stream.flush()


def _read_frame(stream) -> bytes | None:
  """A frame written by `_write_frame`, None at the end of the stream."""
  header = _read_exactly(stream, 8)
  return None if header is None else _read_exactly(stream, struct.unpack("<Q", header)[0])


def _read_exactly(stream, size: int) -> bytes | None:
  data = b""
  while len(data) < size:
    chunk = stream.read(size - len(data))
    if not chunk:
      return None
    data += chunk
  return data


# ---- In a worker ----------------------------------------------------------------------------

def report_start() -> None:
  """Tells the process that started this worker that its job has begun writing (a sweep's
  point: the sweep records itself then); nothing outside a worker."""
  if "key" in _WORKER:
    _WORKER["send"](("started", _WORKER["key"], None))


def serve() -> None:
  """A worker's life (`python -c SERVE RESULTS_FD`): the settings and command line of the
  process that started it (launch.py's --verbose among them), then each job from its stdin
  until it closes, each job's value or error written back to the file descriptor
  RESULTS_FD; a stopped job ends the worker."""
  jobs = sys.stdin.buffer
  results = os.fdopen(int(sys.argv[1]), "wb")
  _WORKER["send"] = lambda message: _write_frame(results, pickle.dumps(message))
  for stop in (signal.SIGINT, signal.SIGTERM):
    signal.signal(stop, _interrupt)
  first = pickle.loads(_read_frame(jobs))
  sys.argv, sys.path[:] = first["argv"], first["path"]
  for name, value in first["settings"].items():
    jax.config.update(name, value)
  _pin(first["cores"])
  verbose = "--verbose" in sys.argv        # as launch.py: other threads' failures watched,
  command.watch(verbose)                   # the libraries' logs through absl's handler (as
  logging.use_absl_handler()               # absl's app.run sets it), quiet unless --verbose
  if not verbose:
    command.quiet_libraries()
  while (frame := _read_frame(jobs)) is not None:
    key, payload = pickle.loads(frame)
    _WORKER["key"] = key
    outcome = (_outcome(payload) if "stop" not in _WORKER else
               ("stopped", "stopped before it started"))
    del _WORKER["key"]
    sys.stdout.flush()
    sys.stderr.flush()
    _WORKER["send"]((outcome[0], key, outcome[1]))
    if outcome[0] == "stopped":   # its checkpoint written (or a second Ctrl-C): as launch.py
      os._exit(0)                 # ends, without waiting for the libraries' threads


def _interrupt(signum, frame) -> None:
  """A worker's SIGINT or SIGTERM (a stop passed on): KeyboardInterrupt in a job (the
  train loop has its own handler), remembered between jobs (the next one stops before it
  starts)."""
  _WORKER["stop"] = True
  if "key" in _WORKER:
    signal.default_int_handler(signum, frame)


def _outcome(payload: bytes) -> tuple[str, Any]:
  """("done", the job's value), ("stopped", why) or ("failed", (error class, message))."""
  try:
    function, args = pickle.loads(payload)
    return "done", function(*args)
  except Stopped as error:
    return "stopped", str(error)
  except KeyboardInterrupt:
    return "stopped", "interrupted (Ctrl-C) outside its training loop"
  except (UserError, RunFailed) as error:
    return "failed", (_sendable(type(error)), str(error))
  except Exception as error:  # noqa: BLE001 - a bug: its traceback shown, its line raised
    traceback.print_exc()
    return "failed", (None, f"{type(error).__name__}: {error}")


def _sendable(error_class: type) -> type:
  """error_class, or the first of its bases that pickles (one defined in a function does not)."""
  for candidate in error_class.__mro__:
    try:
      pickle.dumps(candidate)
      return candidate
    except Exception:  # noqa: BLE001, S112
      continue
  return RunFailed

