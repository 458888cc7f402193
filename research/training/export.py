"""A run's model for use without this package, `launch.py --workdir DIR --export [--step N]`:
`export_run` writes the parameters (safetensors) and the experiment's inference function
serialized by `jax.export` for CPU, CUDA and TPU into DIR/export_step_<step>/, with what
calling it takes, replacing an export there only once the new one is complete (a kill leaves
the old or the new one). docs/trained_runs.md, "Export the model".
"""

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import numpy as np
from safetensors.numpy import save_file

from research.attention.platforms import UNSTABLE_CUSTOM_CALLS, export_checks_to_disable
from research.errors import ConfigError, WorkdirError
from research.training.checkpoints import leaves_by_path
from research.training.run import restore, writable

DIRECTORY = "export_step_{step}"
PARAMS, EXPORTED, METADATA = "params.safetensors", "inference.jax_exported", "metadata.json"
EXPORTED_IN = "inference.{}.jax_exported"     # a second program: its platforms in its name
PLATFORMS = ("cpu", "cuda", "tpu")
BATCH = "b"                      # the symbolic batch size of every input
OLD = ".old"                     # an old export set aside, where no exchange is possible
# What a killed export leaves: its temporary (mkdtemp's 8 characters), or the old one aside.
LEFTOVER = re.compile(r"\.export_step_\d+\.[a-z0-9_]{8}(\.old)?")
AT_FDCWD, RENAME_EXCHANGE = -100, 2              # <fcntl.h>, <linux/fs.h>


class Program(NamedTuple):
  """The inference function exported for some platforms, with one batch size."""
  exported: jax.export.Exported
  batch: int | None              # the inputs' batch size; None: any (symbolic)
  file: str                      # its file in the export's directory


def export_run(workdir: str, step: int | None = None, platforms: tuple[str, ...] = PLATFORMS
               ) -> tuple[str, dict]:
  """(the directory written, its metadata.json) for the run in `workdir` at the checkpoint of
  `step` (None: the latest that reads), its inference function exported for `platforms`
  (those whose lowering works; the first must).

  Restores the run (research.training.run.restore: its own config.json and the checkpoint of
  `step`) and writes workdir/export_step_<step>/:

    params.safetensors      the parameters alone (no optimizer state), float32 as the
                            checkpoint holds them, each named by its path in the tree
                            ("encoder/embed/embedding"); the file's metadata: experiment, step
    inference.jax_exported  the experiment's inference function (Experiment.inference:
                            nmt_dates' greedy decoding, char_lm's next-byte logits, listops'
                            class logits, sequence_tasks' outputs, kernel_regression's
                            estimates) serialized by `jax.export` for CPU, CUDA and TPU in one
                            program, the parameters inside it as constants and the batch axis
                            of every input symbolic (any size; see `export_programs` for the
                            platforms that cannot)
    metadata.json           experiment, step, config; the inputs and outputs in call order
                            (name, shape with "b" for the batch, dtype, meaning) and what
                            making the inputs and reading the outputs needs (`about`:
                            vocabularies, token ids, kernels); the platforms, and those left
                            out with the first line of their error (`not_exported`); jax's
                            version; each program's file, platforms, batch ("any" or its size)
                            and custom calls, and those among them without jax.export's
                            compatibility guarantee (kernels such as cuDNN's flash attention or
                            XLA's Triton calls, whose interface may change: another jax may
                            refuse to run them)

  A Python process with jax and flatbuffers (which jax.export's deserialization imports), and
  not this package, runs it:

      import jax, numpy as np
      with open("export_step_1000/inference.jax_exported", "rb") as f:
        exported = jax.export.deserialize(f.read())
      outputs = exported.call(source, source_lengths)     # {"tokens": ..., "attention": ...}

  The parameters are constants of the program: calling it needs neither params.safetensors
  (which serves other tools) nor the parameter tree's structure.

  Nothing else in the workdir is written, and the run's lock is not taken (a live run's
  workdir exports too, at its latest complete checkpoint that reads). An export_step_<step>
  there already is replaced whole once the new one is complete (`publish`), under the
  workdir's export lock (`exporting`), after removing what dead exports left
  (`remove_dead_exports`).

  Refused in one line with nothing written, before anything is compiled (a
  research.errors.UserError): what restore refuses (a config.json today's checks refuse
  included); an experiment registered without `inference`; a workdir that cannot be written,
  or whose export_step_<step> is not a directory; a workdir another live export holds.
  """
  run = restore(workdir, step)
  if run.experiment.inference is None:
    raise ConfigError(f"workdir {workdir} holds a run of the experiment {run.experiment.name!r}, "
                      "registered without inference: register it with one to export its runs")
  directory = os.path.join(workdir, DIRECTORY.format(step=run.step))
  writable(workdir, directory, "directory")
  with exporting(workdir):
    inference = run.experiment.inference(run.config, run.model, run.extras)
    params = jax.device_get(run.params)
    programs, failures = export_programs(inference, params, platforms,
                                         run.config.train.batch_size)
    first = programs[0].exported
    metadata = {
        "experiment": run.experiment.name, "step": run.step, "config": run.config.to_dict(),
        "inputs": [_described(name, aval, meaning) for (name, (_, meaning)), aval
                   in zip(inference.inputs.items(), first.in_avals, strict=True)],
        "outputs": [_described(name, aval, inference.outputs[name]) for name, aval
                    in zip(_output_names(first), first.out_avals, strict=True)],
        "about": inference.about,
        "platforms": [p for p in platforms if p not in failures], "not_exported": failures,
        "programs": [_program(program) for program in programs],
        "params": PARAMS, "jax_version": jax.__version__}
    remove_dead_exports(workdir)
    publish(directory, lambda temporary: _write(temporary, run, params, programs, metadata))
  return directory, metadata


