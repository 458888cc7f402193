"""Runtime: the train loop, parallelism, checkpoints and metrics.

    from research import experiments
    from research.training import train_and_evaluate
    final_metrics = train_and_evaluate(config, workdir, experiments.get(config.experiment))
    # config: an experiments/ get_config()

    from research.training import restore
    run = restore(workdir)             # config, model, params, history, provenance (run.py)
"""

from research.errors import ConfigError, InputError, RunFailed, UserError, WorkdirError
from research.training.config import base_config
from research.training.loop import Stopped, train, train_and_evaluate, validate
from research.training.metrics import NonFiniteLossError
from research.training.run import ProvenanceWarning, Run, UnreadableCheckpointWarning, restore
from research.training.sweep import run_sweep
from research.training.validation import apply_overrides

__all__ = ["ConfigError", "InputError", "NonFiniteLossError", "ProvenanceWarning", "Run",
           "RunFailed", "Stopped", "UnreadableCheckpointWarning", "UserError", "WorkdirError",
           "apply_overrides", "base_config", "restore", "run_sweep", "train", "train_and_evaluate",
           "validate"]
