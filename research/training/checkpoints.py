"""Orbax checkpoints of the train state and the data iterator, with resume and fallback."""

import os
import shutil

import jax
import orbax.checkpoint as ocp
from absl import logging


class Checkpoints:
  """Async, keep-N checkpoints in `directory`, each holding {state, data iterator state}.

  restore_latest() returns the newest checkpoint that can be read; a checkpoint that
  cannot (truncated, corrupted) is moved to `<directory>_unreadable/<step>` with a
  warning, and the previous one is tried.
  """

  def __init__(self, directory: str, keep: int, is_async: bool = True):
    self.directory = os.path.abspath(directory)
    self.options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                enable_async_checkpointing=is_async)
    self.manager = ocp.CheckpointManager(self.directory, options=self.options)

  def save(self, step: int, state, data_state: dict) -> None:
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore_latest(self, like_state):
    """(step, state, data_state) of the newest readable checkpoint, or None if none is.

    like_state: a state pytree with the right structure, shapes and dtypes.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
        return step, restored.state, restored.data
      except Exception as error:  # noqa: BLE001 - any unreadable checkpoint falls back
        self._set_aside(step, error)
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    aside = os.path.join(f"{self.directory}_unreadable", str(step))
    logging.warning("checkpoint at step %d cannot be read (%s: %s); moved to %s, falling "
                    "back to the previous checkpoint", step, type(error).__name__,
                    str(error).splitlines()[0][:200] if str(error) else "", aside)
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      shutil.rmtree(aside, ignore_errors=True)
      shutil.move(os.path.join(self.directory, str(step)), aside)
    self.manager.close()
    self.manager = ocp.CheckpointManager(self.directory, options=self.options)

  def close(self) -> None:
    """Waits for pending saves to reach disk."""
    self.manager.wait_until_finished()
    self.manager.close()
