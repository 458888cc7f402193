"""A trained run read back from its workdir: `restore(workdir, step=None) -> Run`.

    from research.training import restore
    run = restore("runs/nmt_dates")                  # its latest checkpoint
    logits, weights = run.apply(source, source_lengths, target_in)   # the model's __call__
    run.step, run.config.model.attention, run.history[-1], run.provenance[-1]["git"]

A `Run` (a frozen dataclass) holds

  workdir      the directory given
  step         the step of the checkpoint restored
  steps        the steps of every complete checkpoint there, ascending (each restorable)
  config       the run's config.json, an ml_collections.ConfigDict
  experiment   the registered Experiment of config.experiment (research.experiments.get)
  model        the flax Module as the experiment trains it (Experiment.build_model)
  params       the checkpoint's parameters (float32, also for a model.dtype=bfloat16 run),
               replicated over the devices at hand (jax.devices()), whichever devices
               trained them
  extras       what the experiment's build_model returns beside the model, for answering
               raw input: nmt_dates' vocabularies, level and lengths, listops' token ids,
               kernel_regression's training points and test grid; {} for char_lm (bytes)
               and sequence_tasks (see each experiment's build_model)
  history      metrics.jsonl's records as they are now, oldest first ({"step": n,
               "train/loss": ...}: later steps than `step` for an earlier checkpoint or a
               live run)
  provenance   provenance.jsonl's records, one per start of the run, oldest first
               (research/training/provenance.py; [] for runs of earlier versions)

and `run.apply(*args, **kwargs)`, model.apply({"params": params}, *args, **kwargs).

Restoring reads the run's config.json, the files it wrote for its model (nmt_dates'
vocabularies and lengths) and one checkpoint's parameters (not the optimizer state): it
neither reads nor generates a data set, checks nothing a new run would (the data files
need not be there), writes nothing into the workdir and leaves its lock alone, so a live
run's workdir restores too (its latest complete checkpoint).

Refused in one line (a research.errors.UserError: WorkdirError, ConfigError or
CheckpointMismatchError), with nothing written: a workdir that does not exist, holds no run
(no config.json) or a sweep (restore one of its points); a run without a checkpoint; a step
without one (naming the steps there are); a config written under a key renamed since
(renamed_keys.py); an experiment not registered, or registered without build_model; a
config or a checkpoint that does not fit the model today's code builds (naming the first
parameter whose path or shape differs).

Warns (a ProvenanceWarning, one line) when today's versions of Python, jax, jaxlib, flax,
optax, orbax-checkpoint or this package, or the devices, differ from those of the run's
last start: the outputs may then differ from the run's in their last bits.
"""

import dataclasses
import os
import warnings
from typing import Any

import jax
import ml_collections

from research import files
from research.errors import ConfigError, UserError, WorkdirError
from research.training import parallel, provenance
from research.training.checkpoints import read_params, saved_steps
from research.training.experiment import Experiment
from research.training.loop import CHECKPOINTS, CONFIG, SWEEP_RECORD, _flatten
from research.training.metrics import read_history
from research.training.renamed_keys import RENAMED_KEYS, renamed


class ProvenanceWarning(UserWarning):
  """Today's versions or devices differ from those of the restored run's last start."""


@dataclasses.dataclass(frozen=True)
class Run:
  """A run restored from its workdir (see the module docstring for each field)."""
  workdir: str
  step: int
  steps: tuple[int, ...]
  config: ml_collections.ConfigDict
  experiment: Experiment
  model: Any
  params: Any
  extras: dict[str, Any]
  history: list[dict]
  provenance: list[dict]

  def apply(self, *args, **kwargs):
    """model.apply({"params": params}, *args, **kwargs): the model's __call__, or the method
    `method=` names."""
    return self.model.apply({"params": self.params}, *args, **kwargs)


