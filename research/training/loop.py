"""train_and_evaluate(config, workdir, experiment): the one train loop behind every experiment,
handed its experiment; top to bottom in `train`: the workdir's checks, the steps compiled from
shapes, resume, the loop, the report. What a run survives (a kill, a signal, a full disk, a
NaN): docs/running.md."""

import contextlib
import functools
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable

import jax
import numpy as np

from research import files
from research.errors import ConfigError, RunFailed
from research.training import command, parallel
from research.training import workdir as workdirs
from research.training.checkpoints import (
  Checkpoints,
  find_warm_start,
  read_warm_start,
  warm_started,
)
from research.training.command import Interrupted, Stopped
from research.training.compile import (
  CompiledPerShape,
  CompiledStep,
  cache_hits,
  compile_checked,
  compiled_remedies,
  memory_bytes,
  refusals_as_config_errors,
  shapes_key,
)
from research.training.config import check_devices, check_shared
from research.training.experiment import Experiment
from research.training.metrics import (
  MetricsWriter,
  NonFiniteLossError,
  Profiler,
  Progress,
  WandbRun,
  plot_curves,
  plot_heatmap,
)
from research.training.parallel import StopAgreement
from research.training.train_step import (
  STATE_METRICS,
  init_state,
  learning_rate_schedule,
  make_eval_step,
  make_optimizer,
  make_train_step,
  root_key,
)
from research.training.workdir import (
  CHECKPOINTS,
  CONFIG,
  FINAL_METRICS,
  LOSS_PLOT,
  METRICS_FILE,
  PROFILE,
  PROVENANCE,
  TENSORBOARD,
  WANDB,
  check_config,
  decoded,
  encoded,
  flatten,
  record_provenance,
  write_json,
)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PLOT_SECONDS = 30   # loss.png redrawn at an evaluation at most this often, and at the last step


class WriteError(RunFailed):
  """A file of the workdir could not be written (a full disk, say)."""


def validate(config, experiment: Experiment) -> None:
  """Raises ConfigError for any bad value, before anything is built or compiled."""
  check_shared(config)
  check_devices(config)
  validate_experiment(config, experiment)


def validate_experiment(config, experiment: Experiment) -> None:
  """experiment.validate(config), a config without the experiment's keys refused as a ConfigError."""
  try:
    experiment.validate(config)
  except (AttributeError, KeyError) as error:     # a config made without the experiment's keys
    missing = str(error).strip('"')
    raise ConfigError(f"config.experiment={config.experiment!r} needs the keys of its experiment's "
                      f"config, and this config has no {missing}; start it from that "
                      "experiment's get_config()") from None


def train_and_evaluate(config, workdir: str, experiment: Experiment) -> dict:
  """Validates `config`, then trains `experiment` in `workdir` (see `train`)."""
  validate(config, experiment)
  return train(config, workdir, experiment)


