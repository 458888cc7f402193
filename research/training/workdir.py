"""The workdir's rules: its file names, the config record and what a resume may change, keys
renamed since, the metrics' history, where each start came from (provenance.jsonl), and one
writer at a time (run.lock), leaving a refused run's workdir as it was found (docs/running.md,
"The workdir"; docs/trained_runs.md, "Where a run came from")."""

import contextlib
import datetime
import errno
import fcntl
import json
import math
import os
import platform
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import flax
import jax
import jaxlib
import optax
import orbax.checkpoint as ocp

import research
from research import files
from research.errors import ConfigError, WorkdirError, excerpt
from research.files import ProbeLeft, write_probe

# ---- File names ---------------------------------------------------------------------------
LOCK_FILE, CONFIG, METRICS_FILE, FINAL_METRICS = ("run.lock", "config.json", "metrics.jsonl",
                                                  "final_metrics.json")
LOSS_PLOT, CHECKPOINTS, TENSORBOARD = "loss.png", "checkpoints", "tensorboard"
PROFILE, WANDB = "profile", "wandb"     # jax.profiler's traces; the W&B run's files
PROVENANCE = "provenance.jsonl"         # one line per start or resume: where it came from
SWEEP_RECORD = "sweep.json"      # in a sweep's root workdir (research/training/sweep.py)
SHARDS = "sweep shards, each named in its shard-I-of-N.lock"   # run.lock's text while shared
MAX_BYTES = 2**20       # a run's config.json holds a few KiB
MAX_DEPTH = 16          # groups (and lists) within groups: a few levels in any experiment

# ---- The config record and what a resume may change ---------------------------------------
# Keys a rerun may change and still resume the workdir's run (more steps, other hosts, how
# an update is computed: microbatches, rematerialisation). Not train.init_from nor
# init_params: where a warm start's parameters came from stays its run's (a resume reads its
# own checkpoint, never that run's again).
RESUMABLE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every",
                  "train.checkpoint_every", "train.keep_checkpoints", "train.profile_steps",
                  "train.grad_accum_steps", "model.remat",
                  "distributed.coordinator_address", "distributed.num_processes",
                  "distributed.process_id", "wandb.mode", "wandb.project", "wandb.entity",
                  "wandb.name")
# old key: (its new name, what changed); an old key on the command line, in a sweep or in a
# workdir's config.json is refused naming the new one
RENAMED_KEYS = {
    "model.dropout": ("model.dropout_rate", ""),
    "model.mlp_ratio": ("model.mlp_size", "the MLP's width itself, mlp_ratio × hidden_size"),
    "model.cell": ("model.kind", "rnn, lstm or gru, as model.kind in every experiment"),
    "model.local_window": ("model.window", "the half-width D of local_m / local_p"),
}
# key added since: the value that means what a config.json without the key ran
ADDED_KEYS = {
    "model.positions": "sinusoidal",          # sequence_tasks' blocks (listops and lra had it)
    "model.mixer_gate": "none",               # nothing after the blocks' mixer
    "train.recurrence_learning_rate": 0.0,    # one rate for every parameter
    "model.dtype": "float32",                 # kernel_regression (the others had it)
    "train.init_from": "",                    # no warm start
    "train.init_params": ".*",
}


def renamed(key: str) -> str | None:
  """'config.<key>, now called config.<new key> (what changed)' for a renamed key, else None."""
  if key not in RENAMED_KEYS:
    return None
  new, change = RENAMED_KEYS[key]
  return f"config.{key}, now called config.{new}" + (f" ({change})" if change else "")


def refuse_renamed(old: dict, workdir: str, action: str, new: Iterable[str] | None = None
                   ) -> None:
  """ConfigError if the flat config `old` of `workdir` was written under a key renamed since
  (where `new`, the keys of today's config, is given: one whose new name it holds);
  `action`: what the message advises."""
  for key in sorted(set(old) & set(RENAMED_KEYS)):
    new_name = RENAMED_KEYS[key][0]
    if new_name not in old and (new is None or new_name in new):
      verb = "resume" if new is not None else "restore"
      raise ConfigError(f"workdir {workdir} was written with {renamed(key)}: this version "
                        f"cannot {verb} it (its parameters have other names too); {action}")


