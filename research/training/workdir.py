"""The workdir: one writer at a time, and names that never replace what is set aside.

A run holds an exclusive lock on `<workdir>/run.lock`.

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

import jax

from research.errors import WorkdirError

LOCK_FILE = "run.lock"


@contextlib.contextmanager
def hold(workdir: str):
  """Creates `workdir` if needed and holds its lock while the block runs.

  Raises WorkdirError if the workdir cannot be created or written (a path that is a
  file, a read-only location) or a live process holds it.
  """
  _make_directory(workdir)
  if jax.process_index() != 0:
    yield
    return
  path = os.path.join(workdir, LOCK_FILE)
  try:
    handle = open(path, "a+", encoding="utf-8")
  except OSError as error:
    raise WorkdirError(f"workdir {workdir} cannot be written ({error.strerror}); give a "
                       "directory you can write to with --workdir") from None
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
      handle.seek(0)
      handle.truncate()
      handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                   f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}\n")
      handle.flush()
    except OSError as error:
      raise WorkdirError(f"workdir {workdir} cannot be written ({error.strerror}); give a "
                         "directory you can write to with --workdir") from None
    yield


def unused_path(stem: str, extension: str = "") -> str:
  """stem + extension, or stem.1 + extension, stem.2 + extension, … whichever is free: what
  the runtime sets aside never replaces an earlier copy."""
  path, n = f"{stem}{extension}", 0
  while os.path.exists(path):
    n += 1
    path = f"{stem}.{n}{extension}"
  return path


def _make_directory(workdir: str) -> None:
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} is a file, not a directory; give a directory "
                       "(new or of an earlier run of this config) with --workdir")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as error:
    raise WorkdirError(f"workdir {workdir} cannot be created ({error.strerror}); give a "
                       "directory you can write to with --workdir") from None
