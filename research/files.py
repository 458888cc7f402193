"""Files that runs and sweeps write and read back, written whole or not at all.

Every file the runtime writes and later reads (config.json, final_metrics.json, a sweep's
summaries, an experiment's files and report, generated data, plots) goes through
`atomic_write`; `read_json` names a file cut short, and a set of files written together (a
generated data set) is written and read under `locked`.
"""

import contextlib
import errno
import fcntl
import json
import os
import secrets
import sys
from collections.abc import Iterator
from typing import IO, Any


class UnreadableFile(ValueError):
  """A file that exists but cannot be read back: empty, cut short, not what it should be."""


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_args) -> Iterator[IO]:
  """An open file (mode "w" or "wb") whose content replaces `path` when the block ends
  without an exception; until then `path` is untouched. The new file gets the usual
  permissions (the umask's), not a temporary file's private ones.

  The content is written to a temporary file beside the target, flushed to disk, and renamed
  over it (`os.replace`, atomic on POSIX). A kill or a full disk at any moment leaves the
  previous file or the new one, never a part of one; a failed write removes its temporary.
  """
  path = os.fspath(path)
  directory, name = os.path.split(path)
  temporary = os.path.join(directory, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
  try:
    with open(temporary, mode.replace("w", "x"), **open_args) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException as error:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    if isinstance(error, OSError) and error.filename == temporary:    # say which file
      raise OSError(error.errno, error.strerror, path) from error
    raise


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str, shared: bool = False) -> Iterator[None]:
  """Holds an flock on the lock file at `path` (created if missing, never removed) while the
  block runs: exclusive, or `shared` with other shared holders. When another process holds it,
  says so in one line on stderr ("waiting for <what> (lock <path>)") and waits. A lock file
  removed or replaced meanwhile (someone deleted the folder) is opened again, until the file
  locked is the one at `path`. The kernel releases the lock when its holder dies. A set of
  files written together (a generated data set) is written under it and read under it
  `shared`: no process reads a set another is writing.

  A shared lock in a place this process cannot write (a read-only data directory, where it can
  generate nothing) takes the lock file read-only when it exists, and is held without one when
  it does not. Raises OSError when an exclusive lock's file cannot be created or opened.
  """
  path = os.fspath(path)
  kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
  said = False
  while True:
    handle = _open_lock(path, shared)
    if handle is None:
      yield
      return
    with handle:
      try:
        fcntl.flock(handle, kind | fcntl.LOCK_NB)
      except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
        if not said:
          print(f"waiting for {what} (lock {path})", file=sys.stderr, flush=True)
          said = True
        fcntl.flock(handle, kind)
      try:
        current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
      except FileNotFoundError:
        current = False
      if current:
        yield
        return


def _open_lock(path: str, shared: bool) -> IO | None:
  """The lock file, open for writing (created if missing); for a shared lock where that is
  not allowed, open for reading, or None when it does not exist either."""
  try:
    return open(path, "a", encoding="utf-8")
  except OSError as error:
    if not shared or error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
      raise
  try:
    return open(path, encoding="utf-8")
  except FileNotFoundError:
    return None


class ProbeLeft(OSError):
  """write_probe's file was made but could not be removed (an append-only directory)."""


def write_probe(directory: str | os.PathLike) -> None:
  """Creates and removes a file in `directory`: whether it can be written, for real (the
  filesystem decides, whoever the user is: root passes permission bits, not an immutable
  flag). OSError if the file cannot be made; ProbeLeft, naming it, if it stays there."""
  probe = os.path.join(directory, f".write-probe.{os.getpid()}.{secrets.token_hex(4)}")
  os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
  try:
    os.remove(probe)
  except OSError as error:
    raise ProbeLeft(error.errno, error.strerror, probe) from None


def write_text(path: str | os.PathLike, text: str) -> None:
  """`text` as UTF-8 into `path`, atomically."""
  with atomic_write(path, "w", encoding="utf-8") as f:
    f.write(text)


def write_json(path: str | os.PathLike, value: Any) -> None:
  """`value` as indented JSON into `path`, atomically."""
  write_text(path, json.dumps(value, indent=2) + "\n")


def read_json(path: str | os.PathLike, kind: type = dict) -> Any:
  """The JSON value of `path`, which must be a `kind`.

  Raises FileNotFoundError if there is no such file, UnreadableFile naming the file and
  the fault (empty, cut short or not JSON, not UTF-8, not a `kind`, an OS error): a file cut
  short can still be met (written by an older version, copied by hand), and is named in one
  line for the caller to refuse or recover.
  """
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    raise
  except OSError as error:
    raise UnreadableFile(f"{path} cannot be read ({error.strerror or error})") from None
  if not data.strip():
    raise UnreadableFile(f"{path} is empty")
  try:
    value = json.loads(data.decode("utf-8"))
  except UnicodeDecodeError as error:
    raise UnreadableFile(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})"
                         ) from None
  except json.JSONDecodeError as error:
    raise UnreadableFile(f"{path} is cut short or not JSON ({error.msg}: line {error.lineno} "
                         f"column {error.colno})") from None
  if not isinstance(value, kind):
    raise UnreadableFile(f"{path} holds a JSON {type(value).__name__}, not "
                         f"{'an object' if kind is dict else 'a ' + kind.__name__}")
  return value
