"""Orbax checkpoints of the train state and the data iterator (asynchronous, the last N kept),
with resume from the latest one that reads and nothing ever lost: an unreadable checkpoint is
set aside, a changed model or a failed save stops the run with the last complete checkpoint
kept (`Checkpoints`; docs/running.md, "What a run survives").
"""

import os
import pathlib
import re
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from absl import logging

from research.errors import CheckpointMismatchError, RunFailed, WorkdirError
from research.training import parallel
from research.training.workdir import unused_path

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
    reason = _first_line(error) if error is not None else _disk_hint(self.directory)
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
                      "to the previous checkpoint", step, _first_line(error), aside)
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
                       f"({_first_line(error)})") from error
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


def _first_line(error: Exception) -> str:
  """'Type: first line of the message' (once, though wrappers repeat the type)."""
  name, text = type(error).__name__, str(error).strip().splitlines()
  line = text[0][:200] if text else ""
  return line if line.startswith(name) else f"{name}: {line}".rstrip(": ")


def _disk_hint(directory: str) -> str:
  free = shutil.disk_usage(directory).free
  return f"the save did not complete; {free / 2**20:.0f} MiB free on its disk"