def _write(temporary: str, run, params, programs: list["Program"], metadata: dict) -> None:
  """The export's files, into the directory `temporary`."""
  save_file(named_parameters(params), os.path.join(temporary, PARAMS),
            metadata={"experiment": run.experiment.name, "step": str(run.step)})
  for program in programs:
    with open(os.path.join(temporary, program.file), "wb") as f:
      f.write(program.exported.serialize())
  with open(os.path.join(temporary, METADATA), "w", encoding="utf-8") as f:
    json.dump(metadata, f, indent=2, ensure_ascii=False)
    f.write("\n")


def export_programs(inference, params, platforms: tuple[str, ...], batch_size: int
                    ) -> tuple[list[Program], dict[str, str]]:
  """([Program], {platform: why it is left out}): inference.function closed over params and
  exported for `platforms` with a symbolic batch, in one program where every platform lowers
  so; otherwise each platform with the symbolic batch if it can (a Pallas kernel with the
  batch in its grid or blocks cannot), else with `batch_size`, one program for each batch
  (the first platform's first, in EXPORTED; the other in EXPORTED_IN its platforms), and a
  platform that lowers with neither left out. The first platform must lower: its error is
  raised.

  A platform that cannot lower with a symbolic batch: a Pallas kernel with the batch in its
  grid or blocks (XLA's Triton attention on CUDA; the attention's dispatch traces every
  platform's kernel, so a masked attention, listops', takes no symbolic batch on any
  platform). A char_lm transformer gives inference.jax_exported for CPU and TPU, any batch,
  and inference.cuda.jax_exported, batch 32. One that lowers with neither: its toolchain
  missing (the `aot` extra's cuDNN, CUDA plugin)."""
  symbolic, = jax.export.symbolic_shape(BATCH)
  function = jax.jit(lambda *inputs: inference.function(params, *inputs))

  def lower(chosen: tuple[str, ...], batch: int | None) -> jax.export.Exported:
    """The program for the `chosen` platforms with inputs of `batch` (None: symbolic)."""
    size = symbolic if batch is None else batch
    args = [jax.ShapeDtypeStruct((size, *shape.shape[1:]), shape.dtype)
            for shape, _ in inference.inputs.values()]
    return jax.export.export(function, platforms=chosen,
                             disabled_checks=export_checks_to_disable())(*args)

  try:
    return [Program(lower(platforms, None), None, EXPORTED)], {}
  except Exception:  # noqa: BLE001 - find which platforms fail, and why
    pass
  groups, failures = {}, {}           # batch -> its platforms; platform -> its error
  for platform in platforms:
    for batch in (None, batch_size):
      try:
        lower((platform,), batch)
      except Exception as error:  # noqa: BLE001 - a kernel or a platform's toolchain
        if platform == platforms[0] and batch is not None:
          raise
        failures[platform] = (str(error).strip().splitlines() or [type(error).__name__])[0]
        continue
      groups.setdefault(batch, []).append(platform)
      failures.pop(platform, None)
      break
  return [Program(lower(tuple(chosen), batch), batch,
                  EXPORTED_IN.format("_".join(chosen)) if i else EXPORTED)
          for i, (batch, chosen) in enumerate(groups.items())], failures


