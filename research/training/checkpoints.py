"""Orbax checkpoints of the train state and the data iterator (asynchronous, the last N kept),
resumed from the latest one that reads with nothing ever lost (`Checkpoints`; docs/running.md,
"What a run survives"); one checkpoint's parameters read alone (`read_params`); and a warm
start, a new run's parameters taken from another run's checkpoint (config.train.init_from =
WORKDIR[:STEP], init_params; docs/running.md, "Warm start").
"""

import os
import pathlib
import re
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from research.errors import (
  CheckpointMismatchError,
  ConfigError,
  RunFailed,
  WorkdirError,
  first_line,
)
from research.training import parallel
from research.training.workdir import CHECKPOINTS, SWEEP_RECORD, saved_steps, unused_path

UNREADABLE_SUFFIX = "_unreadable"
PARAMS = "params/"              # the parameters' paths in a checkpoint's state


class CheckpointSaveError(RunFailed):
  """A checkpoint could not be written."""


class Restored(NamedTuple):
  step: int
  state: Any                     # like the `like_state` given to restore_latest
  data: dict                     # the data iterator's state
  unlogged_metrics: list         # JSON: per-step metrics since the last log (a stop between logs)


class Checkpoints:
  """Async, keep-N checkpoints in `directory`, each holding the train state, the data
  iterator's state and the per-step metrics not logged yet (JSON).

  What is never lost:
  - A checkpoint that cannot be read (truncated, corrupt) is moved to
    `<directory>_unreadable/<step>` (or `<step>.1`, `<step>.2`, ... when an earlier copy of
    that step is there already: nothing set aside is ever replaced) and the previous one is
    tried (`restore_latest`).
  - A checkpoint that reads but whose parameter tree differs from the model's (the code
    renamed or reshaped a parameter) stops the run with CheckpointMismatchError naming the
    first differing path and both shapes; every checkpoint stays where it was.
  - A save that fails (a full disk) stops the run at the next step with
    CheckpointSaveError (`raise_if_failed`); the last complete checkpoint stays readable
    (Orbax writes a step into a temporary directory and renames it only once complete).
  """

  def __init__(self, directory: str, keep: int, is_async: bool = True):
    self.directory = os.path.abspath(directory)
    self.options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                enable_async_checkpointing=is_async)
    self.manager = self._open()
    self.pending: int | None = None      # the step of a save that may still be in flight

  def _open(self) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(self.directory, options=self.options, item_handlers={
        "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
        "unlogged_metrics": ocp.JsonCheckpointHandler()})

  def save(self, step: int, state, data_state: dict, unlogged_metrics: list = ()) -> None:
    """Starts writing a checkpoint of `step` (in the background when async)."""
    self.raise_if_failed(wait=True)
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
          unlogged_metrics=ocp.args.JsonSave(list(unlogged_metrics))), force=True)
    except Exception as error:  # noqa: BLE001 - any failure to write stops the run
      raise self._save_error(step, error) from error
    self.pending = step

  def raise_if_failed(self, wait: bool = False) -> None:
    """CheckpointSaveError if the last save has ended without its step on disk.

    Cheap while that save is still running (nothing to check yet) unless `wait`.
    """
    if self.pending is None or (not wait and self.manager.is_saving_in_progress()):
      return
    step, self.pending = self.pending, None
    try:
      self.manager.wait_until_finished()
    except Exception as error:  # noqa: BLE001
      raise self._save_error(step, error) from error
    if jax.process_index() == 0 and not os.path.isdir(os.path.join(self.directory, str(step))):
      raise self._save_error(step, None)

  def _save_error(self, step: int, error: Exception | None) -> CheckpointSaveError:
    reason = first_line(error) if error is not None else _disk_hint(self.directory)
    kept = [s for s in self.manager.all_steps() if s != step]
    last = f"step {max(kept)}" if kept else "none yet"
    return CheckpointSaveError(
        f"the checkpoint of step {step} could not be written to {self.directory} ({reason}); "
        f"stopping. The last complete checkpoint ({last}) is kept: make room and run the same "
        "command again to resume")

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore_latest(self, like_state) -> Restored | None:
    """The newest readable checkpoint, or None if none is.

    like_state: a state pytree with the right structure, shapes and dtypes. Raises
    CheckpointMismatchError if a readable checkpoint holds a different tree.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
    for step in sorted(self.manager.all_steps(), reverse=True):
      # Every process decides alike (any_process), before any of them moves a checkpoint.
      metadata, error = _attempt(self.manager.item_metadata, step)
      if parallel.any_process(metadata is None or "state" not in metadata.keys()):
        self._set_aside(step, error or OSError("no readable state metadata here or on "
                                               "another process"))
        continue
      saved = metadata["state"]
      difference = first_difference(_shapes(getattr(saved, "tree", saved)), _shapes(abstract))
      if difference:
        raise CheckpointMismatchError(
            f"the checkpoint at step {step} in {self.directory} does not match the model: "
            f"{difference}. Nothing was moved: run the code that wrote it, or give a new "
            "--workdir")
      items = dict(state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore())
      if "unlogged_metrics" in metadata.keys():     # checkpoints written before it lack it
        items["unlogged_metrics"] = ocp.args.JsonRestore()
      restored, error = _attempt(self.manager.restore, step, args=ocp.args.Composite(**items))
      if parallel.any_process(restored is None):
        self._set_aside(step, error or OSError("unreadable on another process"))
        continue
      return Restored(step, restored.state, restored.data,
                      restored.get("unlogged_metrics") or [])
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    """Process 0 moves the checkpoint of `step` aside while the others wait."""
    if jax.process_index() == 0:
      aside = unused_path(os.path.join(f"{self.directory}{UNREADABLE_SUFFIX}", str(step)))
      logging.warning("checkpoint at step %d cannot be read (%s); moved to %s, falling back "
                      "to the previous checkpoint", step, first_line(error), aside)
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), aside)
    parallel.barrier(f"checkpoint {step} set aside")
    self.manager.close()
    self.manager = self._open()

  def close(self) -> None:
    """Waits for pending saves to reach disk; CheckpointSaveError if the last one failed."""
    try:
      self.raise_if_failed(wait=True)
    finally:
      self.manager.close()


READ_ADVICE = "read it with the code and config that wrote it"


def read_params(directory: str, step: int, like_params, only: re.Pattern | None = None,
                advice: str = READ_ADVICE):
  """The parameters alone of the checkpoint of `step` in `directory`, read without writing
  anything (nothing set aside: a live run's checkpoints too), placed as like_params'
  ShapeDtypeStructs say: their shardings and dtypes, not those of the devices that wrote
  them. With `only`, those whose '/'-joined path ('encoder/kernel') it matches whole are
  compared and read, the others neither: the tree returned holds those alone.

  Raises CheckpointMismatchError naming the first parameter whose path or shape differs
  from like_params', then `advice`; WorkdirError for a checkpoint that cannot be read.
  """
  path = pathlib.Path(directory, str(step), "state")
  like = {"params": like_params if only is None else _matching(like_params, only)}
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata, error = _attempt(handler.metadata, path)
    if metadata is not None:
      saved = _shapes(getattr(metadata, "tree", metadata))
      difference = first_difference(
          {p: s for p, s in saved.items() if p.startswith(PARAMS)
           and (only is None or only.fullmatch(p.removeprefix(PARAMS)))}, _shapes(like))
      if difference:
        raise CheckpointMismatchError(
            f"the checkpoint at step {step} in {directory} does not match the model: "
            f"{difference}; {advice}")
      restored, error = _attempt(handler.restore, path, args=ocp.args.PyTreeRestore(
          like, ocp.checkpoint_utils.construct_restore_args(like), partial_restore=True))
  finally:
    handler.close()
  if error is not None:
    raise WorkdirError(f"the checkpoint at step {step} in {directory} cannot be read "
                       f"({first_line(error)})") from error
  return restored["params"]


def _matching(params: Mapping, only: re.Pattern, prefix: str = "") -> dict:
  """The nested dicts of `params` with the leaves whose '/'-joined path `only` matches whole
  (groups left with none left out)."""
  kept = {}
  for name, node in params.items():
    path = f"{prefix}{name}"
    if isinstance(node, Mapping):
      if inner := _matching(node, only, f"{path}/"):
        kept[name] = inner
    elif only.fullmatch(path):
      kept[name] = node
  return kept


def _attempt(read, *args, **kwargs):
  """(read(*args, **kwargs), None), or (None, the exception) for a checkpoint that cannot
  be read."""
  try:
    return read(*args, **kwargs), None
  except Exception as error:  # noqa: BLE001 - whatever fails to read makes it unreadable
    return None, error


def leaves_by_path(tree) -> dict[str, Any]:
  """{'params/encoder/kernel': leaf, ...}: each leaf of a pytree (or an Orbax metadata tree)
  named by its path, the keys joined by '/'."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(k) for k in path): leaf for path, leaf in leaves}


def _shapes(tree) -> dict[str, tuple]:
  """{'params/encoder/kernel': shape, ...} of a state pytree or its Orbax metadata tree."""
  return {path: tuple(leaf.shape) for path, leaf in leaves_by_path(tree).items()}


def _key_name(key) -> str:
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def first_difference(saved: dict[str, tuple], model: dict[str, tuple]) -> str | None:
  """The first path (parameters before optimizer state) that differs, in words, or None."""
  paths = sorted(set(saved) | set(model), key=lambda p: (not p.startswith(PARAMS), p))
  for path in paths:
    if path not in model:
      return f"{path} {saved[path]} is in the checkpoint but not in the model"
    if path not in saved:
      return f"{path} {model[path]} is in the model but not in the checkpoint"
    if saved[path] != model[path]:
      return f"{path} has shape {saved[path]} in the checkpoint and {model[path]} in the model"
  return None


def _disk_hint(directory: str) -> str:
  free = shutil.disk_usage(directory).free
  return f"the save did not complete; {free / 2**20:.0f} MiB free on its disk"


# ---- Warm start: another run's parameters -------------------------------------------------
# All of them, or those whose '/'-joined path config.train.init_params matches whole, the rest
# at their fresh initialisation; the optimizer state and the step start fresh. Read before
# anything compiles; a run that resumes its own checkpoint never reads it.
INIT_FROM, INIT_PARAMS = "train.init_from", "train.init_params"
SHOWN_PATHS = 6          # of the model's, in the refusal of a pattern that matches none


class WarmSource(NamedTuple):
  """config.train.init_from and init_params, parsed."""
  given: str              # init_from as the config gives it
  workdir: str            # the other run's workdir, as given
  step: int | None        # the step of its checkpoint; None: the latest that reads
  pattern: re.Pattern     # the parameters taken: those whose path it matches whole


class Taken(NamedTuple):
  """What a warm start read: the parameters, and where they came from."""
  params: Any             # the matching parameters alone, nested as the model's
  record: dict            # provenance.jsonl's "init_from": workdir, step, params_taken / _total


def parse_warm_start(train: ml_collections.ConfigDict) -> WarmSource | None:
  """The WarmSource of config.train (None where init_from is ""): 'WORKDIR:STEP' with STEP
  digits names a step, anything else a workdir. ConfigError for a pattern that does not
  compile (config.check_shared_values' check of the keys, wherever the other run is); a
  config.json of an earlier version, without the keys, has none."""
  init_from, pattern = train.get("init_from", ""), train.get("init_params", ".*")
  try:
    compiled = re.compile(pattern)
  except re.error as error:
    raise ConfigError(f"config.{INIT_PARAMS}={pattern!r} is not a regular expression "
                      f"({error}); give one that the parameters' '/'-joined paths match "
                      "whole, e.g. 'encoder/.*'") from None
  if not init_from:
    return None
  workdir, _, step = init_from.rpartition(":")
  if workdir and step.isascii() and step.isdigit():
    return WarmSource(init_from, workdir, int(step), compiled)
  return WarmSource(init_from, init_from, None, compiled)


def find_warm_start(config, workdir: str) -> WarmSource | None:
  """The WarmSource this run in `workdir` starts from: None where config.train.init_from is ""
  or the run has checkpoints of its own (it resumes from them). ConfigError, naming
  init_from, for a workdir that does not exist or holds no checkpoint (a sweep's root:
  naming a point), or no checkpoint of the step given (naming those it holds)."""
  source = parse_warm_start(config.train)
  if source is None or saved_steps(os.path.join(workdir, CHECKPOINTS)):
    return None
  given = f"config.{INIT_FROM}={source.given!r}"
  if not os.path.isdir(source.workdir):
    raise ConfigError(f"{given}: there is no workdir {source.workdir}; give a run's workdir, "
                      "WORKDIR or WORKDIR:STEP")
  steps = saved_steps(os.path.join(source.workdir, CHECKPOINTS))
  if not steps and os.path.exists(os.path.join(source.workdir, SWEEP_RECORD)):
    raise ConfigError(f"{given}: {source.workdir} holds a sweep ({SWEEP_RECORD}), not a single "
                      "run; give one of its points, WORKDIR/POINT")
  if not steps:
    raise ConfigError(f"{given}: workdir {source.workdir} holds no checkpoint")
  if source.step is not None and source.step not in steps:
    raise ConfigError(f"{given}: workdir {source.workdir} has no checkpoint of step "
                      f"{source.step}; its checkpoints: steps {', '.join(map(str, steps))}")
  return source


def read_warm_start(source: WarmSource, init, key: jax.Array, sharding) -> Taken:
  """The parameters of the model init(key) makes (traced, not run) that source.pattern
  matches, read from the source's checkpoint (research.training.run.read_readable: that of
  its step, or the latest that reads) in the model's dtypes, placed on `sharding`.

  ConfigError, naming init_from or init_params, for a pattern that matches none of the
  model's parameters, the first matching parameter whose shape differs between the
  checkpoint and the model (or that one of them lacks), with both shapes, and a checkpoint
  that cannot be read."""
  from research.training.run import read_readable  # noqa: PLC0415 - run imports the loop

  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      jax.eval_shape(init, key))
  paths = list(leaves_by_path(like))
  taken = sum(1 for path in paths if source.pattern.fullmatch(path))
  if not taken:
    shown = ", ".join(paths[:SHOWN_PATHS]) + (" …" if len(paths) > SHOWN_PATHS else "")
    raise ConfigError(f"config.{INIT_PARAMS}={source.pattern.pattern!r} matches none of this "
                      f"model's {len(paths)} parameters, whose paths the pattern must match "
                      f"whole: {shown}")
  directory = os.path.join(source.workdir, CHECKPOINTS)
  try:
    step, params, _ = read_readable(
        directory, saved_steps(directory), source.step, like, only=source.pattern,
        advice=f"take only the parameters that fit with config.{INIT_PARAMS}, a regular "
               "expression their paths match whole")
  except (CheckpointMismatchError, WorkdirError) as error:
    raise ConfigError(f"config.{INIT_FROM}={source.given!r}: {error}") from None
  return Taken(params, {"workdir": os.path.abspath(source.workdir), "step": step,
                        "params_taken": taken, "params_total": len(paths)})


def merged(params, taken: Taken):
  """`params` (a fresh initialisation) with each leaf `taken` holds in its place."""
  replacements = leaves_by_path(taken.params)
  leaves = [replacements.get(path, leaf) for path, leaf in leaves_by_path(params).items()]
  return jax.tree.unflatten(jax.tree.structure(params), leaves)


def warm_started(state, taken: Taken, optimizer, sharding):
  """The train state `state` (a fresh initialisation, step 0) with the parameters `taken`
  in place and the optimizer's state made for them, placed on `sharding`."""
  params = merged(state.params, taken)
  return state.replace(params=params,
                       opt_state=jax.jit(optimizer.init, out_shardings=sharding)(params))
