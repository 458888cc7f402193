"""Errors a user can cause, raised before anything is compiled where possible.

Each message names the thing at fault (a config key, a file and line, a workdir) and
what is allowed. `launch.py` prints a `UserError` as one line `error: ...` and exits
with status 2 (`--verbose` shows the traceback); `RunFailed` ends a run that had
started (status 1) and says which checkpoint is kept.
"""


class UserError(Exception):
  """A problem the user can fix: bad configuration, input file or workdir."""


class ConfigError(UserError, ValueError):
  """A bad configuration value or config file."""


class InputError(UserError, ValueError):
  """Input the user supplied is malformed: a data file (the message names the file and line) or
  raw input handed to a restored run (research/predict: it names the offending part)."""


class WorkdirError(UserError):
  """The workdir cannot be used: not writable, not a directory, or held by a live run."""


class CheckpointMismatchError(UserError):
  """A readable checkpoint whose parameter tree differs from the model's."""


class RunFailed(Exception):
  """A started run cannot go on (a non-finite loss, a failed save)."""


def excerpt(text: str, limit: int = 60) -> str:
  """repr(text) for a message; a longer text keeps its two ends (limit characters in all)
  and says how long it is."""
  if len(text) <= limit:
    return repr(text)
  return f"{text[:limit // 2]!r}…{text[-limit // 2:]!r} ({len(text)} characters)"


def first_line(error: BaseException, limit: int = 240) -> str:
  """'Type: the first line of its message', the type once though wrappers repeat it; a longer
  line keeps its two ends, since an OS's reason ('File too large') comes last, after a path."""
  name, text = type(error).__name__, str(error).strip().splitlines()
  line = text[0] if text else ""
  line = line if len(line) <= limit else f"{line[:limit // 3]} … {line[-2 * limit // 3:]}"
  return line if line.startswith(name) else f"{name}: {line}".rstrip(": ")


def check_positive(name: str, value, kind: type = int) -> None:
  """ValueError 'NAME must be a positive int' (kind int) or '… a positive number' (kind
  float: an int or a float) unless value is one; a bool is neither."""
  allowed = (int,) if kind is int else (int, float)
  if not isinstance(value, allowed) or isinstance(value, bool) or not value > 0:
    raise ValueError(f"{name} must be a positive {'int' if kind is int else 'number'}, "
                     f"got {value!r}")


def check_choice(name: str, value, allowed) -> None:
  """ValueError 'NAME must be one of ALLOWED, got VALUE' unless value is one of `allowed`."""
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
