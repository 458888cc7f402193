"""What every predictor checks of the run and the settings it is handed."""

import numbers

from research.errors import InputError


def check_experiment(run, experiment: str, function: str) -> None:
  """InputError unless `run` (a research.training.Run) is a run of `experiment`:
  `function` answers that experiment's runs only."""
  if run.config.experiment != experiment:
    raise InputError(f"{function} answers {experiment} runs; the run in {run.workdir} is a "
                     f"{run.config.experiment} run")


def is_int(value) -> bool:
  """Whether a setting is an int (a bool is not)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)
