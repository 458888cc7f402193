"""train_and_evaluate(config, workdir): the one train loop behind every experiment."""

import contextlib
import importlib
import json
import os
import pkgutil
import signal
import statistics
import sys
import threading
import time

import jax
import numpy as np

import research.tasks
from research.training import parallel, plots
from research.training.checkpoints import Checkpoints
from research.training.metrics import MetricsWriter, NonFiniteLossError, Progress
from research.training.train_step import (
  init_state,
  learning_rate_schedule,
  make_eval_step,
  make_optimizer,
  make_train_step,
)
from research.training.validation import ConfigError, check_batch_size, check_shared

RESUMABLE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every",
                  "train.checkpoint_every", "train.keep_checkpoints")


class Preempted(Exception):
  """SIGTERM arrived; a checkpoint of the current step was written."""


def task_module(config):
  names = sorted(m.name for m in pkgutil.iter_modules(research.tasks.__path__))
  if config.task not in names:
    raise ConfigError(f"config.task={config.task!r} is not allowed; choose one of: "
                      f"{', '.join(map(repr, names))}")
  return importlib.import_module(f"research.tasks.{config.task}")


def validate(config) -> None:
  """Raises ConfigError for any bad value, before anything is built or compiled."""
  check_shared(config)
  check_batch_size(config)
  task_module(config).validate(config)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config.task` in `workdir`, resuming from its latest checkpoint.

  Returns the final metrics (also written to final_metrics.json): the last
  evaluation, the task's report, and perf/* figures (compile seconds, steps/s).
  Raises ConfigError (bad config), NonFiniteLossError (NaN/Inf loss), Preempted (SIGTERM).
  """
  validate(config)
  os.makedirs(workdir, exist_ok=True)
  _write_config(config, workdir)
  train = config.train

  # ---- Task, optimizer, initial state --------------------------------------------------
  strategy = parallel.make_strategy(train.parallelism)
  task = task_module(config).build(config)
  _write_files(task.files, workdir)
  optimizer, schedule = make_optimizer(train), learning_rate_schedule(train)
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state = jax.jit(lambda rng: init_state(task, optimizer, rng))(init_rng)

  # ---- Resume -------------------------------------------------------------------------
  checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), train.keep_checkpoints)
  start, restored = 0, checkpoints.restore_latest(state)
  if restored is not None:
    start, state, data_state = restored
    task.train_data.set_state(data_state)
    if jax.process_index() == 0:
      print(f"resuming from the checkpoint at step {start}", file=sys.stderr, flush=True)
  writer = MetricsWriter(workdir)
  writer.truncate(start)
  state = strategy.put_state(state)

  # ---- Compile --------------------------------------------------------------------------
  traces = []
  step_fn = make_train_step(task, optimizer, schedule, step_rng, strategy.axis_name)

  def traced_step(state, batch):
    traces.append(1)
    return step_fn(state, batch)

  batch = strategy.put_batch(next(task.train_data))
  compile_start = time.perf_counter()
  train_step = strategy.compile_step(traced_step, state, batch)
  compile_seconds = time.perf_counter() - compile_start
  eval_step = strategy.compile_eval(make_eval_step(task, strategy.axis_name), state.params,
                                    strategy.put_batch(task.eval_data[0]))

  def evaluate(state) -> dict:
    sums = [eval_step(state.params, strategy.put_batch(b)) for b in task.eval_data]
    sums = jax.device_get([strategy.host_metrics(s) for s in sums])
    return {f"eval/{name}": float(sum(s[name][0] for s in sums) / sum(s[name][1] for s in sums))
            for name in sums[0]}

  # ---- Loop -----------------------------------------------------------------------------
  progress, rates, pending = Progress(train.num_steps, start), [], []
  try:
    with _sigterm_flag() as sigterm:
      for step in range(start + 1, train.num_steps + 1):
        if step > start + 1:
          batch = strategy.put_batch(next(task.train_data))
        state, metrics = train_step(state, batch)
        pending.append(metrics)
        is_log = step % train.log_every == 0 or step == train.num_steps
        if is_log or sigterm.is_set():
          window = _check_finite(jax.device_get([strategy.host_metrics(m) for m in pending]),
                                 step - len(pending) + 1, checkpoints.latest_step())
          pending = []
        if is_log:
          means = {f"train/{k}": float(np.mean([m[k] for m in window])) for k in window[0]}
          rates.append(progress.update(step, means["train/loss"]))
          writer.write(step, means)
        if step % train.eval_every == 0 or step == train.num_steps:
          writer.write(step, evaluate(state))
          plots.plot_curves(writer.history, os.path.join(workdir, "loss.png"))
        if step % train.checkpoint_every == 0 or step == train.num_steps or sigterm.is_set():
          checkpoints.save(step, strategy.host_state(state), task.train_data.get_state())
        if sigterm.is_set():
          raise Preempted(f"SIGTERM at step {step}: checkpoint saved in "
                          f"{checkpoints.directory}; run the same command again to resume")
  finally:
    checkpoints.close()
    progress.close()
    writer.close()

  # ---- Final evaluation and report ------------------------------------------------------
  final = {k: v for r in writer.history if r["step"] == train.num_steps for k, v in r.items()
           if k != "step"}
  if task.report is not None:
    report = task.report(jax.device_get(strategy.host_state(state).params))
    final |= report.metrics
    _write_report(report, workdir)
  final |= {"perf/compile_seconds": compile_seconds, "perf/train_step_traces": len(traces),
            "perf/steps_per_second": statistics.median(rates[1:] or rates or [float("nan")])}
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
      json.dump(final, f, indent=2)
  return final


def _check_finite(window: list[dict], first_step: int, last_checkpoint: int | None) -> list[dict]:
  for offset, metrics in enumerate(window):
    if not np.isfinite(metrics["loss"]):
      raise NonFiniteLossError(
          f"loss is {float(metrics['loss'])} at step {first_step + offset}; stopping. The last "
          f"good checkpoint (step {last_checkpoint}) is kept.")
  return window


@contextlib.contextmanager
def _sigterm_flag():
  """An Event set by SIGTERM while the loop runs (main thread only; else never set)."""
  flag = threading.Event()
  if threading.current_thread() is not threading.main_thread():
    yield flag
    return
  previous = signal.signal(signal.SIGTERM, lambda *_: flag.set())
  try:
    yield flag
  finally:
    signal.signal(signal.SIGTERM, previous)


def _write_config(config, workdir: str) -> None:
  """Writes config.json; a workdir of a different run (other than RESUMABLE_KEYS) is refused."""
  path = os.path.join(workdir, "config.json")
  new = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    changed = sorted(k for k in set(_flatten(old)) | set(_flatten(new))
                     if _flatten(old).get(k) != _flatten(new).get(k) and k not in RESUMABLE_KEYS)
    if changed:
      raise ConfigError(f"workdir {workdir} holds a run with a different config (keys "
                        f"{', '.join(changed)}); use a new --workdir")
  if jax.process_index() == 0:
    with open(path, "w") as f:
      json.dump(new, f, indent=2)


def _flatten(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat |= _flatten(value, f"{prefix}{key}.")
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def _write_report(report, workdir: str) -> None:
  if jax.process_index() != 0:
    return
  for stem, heatmap in report.heatmaps.items():
    plots.plot_heatmap(heatmap, os.path.join(workdir, f"{stem}.png"))
  _write_files(report.texts, workdir)


def _write_files(texts: dict[str, str], workdir: str) -> None:
  if jax.process_index() != 0:
    return
  for name, text in texts.items():
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
      f.write(text)
