"""Exceptions of the other threads (ours, Orbax's, a data thread's) and unraisable ones (a
finalizer's, such as a file's flush on a full disk): recorded and reported, never swallowed.
The first one ends the run in one line `error: ...` and status 1, every complete checkpoint
kept, whether the main thread is training, blocked or done (`watch`); docs/running.md, "What
a run survives".
"""

import contextlib
import os
import sys
import threading
import traceback

from research.errors import RunFailed

GRACE_SECONDS = 60.0     # how long the main thread may take to reach `raise_if_failed`


class ThreadFailed(RunFailed):
  """An exception ended another thread, or an unraisable one was raised."""


class _Watch:
  """The first failure, and whether the main thread has taken it over (raised or ended)."""

  def __init__(self, verbose: bool):
    self.verbose = verbose
    self.lock = threading.Lock()
    self.failure: str | None = None       # the first failure, in words
    self.taken = False                    # the main thread raised it, or ends with an error
    self.status: int | None = None        # the exit status the main thread ends with
    self.stderr = os.dup(2)               # the terminal's, even while fd 2 is held back

  def thread_exception(self, args) -> None:
    if self.verbose:
      threading.__excepthook__(args)
    if args.exc_type is SystemExit:       # a thread's sys.exit(): not an error to Python
      return
    name = args.thread.name if args.thread is not None else "a thread"
    self.record(f"thread {name!r} failed: {_first_line(args.exc_value)}")

  def unraisable(self, args) -> None:
    if self.verbose:
      sys.__unraisablehook__(args)
    if is_benign(args):
      return
    where = getattr(args.object, "__qualname__", None) or type(args.object).__name__
    where = f" (in {where})" if args.object is not None else ""
    self.record(f"an exception raised where nothing could catch it{where}: "
                f"{_first_line(args.exc_value)}")

  def record(self, failure: str) -> None:
    with self.lock:
      if self.failure is not None:
        return
      self.failure = failure
      main_done = self.status is not None or sys.is_finalizing()
    if main_done:                          # the main thread will not look at it any more
      self.end_process("")
      return
    timer = threading.Timer(GRACE_SECONDS, self.end_process, args=(
        f"; the main thread did not stop within {GRACE_SECONDS:g} s, ending the process "
        "(every complete checkpoint is kept: run the same command again to resume)", False))
    timer.daemon = True
    timer.start()

  def end_process(self, why: str, flush: bool = True) -> None:
    """Prints the failure and ends the process with status 1, unless the main thread has
    taken it over or ended with an error of its own. `flush`: what the main thread printed
    first (not when it may be blocked inside a print, holding the stream's lock)."""
    with self.lock:
      if self.taken:
        return
      self.taken = True
    for stream in (sys.stdout, sys.stderr) if flush else ():
      with contextlib.suppress(Exception):   # closed, or gone while the interpreter finalizes
        stream.flush()
    os.write(self.stderr, f"error: {self.failure}{why}\n".encode())
    os._exit(1)

  def take(self) -> str | None:
    """The failure, now the main thread's to report (None if there is none)."""
    with self.lock:
      if self.failure is None or self.taken:
        return None
      self.taken = True
      return self.failure


_watch: _Watch | None = None     # the hooks are the process's: so is what they record


def watch(verbose: bool) -> None:
  """Installs `threading.excepthook` and `sys.unraisablehook` for the rest of the process
  (launch.py, for the whole command). The first exception that ends a thread other than the
  main one, or the first unraisable one (raised where nothing can catch it: a finalizer), is
  recorded, and the run ends with one line `error: ...` and status 1:

    during training     the loop checks `failed()` at every step and raises `ThreadFailed`
                        (a RunFailed: exit 1) after waiting for a pending save (one that
                        failed says so in its own words instead): the last complete
                        checkpoint is kept and named
    a blocked main      the main thread not there within GRACE_SECONDS (blocked on what the
    thread              failed thread was to deliver, a long evaluation, a compile): the
                        process prints the line and ends itself (`os._exit(1)`) as a kill -9
                        would, which a run survives: every complete checkpoint stays
    after the work      launch.py waits for the other threads (`join_other_threads`, as the
                        interpreter would at exit) and raises what they recorded; once it
                        ends (`ending(status)`), a failure recorded later (a daemon thread,
                        a finalizer at exit) ends the process at once with status 1 if the
                        status was 0, and is not printed if an error was already

  With `verbose` each one also prints its traceback as Python would. One unraisable is
  dropped (`is_benign`)."""
  global _watch
  _watch = _Watch(verbose)
  threading.excepthook = _watch.thread_exception
  sys.unraisablehook = _watch.unraisable


def failed() -> bool:
  """Whether a failure is recorded that the main thread has not raised yet."""
  return _watch is not None and _watch.failure is not None and not _watch.taken


def raise_if_failed(consequence: str) -> None:
  """ThreadFailed('<the failure>; <consequence>') if a failure is recorded."""
  failure = _watch.take() if _watch is not None else None
  if failure is not None:
    raise ThreadFailed(f"{failure}; {consequence}")


def ending(status: int) -> None:
  """The main thread's work is done, the process to exit with `status` (its error line, if
  any, printed). A failure recorded and not raised, or recorded from now on, ends the
  process at once with status 1 if `status` is 0 (and is not printed otherwise)."""
  if _watch is None:
    return
  with _watch.lock:
    _watch.status = status
    _watch.taken = _watch.taken or status != 0
    pending = _watch.failure is not None and not _watch.taken
  if pending:
    _watch.end_process("")


def join_other_threads() -> None:
  """Waits for the threads that are not daemons, as the interpreter does before it exits,
  so that what they raise is recorded while it can still be reported."""
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and not thread.daemon:
      thread.join()


def is_benign(args) -> bool:
  """The one unraisable dropped: RuntimeError('Event loop is closed') whose traceback starts
  in asyncio's call_soon_threadsafe (no Python caller: called by native code), i.e. a
  tensorstore future that completes after the event loop of an abandoned Orbax save (a failed
  one) has closed: the save's failure is reported by the loop, and the callback has nothing
  left to run."""
  tb = args.exc_traceback
  return (args.exc_type is RuntimeError and str(args.exc_value) == "Event loop is closed"
          and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"
          and tb.tb_frame.f_code.co_filename.endswith(os.path.join("asyncio", "base_events.py")))


def _first_line(error: BaseException) -> str:
  """'Type: the first line of its message'."""
  lines = traceback.format_exception_only(type(error), error)
  return lines[-1].strip().splitlines()[0][:300] if lines else type(error).__name__
