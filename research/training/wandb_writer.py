"""An optional Weights & Biases run beside TensorBoard: config.wandb, the `wandb` extra.

With config.wandb.mode 'online' or 'offline', process 0 of a run logs to one W&B run:

  hyperparameters  the config, flattened ({"train.learning_rate": 0.001, ...})
  history          every metrics.jsonl record, its values against the W&B metric `step`
                   (the record's step; W&B's own row counter is not the x-axis)
  images           the experiment's plots at the end: loss.png and the report's heatmaps
                   (`plots/loss`, `plots/<stem>`), at the last step
  summary          final_metrics.json's values

Its files live in WORKDIR/wandb/, an offline run's too (`wandb sync WORKDIR/wandb/offline-run-*`
uploads it later), beside the run's id (WORKDIR/wandb/run_id). A run resumed from a checkpoint
continues that W&B run (resume="allow"); one that starts from step 0 (a new run, or one that
failed before its first checkpoint) starts a new W&B run. W&B cannot delete what it logged: the
records between the checkpoint and a crash are logged again at their steps, the same values a
second time (the resumed run reproduces them), where metrics.jsonl and TensorBoard keep one.

W&B never stops a run: where a call fails (a full disk, no credentials or network where 'online'
needs them), one warning line names the failure and the run goes on without W&B (metrics.jsonl
and TensorBoard hold every record). The package is checked for before anything compiles
(`check_installed`).
"""

import contextlib
import importlib.util
import os
import sys

import jax

from research import files
from research.errors import ConfigError

MODES = ("off", "online", "offline")          # config.wandb.mode
DIRECTORY = "wandb"                           # WORKDIR/wandb: the W&B run's files
RUN_ID = "run_id"                             # WORKDIR/wandb/run_id: the run a resume continues
STEP = "step"                                 # the W&B metric every other is drawn against
INSTALL = 'pip install -e ".[wandb]"'


def check_installed(config) -> None:
  """ConfigError where config.wandb.mode asks for W&B and its package is not installed."""
  if config.wandb.mode != "off" and importlib.util.find_spec("wandb") is None:
    raise ConfigError(f"config.wandb.mode={config.wandb.mode!r} needs the wandb package, which "
                      f"is not installed: {INSTALL} (or set config.wandb.mode='off')")


class WandbRun:
  """A run's W&B run, a context manager: nothing until `start`, nothing at all where
  config.wandb.mode is 'off' or on a process other than 0. Leaving the context finishes the
  W&B run, marked failed (exit code 1) when an exception leaves it."""

  def __init__(self, settings, workdir: str):
    """`settings`: config.wandb (mode, project, entity, name); `workdir`: the run's."""
    self.settings, self.workdir, self.run = settings, workdir, None

  def __enter__(self) -> "WandbRun":
    return self

  def __exit__(self, kind, error, traceback) -> None:
    self._finish(exit_code=0 if kind is None else 1)

  def start(self, hyperparameters: dict, resumed: bool) -> None:
    """Starts (or, `resumed` from a checkpoint, continues) the workdir's W&B run with the
    flattened config as its hyperparameters; prints where it is, in one line."""
    if self.settings.mode == "off" or jax.process_index() != 0:
      return
    with self._guard("to start"):
      import wandb  # noqa: PLC0415   (the optional extra: imported where it is used)

      run_id_path = os.path.join(self.workdir, DIRECTORY, RUN_ID)
      previous = _read(run_id_path) if resumed else None
      os.makedirs(os.path.dirname(run_id_path), exist_ok=True)
      self.run = wandb.init(
          project=self.settings.project or None, entity=self.settings.entity or None,
          name=self.settings.name or os.path.basename(os.path.abspath(self.workdir)),
          mode=self.settings.mode, dir=self.workdir, id=previous,
          resume="allow" if previous else None,
          settings=wandb.Settings(silent=True, console="off"))
      self.run.config.update(hyperparameters, allow_val_change=True)
      self.run.define_metric(STEP)
      self.run.define_metric("*", step_metric=STEP)
      files.write_text(run_id_path, self.run.id)
      where = (self.run.url if self.settings.mode == "online" else
               f"{self.run.settings.sync_dir} (upload it with `wandb sync "
               f"{self.run.settings.sync_dir}`)")
      print(f"Weights & Biases: {'continuing' if previous else 'logging to'} run {self.run.id}"
            f" in {where}", file=sys.stderr, flush=True)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """One history row: the values of a metrics.jsonl record at its step."""
    if self.run is not None:
      with self._guard(f"to log step {step}"):
        self.run.log({STEP: step, **values})

  def images(self, step: int, paths: dict[str, str]) -> None:
    """The PNG files {name: path} as images `plots/<name>` at `step`."""
    if self.run is not None:
      with self._guard("to log the plots"):
        import wandb  # noqa: PLC0415

        self.run.log({STEP: step, **{f"plots/{name}": wandb.Image(path)
                                     for name, path in paths.items()}})

  def summary(self, values: dict) -> None:
    """The run's final metrics as the W&B run's summary."""
    if self.run is not None:
      with self._guard("to write the summary"):
        self.run.summary.update(values)

  def _finish(self, exit_code: int) -> None:
    if self.run is not None:
      run, self.run = self.run, None
      with self._guard("to finish"):
        run.finish(exit_code=exit_code)

  @contextlib.contextmanager
  def _guard(self, what: str):
    """An exception of the block: one warning line, and W&B left for the rest of the run."""
    try:
      yield
    except Exception as error:  # noqa: BLE001   (W&B is never a reason to stop training)
      run, self.run = self.run, None
      print(f"warning: Weights & Biases failed {what} ({type(error).__name__}: {error}); the "
            "run goes on without it (metrics.jsonl and TensorBoard hold every record)",
            file=sys.stderr, flush=True)
      if run is not None:               # stop W&B's own process; the warning above says why
        with contextlib.suppress(Exception):
          run.finish(exit_code=1)


def _read(path: str) -> str | None:
  """The run id stored at `path`, None where there is none."""
  try:
    with open(path) as f:
      return f.read().strip() or None
  except FileNotFoundError:
    return None
