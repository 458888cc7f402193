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
second run names when it is refused. Only process 0 of a multi-host run locks.
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

  An exception leaving the block before `lease.start()` removes the lock file (unless an
  earlier run left it) and the directories this call created. Raises WorkdirError if the
  workdir cannot be created or written (a path that is a file, a read-only location) or
  a live process holds it.
  """
  created = _make_directory(workdir)
  lease = Lease()
  with _undone_unless_started(lease, created):
    if jax.process_index() != 0:
      yield lease
      return
    path = os.path.join(workdir, LOCK_FILE)
    existed = os.path.exists(path)
    with _locked(workdir, path) as handle:
      try:
        try:
          handle.seek(0)
          handle.truncate()
          handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                       f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}\n")
          handle.flush()
        except OSError as error:
          raise _unwritable(workdir, error) from None
        yield lease
      except BaseException:
        if not lease.started and not existed:
          with contextlib.suppress(OSError):
            os.remove(path)              # while holding it: no other run uses this file
        raise


@contextlib.contextmanager
def _locked(workdir: str, path: str):
  """The lock file, open and flock-ed. A holder that removed the file (a refused run) leaves
  a lock on a file no longer in the directory: it is opened again until the file locked is
  the one at `path`."""
  while True:
    try:
      handle = open(path, "a+", encoding="utf-8")
    except OSError as error:
      raise _unwritable(workdir, error) from None
    with handle:
      try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
        handle.seek(0)
        holder = handle.read().strip() or "another process"
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


def _unwritable(workdir: str, error: OSError) -> WorkdirError:
  return WorkdirError(f"workdir {workdir} cannot be written ({error.strerror}); give a "
                      "directory you can write to with --workdir")


def check_entries(workdir: str, files: tuple[str, ...], directories: tuple[str, ...]) -> None:
  """WorkdirError if one of the names the run writes as a file is a directory there, or
  one it writes as a directory is something else."""
  for names, wrong, kind in ((files, os.path.isdir, "a file"),
                             (directories, os.path.isfile, "a directory")):
    for name in names:
      path = os.path.join(workdir, name)
      if wrong(path):
        raise WorkdirError(f"workdir {workdir}: the run writes {kind} {name} there, and {path} "
                           f"is not one; move it away or give another --workdir")


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