class Steps:
  """The train and eval steps of one workload, compiled from shapes once per batch shape (a
  length bucket, say), their refusals one-line ConfigErrors (compile.compile_checked); a train
  step that does not fit is compiled again with each remedy the config admits, and the message
  names what each would need (compile.compiled_remedies)."""

  def __init__(self, config, experiment: Experiment, strategy):
    self.config, self.experiment, self.strategy = config, experiment, strategy
    self.optimizer = make_optimizer(config.train, config.model.get("dtype", "float32"))
    self.schedule = learning_rate_schedule(config.train)
    self.checked = device_checked(config.train.batch_size)
    self.traces = 0                 # of the train step: 1 per batch shape, unless it retraces

  @functools.cached_property
  def keys(self) -> jax.Array:
    """[2] keys, init's and the steps': made on first use (after a data file's error, which
    comes before any compile)."""
    return jax.random.split(root_key(self.config.seed, jax.local_devices()[0].platform))

  def build(self, workload) -> "Steps":
    """Steps for `workload`: its train state's shapes and train step, nothing compiled yet."""
    self.workload, self.compiled = workload, {}
    self.shapes, self.step = state_shapes_and_step(
        workload, self.optimizer, self.schedule, self.strategy, *self.keys,
        self.config.train.grad_accum_steps, on_trace=self._count_trace)
    self.eval = compiled_eval_step(workload, self.strategy, self.shapes.params, self.checked)
    return self

  def _count_trace(self) -> None:
    self.traces += 1

  def train(self, batch) -> CompiledStep:
    """The train step compiled for `batch`'s shapes, on first sight."""
    key = shapes_key(batch)        # (CompiledPerShape's cache, inline: no frame between the
    if key not in self.compiled:   # loop and the compile in a traceback)
      rows = self.strategy.abstract_rows(batch)
      self.compiled[key] = self.checked(
          "train", functools.partial(self.strategy.compile_step, self.step, self.shapes, rows),
          remedies=functools.partial(self._remedies, rows))
    return self.compiled[key]

  def _remedies(self, rows) -> list:
    """The remedies a refusal of the train step for batches of `rows` compiles."""
    def compile_variant(variant, workload):
      shapes, step = state_shapes_and_step(workload, self.optimizer, self.schedule,
                                           self.strategy, *self.keys,
                                           variant.train.grad_accum_steps)
      return self.strategy.compile_step(step, shapes, rows)
    return compiled_remedies(self.config, jax.device_count(), self.workload,
                             self.experiment.build_shapes or self.experiment.build,
                             compile_variant)

  def compile_seconds(self) -> float:
    return sum(step.seconds for step in self.compiled.values())

  def memory_mib(self) -> float:
    """XLA's estimate of the largest compiled train step's memory on one device: arguments,
    outputs, temporaries and code, less the donated buffers the outputs reuse."""
    return max(step.memory["total"] for step in self.compiled.values()) / 2**20


