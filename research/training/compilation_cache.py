"""JAX's persistent compilation cache for runs, on by default.

launch.py keeps compiled steps in `DEFAULT_DIRECTORY` (~/.cache/research/jax, or under
$XDG_CACHE_HOME): a resumed run, a second sweep point of the same shapes and a rerun load
their steps from there instead of compiling them, which `perf/compile_seconds` and
`perf/compile_cache_hits` in final_metrics.json show. `--compilation_cache=DIR` moves it,
`--compilation_cache=` switches it off; JAX's own JAX_COMPILATION_CACHE_DIR, when set, is
kept unless the flag is given. JAX's thresholds apply (a program that compiled in under
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, 1 s by default, is not stored).
"""

import os

import jax

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
  where that is set."""
  if not given and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  jax.config.update("jax_compilation_cache_dir", directory or None)
  jax.config.update("jax_enable_compilation_cache", bool(directory))


def hits() -> int:
  """How many compiled programs this process has loaded from the cache so far."""
  return _hits[0]
