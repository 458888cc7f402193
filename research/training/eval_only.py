"""A run's checkpoint evaluated again: `python launch.py --workdir DIR --eval_only [--step N]`.

`evaluate_checkpoint(workdir, step=None)` restores the run (research.training.run.restore:
its own config.json, checked as a launched config is, the checkpoint of `step`, by default
the latest that reads, warning of any passed over), builds its workload as
the run did (reading or generating its data), and computes

  eval/*   the periodic evaluation on the validation split, with the loop's compiled
           evaluation step (what metrics.jsonl records at an evaluation step)
  test/*   the metrics of the experiment's final report (the test split; its figures and
           texts are not written), for the experiments that have one

which it writes, with the step, to eval_step_<step>.json in the workdir. Nothing else is
written: not the checkpoints, metrics.jsonl, final_metrics.json, the report's files or the
run's lock, whose owner stays a live run's (its workdir evaluates too, at its latest
complete checkpoint). It runs in one process on the devices at hand, which
config.train.batch_size must divide as for training. Everything refused (what restore
refuses, a workdir it cannot write into, checked before anything is built or compiled, a
config today's checks or the devices refuse, the data's errors) is refused before the file
is written; its config.wandb is not used (nothing is logged to W&B).
"""

import os

import jax

from research.training import metrics as metrics_files
from research.training import parallel
from research.training.config import base_config
from research.training.loop import compiled_eval_step, device_checked, evaluate_batches, validate
from research.training.run import restore, writable

FILE = "eval_step_{step}.json"


def evaluate_checkpoint(workdir: str, step: int | None = None) -> tuple[str, dict]:
  """(the path written, {"step": step, "eval/…": …, "test/…": …}) for the run in workdir at
  the checkpoint of `step` (None: the latest that reads)."""
  run = restore(workdir, step)
  path = os.path.join(workdir, FILE.format(step=run.step))
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
    metrics_files.write_json(path, metrics)   # valid JSON, non-finite values included
  return path, metrics
