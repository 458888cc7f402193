"""launch.py's command as a process: its flags read by absl (the config's keys each a flag,
checked by our rules), its work done with every error one line `error: ...` and an exit
status, and the other threads' failures recorded and reported, never swallowed
(docs/running.md, "Exit statuses" and "What a run survives").
"""

import contextlib
import logging as python_logging
import os
import re
import signal
import sys
import threading
import types
import warnings
from collections.abc import Callable
from typing import NamedTuple

import ml_collections
from absl import flags, logging

from research.aot import targets
from research.errors import ConfigError, RunFailed, UserError, first_line
from research.training.config import (
  apply_overrides,
  check_key,
  get,
  leaves_of,
  load_config,
  parse_value,
)
from research.training.workdir import latest_checkpoint

GRACE_SECONDS = 60.0     # how long the main thread may take to reach `raise_if_failed`


class Stopped(Exception):
  """SIGINT (Ctrl-C) or SIGTERM arrived; a checkpoint of the current step was written."""

  def __init__(self, signum: int, step: int, directory: str):
    self.signum = signum
    super().__init__(f"{signal.Signals(signum).name} at step {step}: checkpoint saved in "
                     f"{directory}; run the same command again to resume")


class Interrupted(Stopped):
  """Ctrl-C ended the run without a checkpoint of the step it reached: a second Ctrl-C while
  the first one's checkpoint was written, or one before the loop (compiling, restoring) or
  between a sweep's points. The message names the latest checkpoint saved under the workdir
  (`latest_checkpoint`), read once the run has let go of its files, or says there is none."""

  def __init__(self, workdir: str):
    self.signum = signal.SIGINT
    latest = latest_checkpoint(workdir)
    Exception.__init__(self, (
        f"interrupted (Ctrl-C): no checkpoint saved in {workdir}; run the same command again "
        "to start" if latest is None else
        f"interrupted (Ctrl-C): the latest saved checkpoint is step {latest[1]} in "
        f"{latest[0]}; run the same command again to resume from it"))


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
    self.record(f"thread {name!r} failed: {first_line(args.exc_value)}")

  def unraisable(self, args) -> None:
    if self.verbose:
      sys.__unraisablehook__(args)
    if is_benign(args):
      return
    where = getattr(args.object, "__qualname__", None) or type(args.object).__name__
    where = f" (in {where})" if args.object is not None else ""
    self.record(f"an exception raised where nothing could catch it{where}: "
                f"{first_line(args.exc_value)}")

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


# launch.py's command line, read by absl ---------------------------------------------------

# launch.py's flags that take a value, and the refusal of one given none (empty, or another
# flag: absl takes the next argument, and `--workdir --sweep` trained into "--sweep").
VALUE_REFUSALS = {
    "config": "--config needs a config file: --config=experiments/NAME.py[:ARGS]",
    "workdir": "--workdir needs a directory: --workdir=DIR (without the flag: a new one under "
               "runs/)",
    "compile_only": f"--compile_only needs a target: --compile_only=TARGET, one of: "
                    f"{', '.join(targets.TARGETS)}",
    "step": "--step needs a checkpoint's step: --step=N (without the flag: the latest)"}
SWEEP_ONLY = ("workers", "shard")   # the flags of a sweep's training
CHECKPOINT_VERBS = {"eval_only": "evaluate", "export": "export"}   # they act on --workdir's run
FLAG_LIKE = re.compile(r"^--?[A-Za-z]")   # a value absl took from the next argument, a flag


class Command(NamedTuple):
  """What launch.py is asked to do: `mode` train, compile (for `target`), eval_only or export;
  the config and its module (None for eval_only and export, which read the run's)."""
  mode: str
  config: ml_collections.ConfigDict | None = None
  module: types.ModuleType | None = None
  target: str | None = None


