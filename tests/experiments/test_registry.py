"""The task registry, and the train loop's independence from where experiments live."""

import importlib
import os
import re
import sys

import pytest

import research.training
from research import experiments
from research.errors import ConfigError
from research.training import experiment as registry

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "experiments")


def test_every_experiment_task_is_registered_under_its_config_name():
  sys.path.insert(0, EXPERIMENTS)
  configs = [importlib.import_module(name[:-3]).get_config()
             for name in sorted(os.listdir(EXPERIMENTS)) if name.endswith(".py")]
  assert experiments.names() == sorted(config.experiment for config in configs)
  for name in experiments.names():
    assert experiments.get(name).name == name


def test_an_unknown_task_names_the_registered_ones():
  with pytest.raises(ConfigError, match="config.experiment='nmt' is not allowed; choose one of: " +
                     ", ".join(f"'{name}'" for name in experiments.names())):
    experiments.get("nmt")


def test_a_new_task_registers_again_but_never_over_a_built_in_one(monkeypatch):
  monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
  builder = experiments.register("mine", validate=lambda config: None, build=lambda config: None)
  assert experiments.get("mine") is builder and "mine" in experiments.names()
  again = experiments.register("mine", validate=lambda config: None, build=lambda config: None)
  assert experiments.get("mine") is again is not builder           # a notebook cell run twice
  built_in = experiments.get("listops")
  with pytest.raises(ValueError, match=r"^'listops' is a built-in experiment \(research\."
                                       r"experiments\.listops\): register yours under another"):
    experiments.register("listops", validate=lambda config: None, build=lambda config: None)
  assert experiments.get("listops") is built_in


def test_the_training_package_never_imports_the_tasks():
  """The trainer is handed its task: no module of research/training imports research.experiments
  when it is imported (restore looks a run's experiment up by name when called), nor imports
  a module by a name it computes."""
  directory = os.path.dirname(research.training.__file__)
  module_level = re.compile(r"^(from research import experiments|(from|import) research\.experiments)",
                            re.MULTILINE)
  for name in sorted(os.listdir(directory)):
    if name.endswith(".py"):
      with open(os.path.join(directory, name)) as f:
        source = f.read()
      assert not module_level.search(source), name
      assert not re.search(r"import_module|__import__", source), name
