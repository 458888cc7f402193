"""A trained run read back from its workdir, `restore(workdir, step=None) -> Run`: its
config, its model as the experiment builds it and one checkpoint's parameters, on the devices
at hand, without its data or optimizer state, writing nothing and taking no lock (a live run's
workdir restores too); and `--eval_only` (`evaluate_checkpoint`) over it. docs/trained_runs.md.
"""

import contextlib
import dataclasses
import numbers
import os
import tempfile
import warnings
from typing import Any

import jax
import ml_collections

from research import files
from research.errors import CheckpointMismatchError, ConfigError, UserError, WorkdirError
from research.training import experiment as registry
from research.training import parallel
from research.training.checkpoints import read_params
from research.training.config import base_config, check_like, check_shared_values
from research.training.experiment import Experiment
from research.training.loop import (
  compiled_eval_step,
  device_checked,
  evaluate_batches,
  validate,
  validate_experiment,
)
from research.training.workdir import (
  CHECKPOINTS,
  CONFIG,
  SWEEP_RECORD,
  flatten,
  provenance_differences,
  read_config_json,
  read_history,
  read_provenance,
  refuse_renamed,
  running_devices,
  running_versions,
  saved_steps,
  write_json,
)


class RestoreWarning(UserWarning):
  """What restoring a run warns of (launch.py prints each as one line `warning: ...`)."""


class ProvenanceWarning(RestoreWarning):
  """Today's versions or devices differ from those of the restored run's last start."""


class UnreadableCheckpointWarning(RestoreWarning):
  """The latest checkpoint (or several) cannot be read: an earlier one is restored."""


@dataclasses.dataclass(frozen=True)
class Run:
  """A run restored from its workdir (`restore`):

      from research.training import restore
      run = restore("runs/nmt_dates")                  # its latest checkpoint
      logits, weights = run.apply(source, source_lengths, target_in)   # the model's __call__
      run.step, run.config.model.attention, run.history[-1], run.provenance[-1]["git"]

    workdir      the directory given
    step         the step of the checkpoint restored
    steps        the steps of every complete checkpoint there, ascending, less those found
                 unreadable (the later ones passed over for `step`)
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
                 (workdir.read_provenance; [] for runs of earlier versions)

  and `run.apply(*args, **kwargs)`, model.apply({"params": params}, *args, **kwargs).
  """
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
  """The run in `workdir` at the checkpoint of `step` (None: the latest readable one).

  Reads the run's config.json (`read_config`), the files it wrote for its model (nmt_dates'
  vocabularies and lengths) and one checkpoint's parameters (not the optimizer state): it
  neither reads nor generates a data set (the data files need not be there), writes nothing
  into the workdir and leaves its lock alone, so a live run's workdir restores too (its
  latest complete checkpoint). The checkpoint read is that of `step`, or for None the latest
  that reads: as training falls back to its latest readable checkpoint, restore passes over
  those that cannot be read (cut short, corrupt), with an UnreadableCheckpointWarning (one
  line) naming each and the step used, but moves none aside (`read_readable`).

  Refused in one line (a research.errors.UserError: WorkdirError, ConfigError or
  CheckpointMismatchError), with nothing written: a workdir that does not exist, holds no run
  (no config.json) or a sweep (restore one of its points); a run without a checkpoint; a step
  that is not an int (2.0, "2", True: a ConfigError) or has no checkpoint (naming the steps
  there are); a step whose checkpoint cannot be read (naming those that read), or a run none
  of whose checkpoints reads; a config.json that cannot be read or parsed (a WorkdirError), or
  that `read_config`'s checks refuse (a ConfigError naming config.json and the key: a wrong
  type, a value out of range, groups nested too deep, written under a key renamed since,
  workdir.RENAMED_KEYS); an experiment not registered, or registered without build_model; a
  config or a checkpoint that does not fit the model today's code builds (naming the first
  parameter whose path or shape differs).

  Warns (a ProvenanceWarning, one line) when today's versions of Python, jax, jaxlib, flax,
  optax, orbax-checkpoint or this package, or the devices, differ from those of the run's
  last start: the outputs may then differ from the run's in their last bits.
  """
  workdir = os.fspath(workdir)
  config, experiment = read_config(workdir)
  directory = os.path.join(workdir, CHECKPOINTS)
  steps = saved_steps(directory)
  if not steps:
    raise WorkdirError(f"workdir {workdir} holds no checkpoint: its run saved none yet")
  if step is not None and (not isinstance(step, numbers.Integral) or isinstance(step, bool)):
    raise ConfigError(f"step={step!r} must be an int (None: the latest); workdir {workdir} has "
                      f"checkpoints of steps {', '.join(map(str, steps))}")
  step = None if step is None else int(step)
  if step is not None and step not in steps:
    raise WorkdirError(f"workdir {workdir} has no checkpoint of step {step}; its checkpoints: "
                       f"steps {', '.join(map(str, steps))}")
  model, init, extras = build_model(config, experiment, workdir)
  like = parallel.MeshStrategy().abstract_state(abstract_params(init, experiment, workdir))
  step, params, unreadable = read_readable(directory, steps, step, like)
  records = read_provenance(workdir)
  if records:
    changed = provenance_differences(records[-1], {"versions": running_versions(),
                                                   "devices": running_devices()})
    if changed:
      warnings.warn(f"{workdir} was trained with other versions or devices than these "
                    f"({changed}): outputs may differ from the run's in their last bits",
                    ProvenanceWarning, stacklevel=2)
  return Run(workdir, step, tuple(s for s in steps if s not in unreadable), config, experiment,
             model, params, extras, read_history(workdir), records)


