"""Starting JAX quietly, on the CPU alone where no accelerator is visible.

The compile-only toolchains (the `aot` extra: the CUDA plugin, libtpu) log from C++ to fd 2
on import and when backends start without their chips; `launch.py` (without --verbose) runs
those moments in `held_back()`: fd 2 goes to a file, shown only after a crash (not `OURS`).
`import research` runs `start_quietly()`: without a GPU, the CUDA plugin's notices dropped.
"""

import contextlib
import glob
import importlib.util
import logging
import os
import re
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


# The CUDA plugin's packages (the `aot` extra installs the first), whose libraries log when
# they load without an NVIDIA driver, and what they log then: a line from each library
# (cudart_stub.cc, each after absl's line about logging before InitializeLog) and, where
# JAX's platforms include CUDA, the plugin's "Jax plugin configuration error" traceback.
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
NO_DRIVER_NOTICE = re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your "
                              r"machine, GPU will not be used\.$")
ABSL_PREAMBLE = ("WARNING: All log messages before absl::InitializeLog() is called are "
                 "written to STDERR")


def start_quietly() -> None:
  """Where a CUDA plugin is installed but no NVIDIA GPU is visible (`cuda_notices_expected`)
  and JAX's backends have not started: JAX is imported, set to the CPU alone unless a TPU is
  visible or the platforms are chosen (`cpu_unless_accelerators`), and its plugins registered
  with fd 2 held back; what was held is then written back without the CUDA plugin's notices
  that it found no GPU (`without_cuda_notices`; its traceback, `_CudaPluginErrors`). The
  plugin stays registered: `research.aot` compiles for GPUs with it. With a visible GPU, JAX
  is left as it is. `research/__init__.py` calls it: every entry point imports `research`."""
  if not cuda_notices_expected():
    return
  plugin_errors = _CudaPluginErrors()
  with held_back() as held:
    # JAX imported here, its plugins' logs held back (no public call registers the plugins)
    from jax._src import xla_bridge  # noqa: PLC0415

    # What the backends' start does first (JAX 0.10.2's; a JAX without it: that start logs)
    register = getattr(xla_bridge, "_discover_and_register_pjrt_plugins", None)
    if not xla_bridge.backends_are_initialized():     # else nothing is left that logs
      cpu_unless_accelerators()
      logger = logging.getLogger(xla_bridge.__name__)
      logger.addFilter(plugin_errors)
      try:
        if register:
          register()
      finally:
        logger.removeFilter(plugin_errors)
  sys.stderr.write(without_cuda_notices(held.text))
  sys.stderr.flush()


def cuda_notices_expected(root: str = "/", platforms: str | None = None) -> bool:
  """Whether the CUDA plugin would log that it finds no GPU: one is installed and no NVIDIA
  GPU is visible under `root` (`visible_accelerator`), and the `platforms` chosen (by default
  JAX_PLATFORMS, or jax.config's where JAX is imported) do not name CUDA: who asks for it
  sees why it fails."""
  if platforms is None:
    jax = sys.modules.get("jax")
    platforms = (jax.config.jax_platforms if jax else os.environ.get("JAX_PLATFORMS")) or ""
  if any(name in platforms for name in ("cuda", "gpu")) or visible_accelerator(root) == "gpu":
    return False
  return any(importlib.util.find_spec(name) for name in CUDA_PLUGINS)


def without_cuda_notices(text: str) -> str:
  """`text` without the CUDA plugin's notices that it found no NVIDIA driver: each
  cudart_stub line, and absl's preamble line just before one."""
  lines = text.splitlines(keepends=True)
  notice = [bool(NO_DRIVER_NOTICE.search(line.rstrip("\r\n"))) for line in lines]
  return "".join(line for index, line in enumerate(lines)
                 if not notice[index]
                 and not (line.rstrip("\r\n") == ABSL_PREAMBLE and index + 1 < len(lines)
                          and notice[index + 1]))


class _CudaPluginErrors(logging.Filter):
  """Drops JAX's "Jax plugin configuration error" record of a CUDA plugin (its traceback:
  "Unable to load CUDA. Is it installed?"), logged where the platforms include CUDA."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.getMessage().startswith("Jax plugin configuration error")
                and "cuda" in record.getMessage())