def restore(workdir: str | os.PathLike, step: int | None = None) -> Run:
  """The run in `workdir` at the checkpoint of `step` (None: the latest complete one).

  Raises WorkdirError, ConfigError or CheckpointMismatchError, in one line, for what the
  module docstring lists; warns with a ProvenanceWarning when today's versions or devices
  differ from the run's.
  """
  workdir = os.fspath(workdir)
  config = read_config(workdir)
  experiment = registered(config.experiment, workdir)
  directory = os.path.join(workdir, CHECKPOINTS)
  steps = saved_steps(directory)
  if not steps:
    raise WorkdirError(f"workdir {workdir} holds no checkpoint: its run saved none yet")
  step = steps[-1] if step is None else step
  if step not in steps:
    raise WorkdirError(f"workdir {workdir} has no checkpoint of step {step}; its checkpoints: "
                       f"steps {', '.join(map(str, steps))}")
  model, init, extras = build_model(config, experiment, workdir)
  like = parallel.MeshStrategy().abstract_state(jax.eval_shape(init, jax.random.key(0)))
  params = read_params(directory, step, like)
  records = provenance.read(workdir)
  if records:
    changed = provenance.differences(records[-1], {"versions": provenance.versions(),
                                                   "devices": provenance.devices()})
    if changed:
      warnings.warn(f"{workdir} was trained with other versions or devices than these "
                    f"({changed}): outputs may differ from the run's in their last bits",
                    ProvenanceWarning, stacklevel=2)
  return Run(workdir, step, tuple(steps), config, experiment, model, params, extras,
             read_history(workdir), records)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config.json of the run in `workdir`; WorkdirError where there is none or it
  cannot be read, ConfigError for one written under a key renamed since."""
  if not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} " + ("is a file, not a run's workdir"
                                                if os.path.exists(workdir) else "does not exist"))
  if os.path.exists(os.path.join(workdir, SWEEP_RECORD)):
    points = sorted(name for name in os.listdir(workdir)
                    if os.path.isfile(os.path.join(workdir, name, CONFIG)))
    raise WorkdirError(f"workdir {workdir} holds a sweep ({SWEEP_RECORD}), not a single run: "
                       "restore one of its points" + (f", e.g. {os.path.join(workdir, points[0])}"
                                                      if points else " once one has started"))
  try:
    value = files.read_json(os.path.join(workdir, CONFIG))
  except FileNotFoundError:
    raise WorkdirError(f"workdir {workdir} holds no run (no {CONFIG})") from None
  except files.UnreadableFile as error:
    raise WorkdirError(f"workdir {workdir} cannot be restored: {error}") from None
  flat = _flatten(value)
  for key in sorted(set(flat) & set(RENAMED_KEYS)):
    if RENAMED_KEYS[key][0] not in flat:
      raise ConfigError(f"workdir {workdir} was written with {renamed(key)}: this version "
                        "cannot restore it (its parameters have other names too); restore it "
                        "with the version of the project that wrote it")
  return ml_collections.ConfigDict(value)


def registered(name: str, workdir: str) -> Experiment:
  """The experiment registered as `name`, with a build_model; ConfigError otherwise."""
  from research import experiments  # noqa: PLC0415   (the trainer imports no experiment itself)

  try:
    experiment = experiments.get(name)
  except ConfigError:
    raise ConfigError(f"workdir {workdir} holds a run of the experiment {name!r}, which is not "
                      f"registered here (registered: {', '.join(experiments.names())}): "
                      "register it first") from None
  if experiment.build_model is None:
    raise ConfigError(f"workdir {workdir} holds a run of the experiment {name!r}, registered "
                      "without build_model: register it with one to restore its runs")
  return experiment


def build_model(config, experiment: Experiment, workdir: str):
  """experiment.build_model(config, read) with read(name) the text of the workdir's file;
  WorkdirError naming a file that is not there, ConfigError where today's code cannot build
  the run's model from its config (a key removed or added since)."""

  def read(name: str) -> str:
    try:
      with open(os.path.join(workdir, name), encoding="utf-8") as f:
        return f.read()
    except FileNotFoundError:
      raise WorkdirError(f"workdir {workdir} has no {name}, which its {experiment.name} model "
                         "is built from (a run writes it when it starts; runs of earlier "
                         "versions did not): run its command again to write it") from None

  try:
    return experiment.build_model(config, read)
  except UserError:
    raise
  except (AttributeError, KeyError, TypeError, ValueError) as error:
    line = (str(error).strip().splitlines() or [""])[0]
    raise ConfigError(f"workdir {workdir}: today's {experiment.name} cannot build its run's "
                      f"model from its {CONFIG} and files ({type(error).__name__}: {line}); "
                      "restore it with the version of the project that wrote it") from error