def flatten(tree: dict, prefix: str = "") -> dict:
  """{"a.b": value} of a nested dict (a config as JSON)."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat |= flatten(value, f"{prefix}{key}.")
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def check_config(config, workdir: str) -> str | None:
  """Refuses a workdir this config cannot run in, before anything is compiled or written:
  a sweep's root, a config.json that cannot be read, one written under a key renamed since,
  and the checkpoints of a run with a different config (other than RESUMABLE_KEYS). A
  different config whose run saved no checkpoint takes the workdir over: the line returned
  says so (None when the workdir is new or this config's)."""
  if os.path.exists(os.path.join(workdir, SWEEP_RECORD)):
    raise WorkdirError(f"workdir {workdir} holds a sweep ({SWEEP_RECORD}, its points in "
                       "subdirectories), not a single run; give another --workdir")
  old = read_record(workdir, CONFIG, "the config of the run there", "to run this command's "
                    "config there (its checkpoints are resumed)")
  if old is None:
    return None
  changes = config_changes(old, json.loads(config.to_json_best_effort()), workdir)
  if not changes:
    return None
  if saved_steps(os.path.join(workdir, CHECKPOINTS)):
    raise ConfigError(f"workdir {workdir} holds checkpoints of a run with a different config "
                      f"({changes}); use a new --workdir")
  return (f"workdir {workdir}: its run of another config ({changes}) saved no checkpoint; "
          f"this config takes it over ({CONFIG} replaced, the records of {METRICS_FILE} moved "
          "to a metrics.after_step_0 file)")


def read_config_json(path: str) -> dict:
  """The JSON object of a run's config.json at `path`, bounded before it is parsed or walked.

  Raises FileNotFoundError where there is none, files.UnreadableFile naming the file and the
  fault (cannot be read, not a regular file, empty, cut short or not JSON, not an object),
  ConfigError naming it for a file over MAX_BYTES or groups nested deeper than MAX_DEPTH
  (with the key where they do, when the parser could reach it): no run writes either.
  """
  try:
    status = os.stat(path)
  except FileNotFoundError:
    raise
  except OSError as error:
    raise files.UnreadableFile(f"{path} cannot be read ({error.strerror or error})") from None
  if not stat.S_ISREG(status.st_mode):       # a directory, a device (/dev/zero: endless)
    raise files.UnreadableFile(f"{path} is not a file")
  size = status.st_size
  if size > MAX_BYTES:
    raise ConfigError(f"{path} holds {size} bytes, more than a run's config ({MAX_BYTES} at "
                      "most): not a config.json a run wrote")
  try:
    value = files.read_json(path)
  except RecursionError:
    raise ConfigError(f"{path} nests its groups deeper than the JSON parser reads, more than "
                      f"{MAX_DEPTH} levels: not a config.json a run wrote") from None
  key = _too_deep(value)
  if key is not None:
    raise ConfigError(f"{path} nests its groups more than {MAX_DEPTH} levels deep, at "
                      f"{excerpt('config.' + key, 80)}: not a config.json a run wrote")
  return value


def _too_deep(node, key: str = "", level: int = 1) -> str | None:
  """The dotted key of the first group or list of `node` (a JSON value at `level`, the top
  object's being 1) deeper than MAX_DEPTH, or None; it descends MAX_DEPTH levels at most."""
  if isinstance(node, dict):
    children = ((f"{key}.{name}" if key else name, child) for name, child in node.items())
  elif isinstance(node, list):
    children = ((f"{key}[{i}]", child) for i, child in enumerate(node))
  else:
    return None
  for path, child in children:
    if isinstance(child, (dict, list)):
      found = path if level + 1 > MAX_DEPTH else _too_deep(child, path, level + 1)
      if found is not None:
        return found
  return None


def read_record(workdir: str, name: str, records: str, deleting: str):
  """The JSON file `name` of workdir (config.json, a sweep's sweep.json), None where there
  is none; WorkdirError naming it when it cannot be read, saying what it `records` and what
  `deleting` it does."""
  read = read_config_json if name == CONFIG else files.read_json
  try:
    return read(os.path.join(workdir, name))
  except FileNotFoundError:
    return None
  except (files.UnreadableFile, ConfigError) as error:
    raise WorkdirError(f"workdir {workdir} cannot be resumed: {error}. It records {records}: "
                       f"put back a whole copy, delete it {deleting}, or give another "
                       "--workdir") from None


def config_changes(old: dict, new: dict, workdir: str, ignored: Iterable[str] = ()) -> str:
  """The keys whose values differ between the configs `old` (a workdir's, as JSON) and
  `new`, but for RESUMABLE_KEYS and `ignored`, in words ('' when none; a key added since
  `old` was written counts as its ADDED_KEYS value there); ConfigError if `old` was written
  under a key renamed since."""
  old, new = flatten(old), flatten(new)
  refuse_renamed(old, workdir, "use a new --workdir, or resume it with the version of the "
                 "project that wrote it", new)
  old |= {key: value for key, value in ADDED_KEYS.items() if key not in old and key in new}
  changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                   and k not in RESUMABLE_KEYS and k not in set(ignored))
  value = lambda flat, k: repr(flat[k]) if k in flat else "absent"
  shown = "; ".join(f"config.{k} {value(old, k)} there, {value(new, k)} now"
                    for k in changed[:4])
  return shown + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def saved_steps(directory: str) -> list[int]:
  """The steps of the complete checkpoints in `directory`, without opening them (Orbax
  writes a step into a temporary directory and renames it to the step's number once
  complete); [] where there is none."""
  try:
    names = os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return []
  return sorted(int(name) for name in names if name.isascii() and name.isdigit()
                and os.path.isdir(os.path.join(directory, name)))