def train(config, workdir: str, experiment: Experiment,
          on_start: Callable[[], None] | None = None) -> dict:
  """Trains a config that `validate` accepted in `workdir`, resuming from its latest
  checkpoint; `on_start()` is called before its first write into the workdir.

  Returns the final metrics (also written to final_metrics.json): the last
  evaluation, the workload's report, and perf/* figures (compile seconds, steps/s).
  Raises WorkdirError, ConfigError (a workdir of another config), InputError (a
  malformed data file), CheckpointMismatchError, Stopped (Interrupted for a Ctrl-C that
  ends it without a checkpoint of its step: a second one, or one before the loop), or a
  RunFailed. What a run survives: docs/running.md.
  """
  train, started, hits_before = config.train, time.perf_counter(), cache_hits()
  try:
    with workdirs.hold(workdir) as lease, WandbRun(config.wandb, workdir) as wandb_run:
      # ---- The workdir's checks (nothing written before the steps compile) -------------------
      workdirs.check_entries(workdir, files=(CONFIG, METRICS_FILE, FINAL_METRICS, LOSS_PLOT,
                                             PROVENANCE),
                             directories=(CHECKPOINTS, TENSORBOARD, WANDB, PROFILE))
      taking_over = check_config(config, workdir)
      source = find_warm_start(config, workdir)    # None: no init_from, or the run resumes
      if on_start is not None:
        lease.on_start(on_start)
      if taking_over and jax.process_index() == 0:
        lease.on_start(lambda: print(taking_over, file=sys.stderr, flush=True))

      # ---- Workload and the steps compiled from shapes (refusals before anything runs) -------
      strategy = parallel.make_strategy(train.parallelism)
      steps, taken = Steps(config, experiment, strategy), None
      if experiment.generates_data is not None and experiment.generates_data(config):
        largest = experiment.build_shapes(config)  # the largest step, before making the data
        if source is not None:                     # a warm start's refusals before it too
          taken = read_warm_start(source, largest.init, steps.keys[0], strategy.state_sharding)
        steps.build(largest).train(next(own_rows(largest.train_data)))
        steps.traces = 0
      workload = experiment.build(config)
      own_rows(workload.train_data)
      steps.build(workload)
      if source is not None and taken is None:     # before anything compiles
        taken = read_warm_start(source, workload.init, steps.keys[0], strategy.state_sharding)
      host_batch = next(workload.train_data)
      steps.train(host_batch)
      steps.eval.compile(workload.eval_data[0])
      with _writing(workdir):
        lease.start()                   # the first write into the workdir (see workdir.hold)
        _write_config(config, workdir)
        _write_files(workload.files, workdir)
      state = jax.jit(lambda rng: init_state(workload, steps.optimizer, rng),
                      out_shardings=strategy.state_sharding)(steps.keys[0])

      # ---- Resume, or a warm start ----------------------------------------------------------
      checkpoints = Checkpoints(os.path.join(workdir, CHECKPOINTS), train.keep_checkpoints)
      start, unlogged, restored = 0, [], checkpoints.restore_latest(state)
      if restored is not None:
        start, state, unlogged = restored.step, restored.state, _from_json(restored.unlogged_metrics)
        workload.train_data.set_state(restored.data)
        host_batch = next(workload.train_data)
        if jax.process_index() == 0:
          print(f"resuming from the checkpoint at step {start}", file=sys.stderr, flush=True)
      elif train.init_from:
        if taken is None:                     # its own checkpoints were there, none of them read
          taken = read_warm_start(find_warm_start(config, workdir), workload.init, steps.keys[0],
                                  strategy.state_sharding)
        state = warm_started(state, taken, steps.optimizer, strategy.state_sharding)
      with _writing(workdir):                 # the code, versions, devices and command of this start
        record_provenance(workdir, start, taken and taken.record)
      hyperparameters = flatten(json.loads(config.to_json_best_effort()))
      wandb_run.start(hyperparameters, resumed=restored is not None)
      writer = MetricsWriter(workdir, resume_step=start, config=hyperparameters, wandb_run=wandb_run)
      state = strategy.put_state(state)

      # ---- Loop -----------------------------------------------------------------------------
      progress, rates, pending, plotted = Progress(train.num_steps, start), [], [], -math.inf
      agreement = StopAgreement()
      with (_closing(checkpoints, progress, writer), _stop_signals() as stop,
            Profiler(train.profile_steps, workdir) as profiler):
        try:
          if taken is not None:               # a warm start's parameters, at step 0
            writer.write(0, evaluate_batches(steps.eval, strategy, state.params,
                                             workload.eval_data))
          for step in range(start + 1, train.num_steps + 1):
            with profiler.step(step):
              if step > start + 1:
                host_batch = next(workload.train_data)
              state, metrics = steps.train(host_batch)(state, strategy.put_rows(host_batch))
            profiler.after(step, state)
            pending.append(metrics)
            is_log = step % train.log_every == 0 or step == train.num_steps
            # read once (a signal arriving later in the step waits a step), and agreed with the
            # other processes (parallel.StopAgreement: from the step STOP_LAG back)
            stopping = agreement.stop_signal(step, stop.signum)
            if is_log or stopping:
              unlogged += _check_finite(jax.device_get([strategy.host_metrics(m) for m in pending]),
                                        step - len(pending) + 1, checkpoints.latest_step())
              pending = []
            if is_log:
              means = {f"train/{k}": float(unlogged[-1][k] if k in STATE_METRICS  # the last step's
                                           else np.mean([m[k] for m in unlogged])) for k in unlogged[0]}
              rates.append(progress.update(step, means["train/loss"]))
              writer.write(step, means)
              unlogged = []
            if step % train.eval_every == 0 or step == train.num_steps:
              writer.write(step, evaluate_batches(steps.eval, strategy, state.params,
                                                    workload.eval_data))
              if jax.process_index() == 0 and (step == train.num_steps or
                                               time.perf_counter() - plotted >= PLOT_SECONDS):
                plot_curves(writer.history, os.path.join(workdir, LOSS_PLOT))   # 0.1-0.3 s
                plotted = time.perf_counter()
            if step % train.checkpoint_every == 0 or step == train.num_steps or stopping:
              checkpoints.save(step, strategy.host_state(state), workload.train_data.get_state(),
                               _to_json(unlogged))
            checkpoints.raise_if_failed()
            if command.failed():      # another thread's exception (launch.py records them)
              checkpoints.raise_if_failed(wait=True)    # a failed save says so in its own words
              latest = checkpoints.latest_step()
              command.raise_if_failed(
                  f"stopping at step {step}: " + ("no checkpoint was written yet" if latest is None
                  else f"the last complete checkpoint (step {latest}) is kept; run the same "
                  "command again to resume from it"))
            if stopping:
              checkpoints.raise_if_failed(wait=True)
              raise Stopped(stopping, step, checkpoints.directory)
        except OSError as error:
          latest = checkpoints.latest_step()
          kept = ("no checkpoint was written yet" if latest is None else
                  f"the last complete checkpoint (step {latest}) is kept")
          raise WriteError(f"cannot write {error.filename or workdir} ({error.strerror or error}); "
                           f"stopping: {kept}. Make room and run the same command again to "
                           "resume") from error

      # ---- Final evaluation and report ------------------------------------------------------
      final = {k: v for r in writer.history if r["step"] == train.num_steps for k, v in r.items()
               if k != "step"}
      if workload.report is not None:
        report = workload.report(jax.device_get(strategy.host_state(state).params))
        final |= report.metrics
        with _writing(workdir):
          _write_report(report, workdir)
      final |= {"perf/compile_seconds": steps.compile_seconds(),
                "perf/train_step_traces": steps.traces,
                "perf/compile_cache_hits": cache_hits() - hits_before,
                "perf/steps_per_second": statistics.median(rates[1:] or rates or [float("nan")]),
                "perf/step_memory_mib": steps.memory_mib(), **_peak_memory_mib(),
                "perf/wall_seconds": time.perf_counter() - started}
      if jax.process_index() == 0:
        with _writing(workdir):
          write_json(os.path.join(workdir, FINAL_METRICS), final)
      heatmaps = [f"{stem}.png" for stem in report.heatmaps] if workload.report is not None else []
      wandb_run.images(train.num_steps, {os.path.splitext(name)[0]: os.path.join(workdir, name)
                                         for name in (LOSS_PLOT, *heatmaps)})
      wandb_run.summary(final)
      return final
  except KeyboardInterrupt:
    raise Interrupted(workdir) from None