def read_readable(directory: str, steps: list[int], step: int | None, like, **options
                  ) -> tuple[int, Any, list[int]]:
  """(the step read, its parameters, the steps found unreadable) of the checkpoints of
  `steps` in `directory`: the checkpoint of `step`, or for None the latest that reads, as
  training falls back (checkpoints.Checkpoints.restore_latest) but moving nothing aside;
  `options`: read_params' (`only` some parameters, the `advice` of a mismatch).

  Warns (UnreadableCheckpointWarning, one line) naming each unreadable checkpoint passed over
  and the step used; WorkdirError where none reads, or where the checkpoint of `step` does
  not, naming those that read.
  """
  if step is not None:
    try:
      return step, read_params(directory, step, like, **options), []
    except WorkdirError as error:
      readable = [s for s in reversed(steps)
                  if s != step and _reads(directory, s, like, **options)]
      raise WorkdirError(f"{error}; " + (f"the checkpoints there that read: step"
                                         f"{'s' * (len(readable) > 1)} "
                                         f"{', '.join(map(str, readable))}" if readable else
                                         "no other checkpoint there reads")) from None
  failures = []
  for candidate in reversed(steps):
    try:
      params = read_params(directory, candidate, like, **options)
    except WorkdirError as error:
      failures.append(str(error))
      continue
    if failures:
      warnings.warn(f"{'; '.join(failures)}; using step {candidate}, the latest checkpoint that "
                    "reads", UnreadableCheckpointWarning, stacklevel=3)
    return candidate, params, steps[len(steps) - len(failures):]
  raise WorkdirError(f"no checkpoint of {directory} reads: {'; '.join(failures)}")


def _reads(directory: str, step: int, like, **options) -> bool:
  """Whether the checkpoint of `step` reads into `like` (read_params' `options`)."""
  try:
    read_params(directory, step, like, **options)
  except (WorkdirError, CheckpointMismatchError):
    return False
  return True