def _program(program: Program) -> dict:
  """A program's entry in metadata.json."""
  kernels = sorted(set(re.findall(r"custom_call @([\w$.]+)", program.exported.mlir_module())))
  return {"file": program.file, "platforms": list(program.exported.platforms),
          "batch": "any" if program.batch is None else program.batch,
          "custom_calls": kernels,
          "custom_calls_without_compatibility_guarantee": [k for k in kernels
                                                           if k in UNSTABLE_CUSTOM_CALLS]}


def named_parameters(params) -> dict[str, np.ndarray]:
  """{"encoder/embed/embedding": array} of a parameter tree: each leaf named by its path."""
  return {path: np.asarray(leaf, order="C") for path, leaf in leaves_by_path(params).items()}


def _output_names(exported) -> list[str]:
  """The names of the outputs (the keys of the dict the function returns), in leaf order."""
  example = jax.tree.unflatten(exported.out_tree, range(len(exported.out_avals)))
  return [name for name, _ in sorted(example.items(), key=lambda item: item[1])]


def _described(name: str, aval, meaning: str) -> dict:
  return {"name": name, "shape": [str(d) if not isinstance(d, int) else d for d in aval.shape],
          "dtype": str(aval.dtype), "meaning": meaning}


@contextlib.contextmanager
def exporting(workdir: str) -> Iterator[None]:
  """Holds the export lock of `workdir` while the block runs: an flock on the directory
  itself, which writes nothing into it and which the kernel releases when its holder dies
  (the training run's lock, run.lock, is another: a live run's workdir exports too).
  WorkdirError, before anything is compiled, while another live export holds it."""
  handle = os.open(workdir, os.O_RDONLY)
  try:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      raise WorkdirError(f"workdir {workdir} is being exported by another live process: wait "
                         "for it to end, then export again") from None
    yield
  finally:
    os.close(handle)


def publish(directory: str, write: Callable[[str], None]) -> None:
  """`write(temporary)` fills a new directory beside `directory` (.export_step_N.XXXXXXXX),
  which then takes its place in one step (`_swap_in`); one there before is removed. Called
  under `exporting`. A kill at any moment leaves the old export or the new one at
  `directory` (but where the filesystem cannot exchange two names: see `_swap_in`), and the
  temporary, which the next export removes (`remove_dead_exports`, just before it writes: a
  live export's temporary is never removed)."""
  parent, name = os.path.split(directory)
  temporary = tempfile.mkdtemp(prefix=f".{name}.", dir=parent)
  try:
    write(temporary)
    _swap_in(temporary, directory)
  finally:
    shutil.rmtree(temporary, ignore_errors=True)       # (after a swap: the old export)


def remove_dead_exports(workdir: str) -> list[str]:
  """Removes what killed exports left in `workdir` (the directories LEFTOVER matches): their
  temporaries, and the old export a kill between `_swap_in`'s two renames left aside, which
  goes back to its name where nothing took it. Called under `exporting`, so no live export's
  directory is among them; the names acted on, sorted."""
  found = sorted(name for name in os.listdir(workdir) if LEFTOVER.fullmatch(name)
                 and os.path.isdir(os.path.join(workdir, name))
                 and not os.path.islink(os.path.join(workdir, name)))
  for name in sorted(found, key=lambda n: not n.endswith(OLD)):    # old exports first
    path = os.path.join(workdir, name)
    target = os.path.join(workdir, name[1:].split(".")[0])
    if name.endswith(OLD) and not os.path.lexists(target):
      os.rename(path, target)
    else:
      shutil.rmtree(path)
  return found


def _swap_in(temporary: str, directory: str) -> None:
  """Moves the complete `temporary` to `directory`, and the export there before, if any, to
  `temporary`: in one step (Linux's renameat2 exchange), else (another system, a filesystem
  that cannot: NFS) by two renames, the old one aside as `temporary`.old between them, then
  removed (a kill between the two leaves no `directory`: the next export renames the old one
  back)."""
  if not os.path.lexists(directory):
    os.rename(temporary, directory)
    return
  if _exchange(temporary, directory):
    return
  old = temporary + OLD
  os.rename(directory, old)
  try:
    os.rename(temporary, directory)
  except BaseException:
    os.rename(old, directory)
    raise
  shutil.rmtree(old)


def _exchange(first: str, second: str) -> bool:
  """Swaps the entries at two paths atomically (renameat2 with RENAME_EXCHANGE); False, with
  nothing changed, where this system or filesystem cannot."""
  renameat2 = getattr(_libc(), "renameat2", None) if sys.platform == "linux" else None
  if renameat2 is None:
    return False
  renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                        ctypes.c_uint)
  if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second),
               RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
    return False
  raise OSError(code, os.strerror(code), second)


@functools.cache
def _libc():
  return ctypes.CDLL(None, use_errno=True)