def state_shapes_and_step(workload, optimizer, schedule, strategy, init_rng, step_rng,
                          grad_accum_steps: int, on_trace: Callable[[], None] | None = None):
  """(the train state's shapes as `strategy` places them, the train step of `workload`
  accumulating `grad_accum_steps` microbatches, calling `on_trace()` each time it is traced):
  what the loop and --compile_only compile, and each remedy of a refusal. An attention's
  refusal met while tracing the init is a ConfigError."""
  with refusals_as_config_errors():           # init traces the model's attention too
    shapes = strategy.abstract_state(jax.eval_shape(lambda r: init_state(workload, optimizer, r),
                                                    init_rng))
  return shapes, make_train_step(workload, optimizer, schedule, step_rng, strategy.axis_name,
                                 grad_accum_steps, on_trace)


def own_rows(stream):
  """The training stream, making only this process's rows of each global batch where
  several processes run (research/data/stream.py's `select`)."""
  if jax.process_count() > 1:
    stream.select(jax.process_index(), jax.process_count())
  return stream


def device_checked(batch_size: int) -> Callable[..., CompiledStep]:
  """compile_checked against the memory of this process's first device (config.train's
  batch_size named in the hint)."""
  device = jax.local_devices()[0]
  return functools.partial(compile_checked, limit=memory_bytes(device),
                           where=f"a {device.platform} device ({device.device_kind})",
                           batch_size=batch_size)


def compiled_eval_step(workload, strategy, params_shapes, checked) -> CompiledPerShape:
  """The workload's evaluation step for params of `params_shapes` (placed by the strategy),
  compiled per batch shape on first sight with `checked` (device_checked)."""
  return CompiledPerShape(lambda b: checked("eval", lambda: strategy.compile_eval(
      make_eval_step(workload, strategy.axis_name), params_shapes, strategy.abstract_batch(b))))


def evaluate_batches(eval_step: CompiledPerShape, strategy, params, batches: list) -> dict:
  """{"eval/<name>": Σ weight·numerator / Σ weight·denominator over the batches}: the
  evaluation metrics.jsonl records, of params placed by the strategy (put_state), with
  eval_step compiled per batch shape for it."""
  sums = [eval_step.compile(b)(params, strategy.put_batch(b)) for b in batches]
  sums = jax.device_get([strategy.host_metrics(s) for s in sums])
  return {f"eval/{name}": float(sum(s[name][0] for s in sums) / sum(s[name][1] for s in sums))
          for name in sums[0]}