def read_config(workdir: str) -> tuple[ml_collections.ConfigDict, Experiment]:
  """(the config.json of the run in `workdir`, its registered experiment): what every reader
  of a run's config uses (restore, --eval_only, --export).

  The file is read bounded (workdir.read_config_json, as training reads it too: at most
  workdir.MAX_BYTES, groups nested at most workdir.MAX_DEPTH deep) and passes what a
  launched config passes before anything is built (`checked_shared`, `checked_by` its
  experiment): the shared keys' types (those of base_config(), as config_flags keeps a
  launched config's) and values (config.check_shared_values; a shared key a run of an
  earlier version lacks at its default); the experiment's own checks (its validate), but for
  where the data was (the DATA_UNREAD keys), which restoring does not read. Not the devices:
  a run restores on any. Raises
  WorkdirError where there is no run or its config.json cannot be read, ConfigError naming
  config.json and the key for one written under a key renamed since or that today's checks
  refuse, and `registered`'s errors.
  """
  if not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} " + ("is a file, not a run's workdir"
                                                if os.path.exists(workdir) else "does not exist"))
  if os.path.exists(os.path.join(workdir, SWEEP_RECORD)):
    points = sorted(name for name in os.listdir(workdir)
                    if os.path.isfile(os.path.join(workdir, name, CONFIG)))
    raise WorkdirError(f"workdir {workdir} holds a sweep ({SWEEP_RECORD}), not a single run: "
                       "restore one of its points" + (f", e.g. {os.path.join(workdir, points[0])}"
                                                      if points else " once one has started"))
  path = os.path.join(workdir, CONFIG)
  try:
    value = read_config_json(path)
  except FileNotFoundError:
    raise WorkdirError(f"workdir {workdir} holds no run (no {CONFIG})") from None
  except files.UnreadableFile as error:
    raise WorkdirError(f"workdir {workdir} cannot be restored: {error}") from None
  except ConfigError as error:
    raise ConfigError(f"workdir {workdir} cannot be restored: {error}") from None
  refuse_renamed(flatten(value), workdir, "restore it with the version of the project that "
                 "wrote it")
  refusal = f"workdir {workdir} cannot be restored: {path} does not pass today's checks"
  with _refused_as(refusal):
    config, shared = checked_shared(value)
  experiment = registered(shared.experiment, workdir)
  with _refused_as(refusal):
    checked_by(experiment, shared)
  return config, experiment


@contextlib.contextmanager
def _refused_as(prefix: str):
  """A ConfigError of the block as one line: `prefix`: its message."""
  try:
    yield
  except ConfigError as error:
    raise ConfigError(f"{prefix}: {error}") from None


# Where a run found its data on the machine that trained it, and the value each is checked
# with when the run is read back: restoring reads no data, so neither its files nor a place
# to generate them need be here (--eval_only, which reads the data, checks them as they are).
DATA_UNREAD = {"data.corpus": "", "data.files": "", "data.stdlib": "",
               "data.dir": tempfile.gettempdir()}


def checked_shared(value: dict) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
  """(ConfigDict(value), the same with the shared keys a run of an earlier version lacks at
  their defaults) for a run's config.json `value` whose shared keys have the types
  config_flags keeps a launched config's in (config.check_like) and pass its checks
  (config.check_shared_values; not whether wandb is installed: restoring logs nothing).
  ConfigError naming the key otherwise."""
  check_like(value, base_config())
  try:
    config = ml_collections.ConfigDict(value)
  except (TypeError, ValueError) as error:          # ConfigDict's refusals: a dotted key
    raise ConfigError(str(error)) from None
  shared = ml_collections.ConfigDict(_with_defaults(value, base_config().to_dict()))
  check_shared_values(shared)
  return config, shared


def checked_by(experiment: Experiment, config: ml_collections.ConfigDict) -> None:
  """The experiment's checks of a launched config (loop.validate_experiment) on a run's
  config, its DATA_UNREAD keys at their values there; ConfigError naming the key, or the
  first line of a check that fails on a wrong type. The devices are not checked: a run
  restores on any."""
  try:
    validate_experiment(_data_unread(config), experiment)
  except ConfigError:
    raise
  except (TypeError, ValueError, IndexError) as error:      # a check meeting a wrong type
    line = (str(error).strip().splitlines() or [""])[0]
    raise ConfigError(f"today's {experiment.name} checks fail on it ({type(error).__name__}: "
                      f"{line})") from None


def _with_defaults(value: dict, defaults: dict) -> dict:
  """value (a config as JSON) with the keys of `defaults` it lacks, at any depth."""
  merged = dict(value)
  for key, default in defaults.items():
    if key not in merged:
      merged[key] = default
    elif isinstance(default, dict) and isinstance(merged[key], dict):
      merged[key] = _with_defaults(merged[key], default)
  return merged


