"""Starting JAX quietly, on the CPU alone where no accelerator is visible.

A JAX with compile-only toolchains installed (the `aot` extra: the CUDA plugin, libtpu)
logs from C++ to file descriptor 2 when it is imported and when its backends start on a
machine without those accelerators ("Could not find cuda drivers", "could not determine
TPU accelerator type"). `launch.py` promises one line per user error, so without
`--verbose` it runs those two moments inside `held_back()`: what is written to fd 2 goes
to a temporary file, shown only if the block ends in a crash (an exception that is none of
our one-line errors, `OURS`: then the logs may say why).
"""

import contextlib
import os
import sys
import tempfile

from research.errors import RunFailed, UserError

# Exceptions that say everything in one line of ours (a user's error, a failed run, an exit
# with its message, Ctrl-C): the libraries' held-back logs stay held back.
OURS = (UserError, RunFailed, SystemExit, KeyboardInterrupt)


class HeldBack:
  text: str = ""        # what was written to fd 2 inside the block


@contextlib.contextmanager
def held_back(active: bool = True):
  """fd 2 into a temporary file while the block runs (when `active`); yields a HeldBack
  whose `text` holds it afterwards. An exception in the block shows it at once, unless it
  is one of `OURS`."""
  held = HeldBack()
  if not active:
    yield held
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as log:
    os.dup2(log.fileno(), 2)
    try:
      yield held
    except BaseException as error:
      _restore(saved, log, held)
      if not isinstance(error, OURS):
        sys.stderr.write(held.text)
      raise
    _restore(saved, log, held)


def _restore(saved: int, log, held: HeldBack) -> None:
  sys.stderr.flush()
  os.dup2(saved, 2)
  os.close(saved)
  log.seek(0)
  held.text = log.read().decode("utf-8", "replace")


def cpu_unless_accelerators() -> None:
  """Where no NVIDIA GPU or TPU chip is visible and JAX_PLATFORMS is not set, JAX starts the
  CPU alone: the compile-only toolchains (the CUDA plugin, libtpu) then register their
  compilers (what `research.aot` compiles with) without probing for devices that are not
  there. Call before JAX's backends start."""
  import jax  # noqa: PLC0415 - this module imports nothing of JAX at import
  from jax._src import hardware_utils  # noqa: PLC0415 - JAX's own probe, starts nothing

  if jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS"):
    return
  if not (hardware_utils.has_visible_nvidia_gpu()
          or hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0):
    jax.config.update("jax_platforms", "cpu")