@contextlib.contextmanager
def _writing(workdir: str):
  """An OSError of the block (a full disk) as a WriteError naming the file."""
  try:
    yield
  except OSError as error:
    raise WriteError(f"cannot write {error.filename or workdir} ({error.strerror or error}); "
                     "make room and run the same command again (it resumes from the last "
                     "checkpoint)") from error


def _peak_memory_mib() -> dict:
  """{"perf/peak_memory_mib": the most memory in use on a local device so far} where the
  backend counts it (GPU, TPU); {} on a CPU."""
  stats = [d.memory_stats() or {} for d in jax.local_devices()]
  peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
  return {"perf/peak_memory_mib": max(peaks) / 2**20} if peaks else {}


def _check_finite(window: list[dict], first_step: int, last_checkpoint: int | None) -> list[dict]:
  for offset, metrics in enumerate(window):
    if not np.isfinite(metrics["loss"]):
      kept = ("no checkpoint was written yet" if last_checkpoint is None else
              f"the last good checkpoint (step {last_checkpoint}) is kept")
      raise NonFiniteLossError(
          f"loss is {float(metrics['loss'])} at step {first_step + offset}; stopping: {kept}")
  return window


def _to_json(metrics: list[dict]) -> list[dict]:
  """Per-step host metrics -> JSON, each value with its dtype so that the logged mean of a
  window split by a stop and resume equals the uninterrupted one bit for bit (a non-finite
  value as metrics.py encodes it: valid JSON)."""
  return [{k: [encoded(float(v)), np.asarray(v).dtype.name] for k, v in m.items()}
          for m in metrics]


def _from_json(rows: list[dict]) -> list[dict]:
  return [{k: np.asarray(decoded(value), dtype) for k, (value, dtype) in row.items()}
          for row in rows]


@contextlib.contextmanager
def _closing(checkpoints: Checkpoints, progress: Progress, writer: MetricsWriter):
  """Closes the loop's writers; after a failure, their own errors do not hide the first.

  A second Ctrl-C (KeyboardInterrupt) stops at once: a checkpoint still being written is not
  waited for (the interrupt may have landed inside Orbax's save, whose wait could then never
  return); Orbax writes it under a temporary name, so an unfinished one is never taken for a
  checkpoint, and `Interrupted` names the latest complete one."""
  closers = (checkpoints.close, progress.close, writer.close)
  try:
    yield
  except BaseException as error:
    for close in closers[isinstance(error, KeyboardInterrupt):]:
      with contextlib.suppress(Exception):
        close()
    raise
  for close in closers:
    close()


class _StopFlag:
  signum: int = 0      # the first stop signal received, 0 before any


@contextlib.contextmanager
def _stop_signals():
  """A flag set by SIGINT or SIGTERM while the loop runs (main thread only; else never set).

  A second Ctrl-C while the current step finishes and saves raises KeyboardInterrupt
  (`train` reports it as Interrupted).
  """
  flag = _StopFlag()
  if threading.current_thread() is not threading.main_thread():
    yield flag
    return

  def handle(signum, frame):
    del frame
    if flag.signum == signal.SIGINT and signum == signal.SIGINT:
      raise KeyboardInterrupt
    flag.signum = flag.signum or signum

  previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
  try:
    yield flag
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def _write_config(config, workdir: str) -> None:
  """Writes config.json (once the steps compiled: a refused run leaves the workdir as it was)."""
  if jax.process_index() == 0:
    files.write_json(os.path.join(workdir, CONFIG), json.loads(config.to_json_best_effort()))


def _write_report(report, workdir: str) -> None:
  if jax.process_index() != 0:
    return
  for stem, heatmap in report.heatmaps.items():
    plot_heatmap(heatmap, os.path.join(workdir, f"{stem}.png"))
  _write_files(report.texts, workdir)


def _write_files(texts: dict[str, str], workdir: str) -> None:
  if jax.process_index() != 0:
    return
  for name, text in texts.items():
    files.write_text(os.path.join(workdir, name), text)
