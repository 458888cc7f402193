"""The runtime: `train_and_evaluate(config, workdir, experiments.get(config.experiment))`,
sweeps, and `restore(workdir)` of a finished run (its experiment registered: import
research.experiments for the built-in ones); docs/running.md, docs/trained_runs.md."""

from research.errors import ConfigError, InputError, RunFailed, UserError, WorkdirError
from research.training.config import apply_overrides, base_config
from research.training.loop import Stopped, train, train_and_evaluate, validate
from research.training.metrics import NonFiniteLossError
from research.training.run import ProvenanceWarning, Run, UnreadableCheckpointWarning, restore
from research.training.sweep import run_sweep

__all__ = ["ConfigError", "InputError", "NonFiniteLossError", "ProvenanceWarning", "Run",
           "RunFailed", "Stopped", "UnreadableCheckpointWarning", "UserError", "WorkdirError",
           "apply_overrides", "base_config", "restore", "run_sweep", "train", "train_and_evaluate",
           "validate"]
