"""The experiments, registered by name: `get(config.experiment)` -> Experiment, `names()`.

An experiment provides validate(config) (ConfigError naming the key and the allowed values)
and build(config) -> Workload (model, data and pure loss / evaluation functions); see
research/training/experiment.py for the contract and the registry (adding your own).
"""

from research.experiments import (  # noqa: F401  (they register themselves)
  char_lm,
  kernel_regression,
  listops,
  lra,
  mqar,
  nmt_dates,
  sequence_tasks,
)
from research.training.experiment import get, names, register

__all__ = ["get", "names", "register"]
