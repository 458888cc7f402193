"""Warm start: a new run's parameters taken from another run's checkpoint
(config.train.init_from = WORKDIR[:STEP]), all of them or those whose '/'-joined path
config.train.init_params matches whole, the rest at their fresh initialisation; the optimizer
state and the step start fresh. Read before anything compiles; a run that resumes its own
checkpoint never reads it. docs/running.md, "Warm start".
"""

import os
import re
from typing import Any, NamedTuple

import jax
import ml_collections

from research.errors import CheckpointMismatchError, ConfigError, WorkdirError
from research.training.checkpoints import leaves_by_path
from research.training.workdir import CHECKPOINTS, SWEEP_RECORD, saved_steps

INIT_FROM, INIT_PARAMS = "train.init_from", "train.init_params"
SHOWN_PATHS = 6          # of the model's, in the refusal of a pattern that matches none


class Source(NamedTuple):
  """config.train.init_from and init_params, parsed."""
  given: str              # init_from as the config gives it
  workdir: str            # the other run's workdir, as given
  step: int | None        # the step of its checkpoint; None: the latest that reads
  pattern: re.Pattern     # the parameters taken: those whose path it matches whole


class Taken(NamedTuple):
  """What a warm start read: the parameters, and where they came from."""
  params: Any             # the matching parameters alone, nested as the model's
  record: dict            # provenance.jsonl's "init_from": workdir, step, params_taken / _total


def parse(train: ml_collections.ConfigDict) -> Source | None:
  """The Source of config.train (None where init_from is ""): 'WORKDIR:STEP' with STEP
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
    return Source(init_from, workdir, int(step), compiled)
  return Source(init_from, init_from, None, compiled)


def find(config, workdir: str) -> Source | None:
  """The Source this run in `workdir` starts from: None where config.train.init_from is ""
  or the run has checkpoints of its own (it resumes from them). ConfigError, naming
  init_from, for a workdir that does not exist or holds no checkpoint (a sweep's root:
  naming a point), or no checkpoint of the step given (naming those it holds)."""
  source = parse(config.train)
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


def read(source: Source, init, key: jax.Array, sharding) -> Taken:
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


def started(state, taken: Taken, optimizer, sharding):
  """The train state `state` (a fresh initialisation, step 0) with the parameters `taken`
  in place and the optimizer's state made for them, placed on `sharding`."""
  params = merged(state.params, taken)
  return state.replace(params=params,
                       opt_state=jax.jit(optimizer.init, out_shardings=sharding)(params))
