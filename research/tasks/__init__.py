"""Experiments' tasks, registered by name: `get(config.task)` -> TaskBuilder, `names()`.

A task provides validate(config) (ConfigError naming the key and the allowed values)
and build(config) -> Task (model, data and pure loss / evaluation functions); see
research/training/task.py for the contract and registry.py for adding your own.
"""

from research.tasks import char_lm, kernel_regression, listops, nmt_dates, sequence_tasks  # noqa: F401  (they register themselves)
from research.tasks.registry import get, names, register

__all__ = ["get", "names", "register"]
