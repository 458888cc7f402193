"""Starting JAX quietly, on the CPU alone where no accelerator is visible.

The compile-only toolchains (the `aot` extra: the CUDA plugin, libtpu) log from C++ to fd 2
on import and when backends start without their chips; `launch.py` (without --verbose) runs
those moments in `held_back()`: fd 2 goes to a file, shown only after a crash (not `OURS`).
"""

import contextlib
import glob
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

  if jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS"):
    return
  if visible_accelerator() == "none":
    jax.config.update("jax_platforms", "cpu")


# The facts JAX's own probe reads (its hardware_utils, JAX 0.10.2; private): an NVIDIA
# driver's device files (/dev/dxg: WSL2), and Google's PCI vendor id with a TPU chip's device
# id (v3 to TPU7x). A chip newer than this list: set JAX_PLATFORMS=tpu.
NVIDIA_DEVICE_FILES = ("dev/nvidia0", "dev/nvidiactl", "dev/dxg")
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")


def visible_accelerator(root: str = "/") -> str:
  """'gpu' (an NVIDIA driver's device file), 'tpu' (a TPU chip on the PCI bus) or 'none', from
  the files under `root` alone: no backend starts, no driver is loaded."""
  if any(os.path.exists(os.path.join(root, path)) for path in NVIDIA_DEVICE_FILES):
    return "gpu"
  for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
    if (_read(vendor) == GOOGLE_PCI_VENDOR
        and _read(os.path.join(os.path.dirname(vendor), "device")) in TPU_PCI_DEVICES):
      return "tpu"
  return "none"


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:     # a device gone while we look
    return ""
