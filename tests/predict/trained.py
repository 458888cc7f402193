"""A tiny run trained in-process for the predictors' tests, and the parameters its loop
ended with (those it hands the report), to compare a restored run's answers with."""

import dataclasses
import importlib
import os
import sys

import jax
import numpy as np

from research import experiments
from research.training import Run, restore, train_and_evaluate
from research.training.config import apply_overrides
from research.training.experiment import Report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config(experiment: str, variant: str, overrides: dict):
  """experiments/<experiment>.py's get_config(variant), with `overrides` applied."""
  directory = os.path.join(ROOT, "experiments")
  if directory not in sys.path:
    sys.path.insert(0, directory)
  return apply_overrides(importlib.import_module(experiment).get_config(variant), overrides)


def train(config, workdir: str, report: bool = True):
  """Trains `config` in `workdir`; returns the parameters the loop ended with. With
  report=False the experiment's report is left out (its decoding, samples and heatmaps,
  compiled for nothing where a test reads none of them)."""
  captured = []
  experiment = experiments.get(config.experiment)

  def build(config):
    workload = experiment.build(config)

    def capturing(params):
      captured.append(params)
      return workload.report(params) if report and workload.report is not None else Report({})

    return workload._replace(report=capturing)

  train_and_evaluate(config, workdir, experiment._replace(build=build))
  return captured[-1]


def restored_and_final(config, workdir: str, report: bool = True):
  """(the run restored from `workdir` after training `config` there (report: as `train`'s),
  the same run with the parameters the loop ended with in place of the checkpoint's)."""
  final = train(config, workdir, report)
  run = restore(workdir)
  return run, dataclasses.replace(run, params=final)


def untrained(config, initialised: bool = False):
  """A Run of `config`, neither trained nor written, with its model's initial parameters
  (`initialised`) or none (for what is refused before the model runs)."""
  experiment = experiments.get(config.experiment)
  model, init, extras = experiment.build_model(config, None)
  params = jax.jit(init)(jax.random.key(0)) if initialised else None
  return Run("(untrained)", 0, (0,), config, experiment, model, params, extras, [], [])


def assert_bitwise_equal(tree, reference):
  """Every leaf of two pytrees (NamedTuples, lists, dicts of arrays) the same, bit for bit."""
  leaves, expected = jax.tree.leaves(tree), jax.tree.leaves(reference)
  assert len(leaves) == len(expected)
  for leaf, value in zip(leaves, expected, strict=True):
    leaf, value = np.asarray(leaf), np.asarray(value)
    assert leaf.dtype == value.dtype and np.array_equal(leaf, value)


def with_batch_size(run: Run, batch_size: int) -> Run:
  """`run` whose config.train.batch_size (the rows a predictor gives one call) is batch_size."""
  config = run.config.copy_and_resolve_references()
  config.train.batch_size = batch_size
  return dataclasses.replace(run, config=config)


def recording(monkeypatch, module, name: str, of=lambda array, options: array.shape) -> list:
  """`of(the first array input, the keyword options)` of each call of module.name (a
  predictor's compiled function, called as name(model, params, array, ...)) from now on; the
  calls jax.eval_shape traces with (abstract inputs) are left out."""
  calls, function = [], getattr(module, name)

  def recorded(model, params, array, *arrays, **options):
    if isinstance(array, np.ndarray):
      calls.append(of(array, options))
    return function(model, params, array, *arrays, **options)

  monkeypatch.setattr(module, name, recorded)
  return calls

