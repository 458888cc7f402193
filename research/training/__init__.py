"""Runtime: the train loop, parallelism, checkpoints and metrics.

    from research.training import train_and_evaluate
    final_metrics = train_and_evaluate(config, workdir)     # config: an experiments/ get_config()
"""

from research.training.config import base_config
from research.training.loop import Preempted, train_and_evaluate, validate
from research.training.metrics import NonFiniteLossError
from research.training.sweep import run_sweep
from research.training.validation import ConfigError, apply_overrides

__all__ = ["ConfigError", "NonFiniteLossError", "Preempted", "apply_overrides", "base_config",
           "run_sweep", "train_and_evaluate", "validate"]
