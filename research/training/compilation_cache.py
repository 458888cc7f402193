"""JAX's persistent compilation cache for runs, on by default.

launch.py keeps compiled steps in `DEFAULT_DIRECTORY` (~/.cache/research/jax, or under
$XDG_CACHE_HOME): a resumed run, a second sweep point of the same shapes and a rerun load
their steps from there instead of compiling them, which `perf/compile_seconds` and
`perf/compile_cache_hits` in final_metrics.json show. `--compilation_cache=DIR` moves it,
`--compilation_cache=` switches it off; JAX's own JAX_COMPILATION_CACHE_DIR, when set, is
kept unless the flag is given. JAX's thresholds apply (a program that compiled in under
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, 1 s by default, is not stored).

A cache directory given (the flag, or JAX_COMPILATION_CACHE_DIR) that is not a directory or
cannot be written (a probe file is created and removed there; a missing directory is made)
is refused with a ConfigError naming the flag (or the variable) and the path, before
anything compiles: JAX would print a warning and run without the cache. The default, where
it cannot be made or written (a read-only home), leaves the cache off without a word.
"""

import os

import jax

from research.errors import ConfigError
from research.files import write_probe

DEFAULT_DIRECTORY = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                 os.path.join(os.path.expanduser("~"), ".cache"),
                                 "research", "jax")
HIT_EVENT = "/jax/compilation_cache/cache_hits"   # what jax.monitoring records per hit
_hits = [0]


def _count(event: str, **kwargs) -> None:
  del kwargs
  if event == HIT_EVENT:
    _hits[0] += 1


jax.monitoring.register_event_listener(_count)


def enable(directory: str, given: bool = True) -> None:
  """Caches compiled programs in `directory` ("" switches the cache off). A `directory`
  that was not `given` (launch.py's default) leaves JAX_COMPILATION_CACHE_DIR in charge
  where that is set. ConfigError for a directory given (the flag, the variable) that is not
  one or cannot be written; the default in that case switches the cache off."""
  variable = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if not given and variable:
    check_directory(variable, "JAX_COMPILATION_CACHE_DIR")
    return
  if directory and not given and unusable(directory):
    directory = ""
  elif directory:
    check_directory(directory, "--compilation_cache")
  jax.config.update("jax_compilation_cache_dir", directory or None)
  jax.config.update("jax_enable_compilation_cache", bool(directory))


def check_directory(directory: str, name: str) -> None:
  """ConfigError naming `name` and the path unless `directory` is (or can be made) a
  directory this process can write into."""
  reason = unusable(directory)
  if reason:
    raise ConfigError(f"{name}={directory}: {reason}; give a directory you can write to, or "
                      "--compilation_cache= to run without the cache")


def unusable(directory: str) -> str | None:
  """Why `directory` cannot hold the cache (not a directory, cannot be made or written),
  None where it can: it is made if missing, and a probe file created and removed in it."""
  if os.path.exists(directory) and not os.path.isdir(directory):
    return "not a directory"
  try:
    os.makedirs(directory, exist_ok=True)
    write_probe(directory)
  except OSError as error:
    return f"cannot be written ({error.strerror or error})"
  return None


def hits() -> int:
  """How many compiled programs this process has loaded from the cache so far."""
  return _hits[0]