def parse(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> Command:
  """The command argv asks for, every flag read by absl: launch.py's own, then the config's
  keys (`read_overrides`; none with --eval_only or --export, which take the run's own
  config). ConfigError, before anything is compiled, for a flag without its value, what does
  not go with --eval_only or --export, an unknown target, an argument that is no flag."""
  flag_values.unparse_flags()
  left = _absl(flag_values, argv, known_only=True)
  for name, refusal in VALUE_REFUSALS.items():
    value = flag_values[name].value
    if flag_values[name].present and isinstance(value, str) and (
        not value.strip() or FLAG_LIKE.match(value)):
      raise ConfigError(refusal)
  for name in SWEEP_ONLY:
    if flag_values[name].present and not (flag_values.sweep and flag_values.compile_only is None):
      raise ConfigError(f"--{name} goes with --sweep, training a sweep's points")
  mode = _checkpoint_mode(flag_values, left)
  if mode is not None:
    _check_no_arguments(_absl(flags.FlagValues(), left))
    return Command(mode)
  target = flag_values.compile_only
  config, module = load_config(flag_values.config)
  config, left = read_overrides(config, left)
  _check_no_arguments(left)
  return Command("train" if target is None else "compile", config, module,
                 None if target is None else target_name(target))


def target_name(text: str) -> str:
  """The target `text` names (case and surrounding spaces aside); ConfigError listing the
  targets otherwise."""
  try:
    return targets.name_of(text)
  except ValueError as error:
    raise ConfigError(f"--compile_only: {error}") from None


def _checkpoint_mode(flag_values: flags.FlagValues, left: list[str]) -> str | None:
  """The flag of CHECKPOINT_VERBS given (--eval_only, --export), None for neither;
  ConfigError for both, for what does not go with one (--sweep, --compile_only, --config and
  overrides: it reads the run's own config; no --workdir), and for --step without one."""
  given = [name for name in CHECKPOINT_VERBS if flag_values[name].value]
  if not given:
    if flag_values["step"].present:
      raise ConfigError("--step goes with --eval_only or --export: --workdir DIR --eval_only "
                        "--step=N evaluates the checkpoint of step N, --export --step=N "
                        "exports it")
    return None
  flag, verb = given[0], CHECKPOINT_VERBS[given[0]]
  configs = ["--config"] * flag_values["config"].present + [
      "--" + arg.lstrip("-").partition("=")[0] for arg in left[1:]
      if arg.lstrip("-").startswith(("config.", "noconfig."))]
  for given_too, refusal in (
      (len(given) > 1, f"--{given[-1]}: {verb} and {CHECKPOINT_VERBS[given[-1]]} in two "
                       "commands"),
      (flag_values.sweep, f"--sweep: {verb} each point's workdir"),
      (flag_values["compile_only"].present, "--compile_only"),
      (configs, f"{configs[0] if configs else ''}: it takes the run's own config (its "
                "config.json)")):
    if given_too:
      raise ConfigError(f"--{flag} does not go with {refusal}")
  if flag_values.workdir is None:
    raise ConfigError(f"--{flag} needs --workdir=DIR, the workdir of the run to {verb}")
  return flag


def read_overrides(config, argv: list[str]) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(config with argv's overrides set, what is left: argv[0] and the arguments that are no
  flag). Each key of config is a flag `config.KEY` that absl reads in every spelling it
  takes (`-` or `--`, `=VALUE` or the next argument, `--noconfig.KEY` for a bool's False,
  the last counting), its value parsed and checked by config.parse_value: ConfigError
  naming the key and what is allowed (an unknown key, a wrong type, no value)."""
  values = flags.FlagValues()
  for key, default in leaves_of(config, sequences=False):
    flag = (flags.BooleanFlag(f"config.{key}", None, "") if isinstance(default, bool) else
            flags.Flag(None, None, f"config.{key}", None, ""))
    flag.parser = _Override(config, key)
    flags.DEFINE_flag(flag, values)
  try:
    left = _absl(values, argv)
  except UnknownFlag as error:
    negated, dot, key = error.name.rpartition("config.")
    if negated not in ("", "no") or not dot:
      raise
    check_key(config, key)                    # unknown, renamed, or a group: it says which
    raise ConfigError(f"--noconfig.{key} sets a bool key to False and takes no value; "
                      f"config.{key} is {get(config, key)!r}: write --config.{key}=VALUE"
                      ) from None
  overrides = {name.partition(".")[2]: values[name].value for name in values
               if values[name].present}
  return apply_overrides(config, overrides), left


class _Override(flags.ArgumentParser):
  """config.KEY's value from the command line: of its default's type (config.parse_value);
  a value like a flag is none (absl took the next argument: `--config.KEY --sweep`)."""

  def __init__(self, config, key: str):
    self.config, self.key = config, key

  def parse(self, argument):
    if isinstance(argument, str) and FLAG_LIKE.match(argument):
      raise ConfigError(f"--config.{self.key} needs a value: --config.{self.key}=VALUE")
    return parse_value(self.config, self.key, argument)


class UnknownFlag(ConfigError):
  """A flag absl does not know (`name`: as written, without its dashes), or a bool's
  `--noNAME=VALUE`; its message absl's."""

  def __init__(self, message: str, name: str):
    super().__init__(message)
    self.name = name


def _absl(flag_values: flags.FlagValues, argv: list[str], known_only: bool = False):
  """absl's parse of argv into flag_values; what it leaves. A value our parsers refuse is
  their ConfigError; a missing value our refusal (VALUE_REFUSALS) or `--NAME needs a value`;
  absl's other refusals ConfigError in its words (one line, status 2, like a bad value)."""
  try:
    return flag_values(argv, known_only=known_only)
  except flags.IllegalFlagValueError as error:
    if isinstance(error.__context__, UserError):
      raise error.__context__ from None
    raise ConfigError(str(error)) from None
  except flags.UnrecognizedFlagError as error:
    raise UnknownFlag(str(error), error.flagname) from None
  except flags.Error as error:
    missing = re.match(r"Missing value for flag -+(\S+)", str(error))
    if missing is None:
      raise ConfigError(str(error)) from None
    raise ConfigError(VALUE_REFUSALS.get(
        missing[1], f"--{missing[1]} needs a value: --{missing[1]}=VALUE")) from None
  except ValueError as error:                 # absl's refusal of a bool's `--noNAME=VALUE`
    negated = re.match(r"-+(no[^=]+)=.* does not take an argument$", str(error))
    if negated is None:
      raise
    raise UnknownFlag(str(error), negated[1]) from None


def _check_no_arguments(left: list[str]) -> None:
  """ConfigError for an argument that is not a flag (absl leaves them to the program; a
  config file given without --config trained the default experiment)."""
  if left[1:]:
    hint = (f"; for a config file write --config={left[1]}"
            if left[1].partition(":")[0].endswith(".py") else "")
    raise ConfigError(f"unexpected argument {left[1]!r}: launch.py takes flags only "
                      f"(--config FILE[:ARGS], --config.KEY=VALUE, --workdir DIR, --sweep, "
                      f"--workers N, --shard I/N, --compile_only=TARGET, --eval_only, --export, "
                      f"--step N, --verbose){hint}")


# The command's work, and how it ends ------------------------------------------------------

TRAINING = {}   # "workdir": where this command trains, once known (what a Ctrl-C reports)
ORBAX = f"{os.sep}orbax{os.sep}"         # in the path of Orbax's modules
ORBAX_TEMPORARY = ".orbax-checkpoint-tmp"  # in the path of a save Orbax has not finished


def run(work: Callable[[], None], verbose: bool, _argv: list[str] | None = None) -> None:
  """Does the command's `work`, the other threads watched; ends the process as `ended`
  says, or with status 0 (unless another thread failed: `ending`). (`_argv`: what absl's
  app.run passes its main.)"""
  watch(verbose)
  if not verbose:
    quiet_libraries()
  with ended(verbose):
    work()
    join_other_threads()
    raise_if_failed("after the command's work was done (what it wrote is complete)")
  ending(0)


@contextlib.contextmanager
def ended(verbose: bool):
  """Ends the process on the block's error in one line (with --verbose, its traceback
  first): a UserError `error: ...` status 2, RunFailed status 1, Ctrl-C 130 (a second one,
  or one outside the loop, at once), a SIGTERM's stop 0."""
  try:
    yield
  except UserError as error:
    fail(2, f"error: {error}", verbose)
  except RunFailed as error:
    fail(1, f"error: {error}", verbose)
  except Interrupted as error:
    ignore_interrupts()
    end_at_once(130, str(error))
  except Stopped as error:
    ignore_interrupts()
    status = 130 if error.signum == signal.SIGINT else 0
    ending(status)
    print(str(error), file=sys.stderr)
    sys.exit(status)
  except KeyboardInterrupt:
    ignore_interrupts()
    fail(130, str(Interrupted(TRAINING["workdir"])) if "workdir" in TRAINING else
         "interrupted (Ctrl-C): nothing to save", verbose)


def fail(status: int, message: str, verbose: bool):
  """Ends the program with `message` on stderr; with --verbose, the traceback first."""
  ending(status)
  if verbose and sys.exc_info()[0] is not None:
    raise   # noqa: PLE0704 - re-raises the exception being handled, with its traceback
  print(message, file=sys.stderr, flush=True)
  sys.exit(status)


def end_at_once(status: int, message: str) -> None:
  """Prints `message` and ends the process without waiting for the libraries' threads (a
  checkpoint write a second Ctrl-C cut short: what it wrote is under a temporary name, never
  read as a checkpoint), as the user asked by pressing Ctrl-C again."""
  ending(status)
  print(message, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)


def ignore_interrupts() -> None:
  """Ctrl-C from now on changes nothing: the command is reporting how it ended (main
  thread only, where handlers are set)."""
  with contextlib.suppress(ValueError):
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def quiet_libraries() -> None:
  """No INFO logs, and not Orbax's ERROR logs, which tell what failed inside a save while
  the save's exception reaches the loop, reported once; nor asyncio's "exception was never
  retrieved" for the tasks of a failed save (logged when collected, after the report)."""
  logging.set_verbosity(logging.WARNING)                  # Orbax logs every save at INFO
  logging.get_absl_handler().addFilter(
      lambda record: record.levelno < python_logging.ERROR or not (
          ORBAX in record.pathname or (record.name == "asyncio" and any(
              mark in record.getMessage() for mark in (ORBAX, ORBAX_TEMPORARY)))))


@contextlib.contextmanager
def warnings_as_lines(category: type[Warning]):
  """Warnings of `category` as one line `warning: ...` each, as they come, on stderr as it
  is when the block starts (a `jax_start.held_back` inside it holds back the libraries'
  logs, not these); other warnings as Python shows them."""
  shown = warnings.showwarning
  sys.stderr.flush()
  stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", encoding="utf-8")

  def show(message, warned, filename, lineno, file=None, line=None):
    if issubclass(warned, category):
      print(f"warning: {message}", file=stream, flush=True)
    else:
      shown(message, warned, filename, lineno, file, line)

  warnings.showwarning = show
  try:
    yield
  finally:
    warnings.showwarning = shown
    stream.close()