def _data_unread(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config with the keys of DATA_UNREAD it holds as strings at their values there."""
  config = ml_collections.ConfigDict(config.to_dict())
  for key, value in DATA_UNREAD.items():
    group, _, name = key.rpartition(".")
    if isinstance(config.get(group), ml_collections.ConfigDict) and isinstance(
        config[group].get(name), str):
      config[group][name] = value
  return config


def writable(workdir: str, path: str, kind: str) -> None:
  """WorkdirError unless this process can create an entry in `workdir` (a file made and
  gone at once: the filesystem says, whoever the user is) and `path`, where a command will
  put a `kind` ("file" or "directory"), is none or one; for the commands that write into a
  restored run's workdir (--eval_only, --export), before they evaluate or compile."""
  try:
    files.write_probe(workdir)
  except OSError as error:
    raise WorkdirError(f"workdir {workdir} cannot be written ({error.strerror or error}): "
                       "give a copy of it you can write to") from None
  other = os.path.isdir(path) if kind == "file" else os.path.lexists(path) and not (
      os.path.isdir(path) and not os.path.islink(path))
  if other:
    raise WorkdirError(f"workdir {workdir}: {path} is in the way (not a {kind}, which this "
                       "command writes there): move it away")


def registered(name: str, workdir: str) -> Experiment:
  """The experiment registered as `name` (research.training.experiment's registry, which the
  built-in experiments enter when research.experiments is imported), with a build_model;
  ConfigError otherwise."""
  try:
    experiment = registry.get(name)
  except ConfigError:
    known = ", ".join(registry.names()) or ("none: import research.experiments for the built-in "
                                           "ones")
    raise ConfigError(f"workdir {workdir} holds a run of the experiment {name!r}, which is not "
                      f"registered here (registered: {known}): register it first") from None
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

  with _as_config_error(experiment, workdir):
    return experiment.build_model(config, read)


def abstract_params(init, experiment: Experiment, workdir: str):
  """The ShapeDtypeStructs of the parameters init(key) makes (jax.eval_shape: nothing is
  computed), ConfigError as `build_model`'s where today's code fails on the config."""
  with _as_config_error(experiment, workdir):
    return jax.eval_shape(init, jax.random.key(0))


@contextlib.contextmanager
def _as_config_error(experiment: Experiment, workdir: str):
  """A failure of today's code on the run's config (not a UserError) as one ConfigError."""
  try:
    yield
  except UserError:
    raise
  except (AttributeError, KeyError, TypeError, ValueError) as error:
    line = (str(error).strip().splitlines() or [""])[0]
    raise ConfigError(f"workdir {workdir}: today's {experiment.name} cannot build its run's "
                      f"model from its {CONFIG} and files ({type(error).__name__}: {line}); "
                      "restore it with the version of the project that wrote it") from error


EVAL_FILE = "eval_step_{step}.json"   # --eval_only's, in the run's workdir


def evaluate_checkpoint(workdir: str, step: int | None = None) -> tuple[str, dict]:
  """--eval_only: (the path written, {"step": step, "eval/…": …, "test/…": …}) for the run
  in workdir at the checkpoint of `step` (None: the latest that reads). eval/* is the loop's
  periodic evaluation on the validation split, test/* the experiment's final report's
  metrics (its files not written); on the devices at hand, in one process, nothing logged to
  W&B, nothing written but eval_step_<step>.json, and no lock taken (a live run's workdir
  evaluates too). What it refuses is refused before that file is written."""
  run = restore(workdir, step)
  path = os.path.join(workdir, EVAL_FILE.format(step=run.step))
  writable(workdir, path, "file")    # before anything is built or compiled
  config = base_config()             # today's shared keys, which a run of an earlier version
  config.update(run.config)          # may lack (given their defaults)
  config.distributed = base_config().distributed          # one process, whatever trained it
  config.wandb = base_config().wandb                      # nothing logged to W&B
  validate(config, run.experiment)
  workload = run.experiment.build(config)
  strategy = parallel.make_strategy(config.train.parallelism)
  shapes = strategy.abstract_state(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                run.params))
  eval_step = compiled_eval_step(workload, strategy, shapes,
                                 device_checked(config.train.batch_size))
  metrics = {"step": run.step, **evaluate_batches(eval_step, strategy,
                                                  strategy.put_state(run.params),
                                                  workload.eval_data)}
  if workload.report is not None:
    metrics |= workload.report(jax.device_get(run.params)).metrics
  if jax.process_index() == 0:
    write_json(path, metrics)   # valid JSON, non-finite values included
  return path, metrics