def latest_checkpoint(workdir: str) -> tuple[str, int] | None:
  """(directory, step) of the latest complete checkpoint under `workdir`: the highest step
  of its checkpoints/ (a run's), or of its points' (a sweep's: the point whose checkpoint
  was written last); None where there is none."""
  found = []
  try:
    points = [os.path.join(workdir, name) for name in sorted(os.listdir(workdir))]
  except OSError:
    points = []
  for run in (workdir, *points):
    directory = os.path.abspath(os.path.join(run, CHECKPOINTS))
    steps = saved_steps(directory)
    with contextlib.suppress(OSError):
      if steps:
        written = os.stat(os.path.join(directory, str(steps[-1]))).st_mtime_ns
        found.append((run == workdir, written, directory, steps[-1]))
  if not found:
    return None
  _, _, directory, step = max(found)           # a run's own before a point's, else the newest
  return directory, step


# ---- The metrics' history -----------------------------------------------------------------
# Every metrics file is RFC 8259 JSON, which has no NaN or Infinity: a non-finite float (a
# float16 run's skipped step has an infinite train/grad_norm) is the string "nan", "inf" or
# "-inf" (what Python's str and float() use, so a sweep's summary.csv reads alike).
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encoded(value: Any) -> Any:
  """`value` with each non-finite float (at any depth of dicts, lists and tuples) as its
  NON_FINITE string."""
  if isinstance(value, float) and not math.isfinite(value):
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
  if isinstance(value, dict):
    return {key: encoded(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [encoded(item) for item in value]
  return value


def decoded(value: Any) -> Any:
  """`encoded` undone: each NON_FINITE string (at any depth) as its float."""
  if isinstance(value, str):
    return NON_FINITE.get(value, value)
  if isinstance(value, dict):
    return {key: decoded(item) for key, item in value.items()}
  if isinstance(value, list):
    return [decoded(item) for item in value]
  return value


def dumps(value: Any, indent: int | None = None) -> str:
  """`value` as RFC 8259 JSON, non-finite floats `encoded`."""
  return json.dumps(encoded(value), indent=indent, allow_nan=False)


def loads(text: str | bytes) -> Any:
  """The value of a metrics file's JSON, NON_FINITE strings `decoded` (NaN or Infinity
  tokens, written by an earlier version, read too)."""
  return decoded(json.loads(text))


def write_json(path: str, value: dict) -> None:
  """A metrics file (final_metrics.json) written whole (research/files.py), `dumps`-encoded."""
  files.write_text(path, dumps(value, indent=2) + "\n")


def read_json(path: str) -> dict:
  """A metrics file written by `write_json`, `decoded` (files.read_json's errors)."""
  return decoded(files.read_json(path))


def read_history(workdir: str) -> list[dict]:
  """The complete records of the workdir's metrics.jsonl in order ([] where there is none),
  read without writing: a live run's too, the line it is writing left out."""
  try:
    with open(os.path.join(workdir, METRICS_FILE), "rb") as f:
      lines = f.readlines()
  except FileNotFoundError:
    return []
  return [record for record in map(parse_record, lines) if record is not None]


def parse_record(line: bytes) -> dict | None:
  """A complete metrics.jsonl record ({"step": int, ...}), or None for a torn
  (half-written) line or anything else."""
  if not line.endswith(b"\n"):
    return None
  try:
    record = loads(line)
  except ValueError:
    return None
  return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


# ---- Where a run came from ----------------------------------------------------------------
# provenance.jsonl: one JSON line per start or resume (its step, command, checkout, versions
# and devices; where a warm start's parameters came from), which research.training.restore
# returns, warning when today's versions or devices differ from the last start's.
GIT_SECONDS = 10          # git answers in milliseconds; a hung filesystem must not stop a run


def running_versions() -> dict[str, str]:
  """{"python", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "research"}: the
  version of each, as the running modules give it."""
  modules = {"jax": jax, "jaxlib": jaxlib, "flax": flax, "optax": optax,
             "orbax-checkpoint": ocp, "research": research}
  return {"python": platform.python_version(),
          **{name: str(module.__version__) for name, module in modules.items()}}


def running_devices() -> dict:
  """The devices JAX runs on: platform, kind (of device 0), count (of every process) and
  processes."""
  device = jax.devices()[0]
  return {"platform": device.platform, "kind": device.device_kind,
          "count": jax.device_count(), "processes": jax.process_count()}


# Set by a sweep's workers (research/training/sweep_workers.py) to their number, or by hand
# for runs started side by side: the runs that shared the machine with this one, whose
# timings (perf/*) are not those of a run alone
SIDE_BY_SIDE = "RESEARCH_RUNS_SIDE_BY_SIDE"


def running_host() -> dict:
  """The machine: its name, the cores this process may run on (its affinity) of the cpus it
  has, and how many runs ran side by side on it (SIDE_BY_SIDE: a sweep's workers set it; 1:
  alone, as far as we know, a job started without it on the same cores is not seen)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"name": platform.node(), "cores": cores, "cpus": os.cpu_count(),
          "side_by_side": int(os.environ.get(SIDE_BY_SIDE, "1"))}


def git_state(directory: str) -> dict:
  """{"commit": HEAD's hash, "changes": whether tracked files differ from it} of the git
  checkout holding `directory`, or {"commit": None, "reason": why there is none}."""
  def git(*args: str) -> str:
    return subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                          timeout=GIT_SECONDS, check=True).stdout.strip()

  try:
    commit = git("rev-parse", "HEAD")
    changes = bool(git("status", "--porcelain", "--untracked-files=no"))
  except FileNotFoundError:
    return {"commit": None, "reason": "git is not installed"}
  except subprocess.TimeoutExpired:
    return {"commit": None, "reason": f"git did not answer in {GIT_SECONDS} s"}
  except subprocess.CalledProcessError as error:
    lines = (error.stderr or "").strip().splitlines()
    reason = lines[0] if lines else f"git exited with status {error.returncode}"
    return {"commit": None,
            "reason": "not a git checkout" if "not a git repository" in reason else reason}
  return {"commit": commit, "changes": changes}


def start_record(step: int) -> dict:
  """This process's record, for a run starting from `step` (a start or a resume):

    {"time": "2025-01-31T12:00:00+00:00", "step": 0,         the step it starts from
     "argv": ["launch.py", "--config", ...],                 sys.argv
     "git": {"commit": "<40 hex digits>", "changes": false}, the package's checkout, changes
                                                             to its tracked files; or
            {"commit": null, "reason": "not a git checkout"} (no git, a copy, an installed
                                                             wheel)
     "versions": {"python": "3.11.7", "jax": ..., "jaxlib": ..., "flax": ..., "optax": ...,
                  "orbax-checkpoint": ..., "research": ...},
     "devices": {"platform": "cpu", "kind": "cpu", "count": 8, "processes": 1},
     "host": {"name": "vm-1", "cores": 1, "cpus": 2, "side_by_side": 2}}   running_host()
  """
  return {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "step": step, "argv": list(sys.argv),
          "git": git_state(os.path.dirname(os.path.abspath(research.__file__))),
          "versions": running_versions(), "devices": running_devices(), "host": running_host()}


def _provenance_lines(workdir: str) -> list[str]:
  """The non-empty lines of the workdir's provenance.jsonl ([] where there is none)."""
  try:
    with open(os.path.join(workdir, PROVENANCE), encoding="utf-8", errors="replace") as f:
      return [line for line in f.read().splitlines() if line.strip()]
  except FileNotFoundError:
    return []


def read_provenance(workdir: str) -> list[dict]:
  """The workdir's records, oldest first ([] where there is no file, or for a run of an
  earlier version); a line that is not a JSON object (edited by hand) is left out."""
  records = []
  for line in _provenance_lines(workdir):
    try:
      value = json.loads(line)
    except ValueError:
      continue
    if isinstance(value, dict):
      records.append(value)
  return records


def record_provenance(workdir: str, step: int, init_from: dict | None = None) -> None:
  """Appends `start_record(step)` to the workdir's provenance.jsonl, with "init_from" for a
  warm start (where its parameters came from: {"workdir": the other run's, absolute, "step":
  its checkpoint's, "params_taken": how many parameter arrays of "params_total" the model
  has}; checkpoints.read_warm_start): process 0 rewrites the file whole, its earlier lines as
  they were."""
  if jax.process_index() != 0:
    return
  line = start_record(step) | ({"init_from": init_from} if init_from else {})
  lines = [*_provenance_lines(workdir), json.dumps(line)]
  files.write_text(os.path.join(workdir, PROVENANCE), "\n".join(lines) + "\n")


def provenance_differences(recorded: dict, today: dict) -> str:
  """The versions and devices of `today` (a `start_record`) that differ from those
  `recorded`, in words ("jax 0.4.30 then, 0.10.2 now; devices 8 × cpu then, 1 × cpu now");
  '' when none do. What a record lacks is not compared."""
  changed = []
  then, now = recorded.get("versions") or {}, today["versions"]
  changed += [f"{name} {then[name]} then, {now[name]} now" for name in now
              if name in then and then[name] != now[name]]
  then, now = recorded.get("devices") or {}, today["devices"]
  if then and any(key in then and then[key] != now[key] for key in now):
    changed.append(f"devices {_devices_in_words(then)} then, {_devices_in_words(now)} now")
  return "; ".join(changed)


def _devices_in_words(record: dict) -> str:
  """'8 × cpu', '16 × TPU v5 lite in 4 processes'."""
  processes = record.get("processes", 1)
  return (f"{record.get('count')} × {record.get('kind')}"
          + (f" in {processes} processes" if processes != 1 else ""))


# ---- One writer at a time -----------------------------------------------------------------

class Lease:
  """A held workdir; `start()` once the run begins writing into it, which first calls
  what `on_start` was given, in order (a sweep's record of itself in its root, say)."""

  def __init__(self):
    self.started = False
    self._starting: list[Callable[[], None]] = []

  def on_start(self, call: Callable[[], None]) -> None:
    self._starting.append(call)

  def start(self) -> None:
    for call in [] if self.started else self._starting:
      call()
    self.started = True


@contextlib.contextmanager
def hold(workdir: str, shard: tuple[int, int] | None = None) -> Iterator[Lease]:
  """Creates `workdir` if needed and holds its lock while the block runs; yields a Lease.

  An exception leaving the block before `lease.start()` puts the lock file back as it was
  found (its bytes and modification time; removed where this call created it) and removes
  the directories this call created. Raises WorkdirError if the workdir cannot be created or
  written (a path that is a file, a read-only or immutable location: a probe file is
  created and removed there) or a live process holds it.

  `shard` (index I, count N): one of N processes (or machines) that split a sweep
  (research/training/sweep.py). It holds run.lock shared with the other shards (a run or a
  whole sweep, which hold it alone, are refused while a shard holds it, and refuse shards
  while they do) and its own lock file, shard-I-of-N.lock, alone (a second process of the
  same shard is refused). The locks are flock(2)'s; Linux takes them on NFS as the server's
  locks, which hold between machines.
  """
  created = _make_directory(workdir)
  lease = Lease()
  with _undone_unless_started(lease, created):
    if jax.process_index() != 0:
      check_writable(workdir)
      yield lease
      return
    with contextlib.ExitStack() as locks:
      locks.enter_context(_held(workdir, LOCK_FILE, lease, "a live run",
                                shared=shard is not None))
      if shard is not None:
        locks.enter_context(_held(workdir, shard_lock(shard), lease,
                                  f"a live run of sweep shard {shard[0]}/{shard[1]}"))
      yield lease


def shard_lock(shard: tuple[int, int]) -> str:
  """The name of a sweep shard's own lock file in the sweep's root: shard-I-of-N.lock."""
  return f"shard-{shard[0]}-of-{shard[1]}.lock"


@contextlib.contextmanager
def _held(workdir: str, name: str, lease: Lease, holder: str, shared: bool = False):
  """The lock file `name` of workdir locked, exclusively or `shared`, with its holder written
  in it (this process, or SHARDS for a shared lock; a refusal names the `holder` kind and
  what the file says), put back as found if the block fails before `lease.start()`."""
  path = os.path.join(workdir, name)
  existed = os.path.exists(path)
  with _locked(workdir, path, holder, shared) as handle:
    found = _contents(handle) if existed else None
    try:
      check_writable(workdir)
      _write_holder(workdir, handle, SHARDS if shared else None)
      yield
    except BaseException:
      if not lease.started:
        _put_back(path, handle, found, shared)
      raise


def _contents(handle) -> tuple[bytes, os.stat_result]:
  """(the bytes, the stat) of the open lock file, as this run found it."""
  stat = os.fstat(handle.fileno())
  handle.seek(0)
  return handle.read(), stat


def _write_holder(workdir: str, handle, text: str | None = None) -> None:
  """This process's pid, host and start time into the lock file (for a run refused as busy
  to name it), or `text` (the same bytes from every shard that holds it shared)."""
  try:
    handle.seek(0)
    handle.truncate()
    handle.write((text or f"pid {os.getpid()} on {socket.gethostname()}, since "
                  f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}").encode() + b"\n")
    handle.flush()
  except OSError as error:
    raise _unwritable(workdir, error) from None


def _put_back(path: str, handle, found: tuple[bytes, os.stat_result] | None,
              shared: bool = False) -> None:
  """The lock file as a refused run found it: its bytes and times, or no file where there
  was none (removed while holding it: no other run uses this file). A `shared` lock is
  first taken alone: one another shard still holds is left as it is."""
  with contextlib.suppress(OSError):
    if shared:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)    # OSError while another holds it
    if found is None:
      os.remove(path)
      return
    contents, stat = found
    handle.seek(0)
    handle.truncate()
    handle.write(contents)
    handle.flush()
    os.utime(handle.fileno(), ns=(stat.st_atime_ns, stat.st_mtime_ns))


@contextlib.contextmanager
def _locked(workdir: str, path: str, holder: str = "a live run", shared: bool = False):
  """The lock file, open and flock-ed (exclusively, or `shared`); WorkdirError naming the
  `holder` kind and what the file says where another process holds it. A holder that
  removed the file (a refused run) leaves a lock on a file no longer in the directory: it
  is opened again until the file locked is the one at `path`."""
  while True:
    try:
      handle = open(path, "a+b")
    except OSError as error:
      raise _unwritable(workdir, error) from None
    with handle:
      try:
        fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
      except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
        handle.seek(0)
        named = handle.read().decode(errors="replace").strip() or "another process"
        raise WorkdirError(f"workdir {workdir} is in use by {holder} ({named}); wait for it "
                           "to end or give another --workdir") from None
      try:
        current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
      except FileNotFoundError:
        current = False
      if current:
        yield handle
        return


@contextlib.contextmanager
def _undone_unless_started(lease: Lease, created: list[str]):
  """On an exception before lease.start(), removes the directories in `created` that are
  left empty."""
  try:
    yield
  except BaseException:
    if not lease.started:
      _remove_empty(created)
    raise


def _remove_empty(directories: list[str]) -> None:
  """rmdir of each directory, deepest first, as long as they are empty (nothing of anyone
  else is removed)."""
  for directory in directories:
    try:
      os.rmdir(directory)
    except OSError:
      return


def check_entries(workdir: str, files: tuple[str, ...], directories: tuple[str, ...]) -> None:
  """WorkdirError if one of the names the run writes as a file is a directory there, or
  one it writes as a directory is something else, or the run cannot write one that is
  there (`check_writable`)."""
  for names, wrong, kind in ((files, os.path.isdir, "a file"),
                             (directories, os.path.isfile, "a directory")):
    for name in names:
      path = os.path.join(workdir, name)
      if wrong(path):
        raise WorkdirError(f"workdir {workdir}: the run writes {kind} {name} there, and {path} "
                           f"is not one; move it away or give another --workdir")
  check_writable(workdir, files, directories)


def check_writable(workdir: str, files: tuple[str, ...] = (),
                   directories: tuple[str, ...] = ()) -> None:
  """WorkdirError naming the path unless the run can write, for real: a probe file is
  created and removed in `workdir` and in each of its `directories` that is there, and
  each of its `files` that is there is opened for appending (nothing is changed)."""
  for directory in (workdir, *(os.path.join(workdir, name) for name in directories)):
    if os.path.isdir(directory):
      _probe(workdir, directory)
  for name in files:
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
      except OSError as error:
        raise _unwritable(workdir, error, path) from None


def _probe(workdir: str, directory: str) -> None:
  """files.write_probe in `directory`; WorkdirError if it fails."""
  try:
    write_probe(directory)
  except ProbeLeft as error:  # an append-only directory: files go in, none come out
    raise _unwritable(workdir, error, directory, f"; {error.filename} is left there") from None
  except OSError as error:
    raise _unwritable(workdir, error, directory) from None


def _unwritable(workdir: str, error: OSError, path: str | None = None,
                left: str = "") -> WorkdirError:
  where = "" if path in (None, workdir) else f": {path}"
  return WorkdirError(f"workdir {workdir} cannot be written{where} ({error.strerror}{left}); "
                      "make it writable or give a directory you can write to with --workdir")


def unused_path(stem: str, extension: str = "") -> str:
  """stem + extension, or stem.1 + extension, stem.2 + extension, … whichever is free: what
  the runtime sets aside never replaces an earlier copy."""
  path, n = f"{stem}{extension}", 0
  while os.path.exists(path):
    n += 1
    path = f"{stem}.{n}{extension}"
  return path


def _make_directory(workdir: str) -> list[str]:
  """Makes workdir and its missing parents; returns those it created, deepest first."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} is a file, not a directory; give a directory "
                       "(new or of an earlier run of this config) with --workdir")
  missing, path = [], os.path.abspath(workdir)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    missing.append(path)
    path = os.path.dirname(path)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as error:
    _remove_empty(missing)
    raise WorkdirError(f"workdir {workdir} cannot be created ({error.strerror}); give a "
                       "directory you can write to with --workdir") from None
  return missing
