"""The workdir: one writer at a time, untouched by a refused run, and names that never
replace what is set aside.

A run holds an exclusive lock on `<workdir>/run.lock`. Until the run marks itself
started (`Lease.start`, once its input is read and its steps compiled), it has written
nothing but the lock: a run refused before that (a bad input file, a step that does not
fit) removes the lock file and the directories it created, leaving the workdir as it
found it, so the corrected command runs there.

The lock is an `fcntl.flock` on an open file, so the operating system releases it when
the process ends in any way (exit, crash, kill -9): a lock left by a dead process is
simply taken over. The file holds the holder's pid, host and start time, which a
second run names when it is refused; a run refused before it starts puts back the bytes it
found there (and their modification time), or removes the file it created. Only process 0
of a multi-host run locks.

A workdir the run cannot write into is refused before anything compiles, every way it can
be so (a read-only or immutable directory, a read-only file the run appends to or replaces,
a read-only checkpoints/): `hold` creates and removes a probe file in the workdir, and
`check_entries` in each directory the run writes that is there already, and opens each
file the run writes that is there already for appending (which changes nothing).
"""

import contextlib
import datetime
import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterator

import jax

from research.errors import WorkdirError
from research.files import ProbeLeft, write_probe

LOCK_FILE = "run.lock"


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
def hold(workdir: str) -> Iterator[Lease]:
  """Creates `workdir` if needed and holds its lock while the block runs; yields a Lease.

  An exception leaving the block before `lease.start()` puts the lock file back as it was
  found (its bytes and modification time; removed where this call created it) and removes
  the directories this call created. Raises WorkdirError if the workdir cannot be created or
  written (a path that is a file, a read-only or immutable location: a probe file is
  created and removed there) or a live process holds it.
  """
  created = _make_directory(workdir)
  lease = Lease()
  with _undone_unless_started(lease, created):
    if jax.process_index() != 0:
      check_writable(workdir)
      yield lease
      return
    path = os.path.join(workdir, LOCK_FILE)
    existed = os.path.exists(path)
    with _locked(workdir, path) as handle:
      found = _contents(handle) if existed else None
      try:
        check_writable(workdir)
        _write_holder(workdir, handle)
        yield lease
      except BaseException:
        if not lease.started:
          _put_back(path, handle, found)
        raise


def _contents(handle) -> tuple[bytes, os.stat_result]:
  """(the bytes, the stat) of the open lock file, as this run found it."""
  stat = os.fstat(handle.fileno())
  handle.seek(0)
  return handle.read(), stat


def _write_holder(workdir: str, handle) -> None:
  """This process's pid, host and start time into the lock file (for a run refused as busy
  to name it)."""
  try:
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}\n".encode())
    handle.flush()
  except OSError as error:
    raise _unwritable(workdir, error) from None


def _put_back(path: str, handle, found: tuple[bytes, os.stat_result] | None) -> None:
  """The lock file as a refused run found it: its bytes and times, or no file where there
  was none (removed while holding it: no other run uses this file)."""
  with contextlib.suppress(OSError):
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
def _locked(workdir: str, path: str):
  """The lock file, open and flock-ed. A holder that removed the file (a refused run) leaves
  a lock on a file no longer in the directory: it is opened again until the file locked is
  the one at `path`."""
  while True:
    try:
      handle = open(path, "a+b")
    except OSError as error:
      raise _unwritable(workdir, error) from None
    with handle:
      try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
        handle.seek(0)
        holder = handle.read().decode(errors="replace").strip() or "another process"
        raise WorkdirError(f"workdir {workdir} is in use by a live run ({holder}); wait for it "
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
