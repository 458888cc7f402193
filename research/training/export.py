"""A run's model for use without this package: `python launch.py --workdir DIR --export [--step N]`.

`export_run(workdir, step=None)` restores the run (research.training.run.restore: its own
config.json and the checkpoint of `step`, the latest by default) and writes
DIR/export_step_<step>/:

  params.safetensors      the parameters alone (no optimizer state), float32 as the checkpoint
                          holds them, each named by its path in the tree
                          ("encoder/embed/embedding"); the file's metadata: experiment, step
  inference.jax_exported  the experiment's inference function (Experiment.inference: nmt_dates'
                          greedy decoding, char_lm's next-byte logits, listops' class logits,
                          sequence_tasks' outputs, kernel_regression's estimates) serialized by
                          `jax.export` for CPU, CUDA and TPU in one program, the parameters
                          inside it as constants and the batch axis of every input symbolic
                          (any size)
  metadata.json           experiment, step, config; the inputs and outputs in call order (name,
                          shape with "b" for the batch, dtype, meaning) and what making the
                          inputs and reading the outputs needs (`about`: vocabularies, token
                          ids, kernels); the platforms; jax's version; each program's file,
                          platforms, batch ("any" or its size) and custom calls, and those
                          among them without jax.export's compatibility guarantee (kernels such
                          as cuDNN's flash attention or XLA's Triton calls, whose interface may
                          change: another jax may refuse to run them)

A Python process with jax and flatbuffers (which jax.export's deserialization imports), and
not this package, runs it:

    import jax, numpy as np
    with open("export_step_1000/inference.jax_exported", "rb") as f:
      exported = jax.export.deserialize(f.read())
    outputs = exported.call(source, source_lengths)     # {"tokens": ..., "attention": ...}

The parameters are constants of the program: calling it needs neither params.safetensors
(which serves other tools) nor the parameter tree's structure.

Where a platform cannot lower with a symbolic batch (a Pallas kernel with the batch in its
grid or blocks: XLA's Triton attention on CUDA; the attention's dispatch traces every
platform's kernel, so a masked attention, listops', takes no symbolic batch on any platform),
it gets the run's config.train.batch_size; the platforms of each batch share a program, the
first platform's in inference.jax_exported, the other in inference.<platforms>.jax_exported
(a char_lm transformer: inference.jax_exported for CPU and TPU, any batch, and
inference.cuda.jax_exported, batch 32). A platform that lowers with neither (its toolchain
missing: the `aot` extra's cuDNN, CUDA plugin) is left out and named, with the first line of
its error, in metadata.json's `not_exported`.

Nothing else in the workdir is written and no lock is taken (a live run's workdir exports
too, at its latest complete checkpoint); an export_step_<step> there already is replaced
whole once the new one is complete (written into a temporary directory beside it,
.export_step_<step>.*, then swapped in; a kill meanwhile leaves that directory). Refused in
one line with nothing written (a research.errors.UserError): what restore refuses; an
experiment registered without `inference`; a workdir that cannot be written.
"""

import json
import os
import re
import shutil
import tempfile
from typing import NamedTuple

import jax
import numpy as np
from safetensors.numpy import save_file

from research.attention.platforms import UNSTABLE_CUSTOM_CALLS, export_checks_to_disable
from research.errors import ConfigError, WorkdirError
from research.training.checkpoints import leaves_by_path
from research.training.run import restore

DIRECTORY = "export_step_{step}"
PARAMS, EXPORTED, METADATA = "params.safetensors", "inference.jax_exported", "metadata.json"
EXPORTED_IN = "inference.{}.jax_exported"     # a second program: its platforms in its name
PLATFORMS = ("cpu", "cuda", "tpu")
BATCH = "b"                      # the symbolic batch size of every input


class Program(NamedTuple):
  """The inference function exported for some platforms, with one batch size."""
  exported: jax.export.Exported
  batch: int | None              # the inputs' batch size; None: any (symbolic)
  file: str                      # its file in the export's directory


def export_run(workdir: str, step: int | None = None, platforms: tuple[str, ...] = PLATFORMS
               ) -> tuple[str, dict]:
  """(the directory written, its metadata.json) for the run in `workdir` at the checkpoint of
  `step` (None: the latest), its inference function exported for `platforms` (those whose
  lowering works; the first must)."""
  run = restore(workdir, step)
  if run.experiment.inference is None:
    raise ConfigError(f"workdir {workdir} holds a run of the experiment {run.experiment.name!r}, "
                      "registered without inference: register it with one to export its runs")
  inference = run.experiment.inference(run.config, run.model, run.extras)
  params = jax.device_get(run.params)
  programs, failures = export_programs(inference, params, platforms, run.config.train.batch_size)
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
  directory = os.path.join(workdir, DIRECTORY.format(step=run.step))
  try:
    temporary = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.", dir=workdir)
  except OSError as error:
    raise WorkdirError(f"workdir {workdir} cannot be written ({error.strerror or error}): "
                       "export a copy of it") from None
  try:
    save_file(named_parameters(params), os.path.join(temporary, PARAMS),
              metadata={"experiment": run.experiment.name, "step": str(run.step)})
    for program in programs:
      with open(os.path.join(temporary, program.file), "wb") as f:
        f.write(program.exported.serialize())
    with open(os.path.join(temporary, METADATA), "w", encoding="utf-8") as f:
      json.dump(metadata, f, indent=2, ensure_ascii=False)
      f.write("\n")
    _swap_in(temporary, directory)
  finally:
    shutil.rmtree(temporary, ignore_errors=True)
  return directory, metadata


def export_programs(inference, params, platforms: tuple[str, ...], batch_size: int
                    ) -> tuple[list[Program], dict[str, str]]:
  """([Program], {platform: why it is left out}): inference.function closed over params and
  exported for `platforms` with a symbolic batch, in one program where every platform lowers
  so; otherwise each platform with the symbolic batch if it can (a Pallas kernel with the
  batch in its grid or blocks cannot), else with `batch_size`, one program for each batch
  (the first platform's first, in EXPORTED; the other in EXPORTED_IN its platforms), and a
  platform that lowers with neither left out. The first platform must lower: its error is
  raised."""
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


def _swap_in(temporary: str, directory: str) -> None:
  """Moves the complete `temporary` to `directory`, replacing one there."""
  if not os.path.exists(directory):
    os.rename(temporary, directory)
    return
  old = temporary + ".old"
  os.rename(directory, old)
  os.rename(temporary, directory)
  shutil.rmtree(old)
