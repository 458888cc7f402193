"""train_and_evaluate end to end on a tiny config, in process."""

import contextlib
import gzip
import itertools
import json
import logging
import os
import re
import signal
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny

from research.errors import CheckpointMismatchError, ConfigError, WorkdirError
from research.training import compile as compile_module
from research.training import loop, metrics, sweep
from research.training import workdir as workdirs
from research.training.checkpoints import Checkpoints
from research.training.loop import Stopped, train_and_evaluate
from research.training.metrics import NonFiniteLossError
from research.training.sweep import run_sweep


@pytest.mark.slow
def test_trains_once_compiled_and_fills_the_workdir(tmp_path, capsys):
  workdir = str(tmp_path)
  final = train_and_evaluate(tiny.config(**{"train.profile_steps": "41,43"}), workdir, tiny.task())
  records = tiny.records(workdir)
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert [r["step"] for r in records if "train/loss" in r] == list(range(10, 61, 10))
  assert losses[-1] < 0.7 * losses[0]
  assert [r["step"] for r in records if "eval/loss" in r] == [30, 60]
  assert final["eval/loss"] == records[-1]["eval/loss"]
  assert final["perf/train_step_traces"] == 1
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20", "40", "60"]
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["hidden_size"] == 16
  with open(os.path.join(workdir, "loss.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  assert any(name.startswith("events.out.tfevents") for name in events)
  assert "step 60/60  loss" in capsys.readouterr().err
  # train.profile_steps: one trace of steps 41 … 43, each annotated, nothing compiled in it
  (trace,) = metrics.trace_files(workdir)
  assert [step for step, _ in metrics.profile_summary(trace)["steps"]] == [41, 42, 43]
  with gzip.open(trace, "rt") as f:
    names = {event.get("name") for event in json.load(f)["traceEvents"]}
  assert "backend_compile_and_load" not in names      # what JAX's trace shows for a compile
  assert any(name.endswith(".xplane.pb") for name in os.listdir(os.path.dirname(trace)))


@pytest.mark.slow
@pytest.mark.parametrize("seconds, drawn", [(3600, [10, 60]), (0, [10, 20, 30, 40, 50, 60])])
def test_the_loss_plot_is_redrawn_at_most_every_plot_seconds_and_at_the_end(
    seconds, drawn, tmp_path, monkeypatch):
  """Drawing loss.png takes 0.1-0.3 s: at an evaluation every 10 steps it cost a fifth of a
  small run's time. It is drawn at the first evaluation, then once PLOT_SECONDS have passed,
  and at the last step."""
  steps = []
  monkeypatch.setattr(loop, "PLOT_SECONDS", seconds)
  monkeypatch.setattr(loop, "plot_curves",
                      lambda history, path: steps.append(history[-1]["step"]))
  train_and_evaluate(tiny.config(**{"train.eval_every": 10}), str(tmp_path), tiny.task())
  assert steps == drawn


def _poisoned(first_bad: int):
  """The tiny task, its training batches NaN from step first_bad on."""
  task = tiny.task()
  return task._replace(build=lambda config: task.build(config)._replace(
      train_data=tiny.PoisonedStream(task.build(config).train_data, first_bad=first_bad)))


@pytest.mark.slow
def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path):
  with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 26.*checkpoint \(step 20\)"):
    train_and_evaluate(tiny.config(), str(tmp_path), _poisoned(first_bad=26))
  assert os.listdir(tmp_path / "checkpoints") == ["20"]


@pytest.mark.slow
def test_a_run_of_another_config_takes_over_a_workdir_only_where_nothing_was_saved(tmp_path,
                                                                                 capsys):
  """A run that failed before its first checkpoint (a NaN loss at step 15) leaves nothing
  to resume: the corrected command (another config) runs there, its config.json replacing
  the old one and the failed run's records set aside; a workdir with checkpoints of
  another config stays refused, untouched."""
  workdir, failed = str(tmp_path), tiny.config(**{"train.learning_rate": 0.02})
  with pytest.raises(NonFiniteLossError, match="at step 15; stopping: no checkpoint"):
    train_and_evaluate(failed, workdir, _poisoned(first_bad=15))
  attempt = (tmp_path / "metrics.jsonl").read_text()
  assert [json.loads(line)["step"] for line in attempt.splitlines()] == [10]
  capsys.readouterr()
  train_and_evaluate(tiny.config(), workdir, tiny.task())
  assert (f"workdir {workdir}: its run of another config (config.train.learning_rate 0.02 "
          "there, 0.01 now) saved no checkpoint; this config takes it over") in capsys.readouterr().err
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["train"]["learning_rate"] == 0.01
  assert (tmp_path / "metrics.after_step_0.jsonl").read_text() == attempt
  assert [r["step"] for r in tiny.records(workdir)] == [10, 20, 30, 30, 40, 50, 60, 60]
  before = _tree(tmp_path)
  with pytest.raises(ConfigError) as refused:
    train_and_evaluate(failed, workdir, tiny.task())
  assert str(refused.value) == (f"workdir {workdir} holds checkpoints of a run with a different "
                                "config (config.train.learning_rate 0.01 there, 0.02 now); use "
                                "a new --workdir")
  assert _tree(tmp_path) == before


@pytest.mark.slow
def test_a_sigterm_late_in_a_step_still_saves_the_step_it_reports(tmp_path, monkeypatch):
  """The signal lands after the step decided whether to save (inside its non-blocking
  save check), so the loop must save and stop at the next step, not report an unsaved one."""
  steps, raise_if_failed = itertools.count(1), Checkpoints.raise_if_failed

  def check_then_signal_at_step_25(self, wait=False):
    raise_if_failed(self, wait)
    if not wait and next(steps) == 25:     # called once a step, after its save decision
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(Checkpoints, "raise_if_failed", check_then_signal_at_step_25)
  with pytest.raises(Stopped) as stopped:
    train_and_evaluate(tiny.config(), str(tmp_path), tiny.task())
  step = int(re.match(r"SIGTERM at step (\d+):", str(stopped.value)).group(1))
  assert step == 26
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int) == ["20", "26"]


def _corrupt(checkpoint, data_files_only: bool) -> None:
  """Truncates every file of a checkpoint's state, or only its array data (then the
  metadata still reads and the restore itself fails)."""
  for root, _, files in os.walk(checkpoint / "state"):
    for name in files:
      if not data_files_only or os.sep + "d" in root:
        open(os.path.join(root, name), "w").close()


@pytest.mark.slow
def test_unreadable_checkpoints_are_set_aside_without_replacing_each_other(tmp_path, caplog,
                                                                            capsys):
  workdir = str(tmp_path)
  train_and_evaluate(tiny.config(), workdir, tiny.task())
  uninterrupted = tiny.records(workdir)
  for attempt, data_files_only in enumerate((False, True)):
    _corrupt(tmp_path / "checkpoints" / "60", data_files_only)
    with caplog.at_level(logging.WARNING):
      train_and_evaluate(tiny.config(), workdir, tiny.task())
    assert "checkpoint at step 60 cannot be read" in caplog.text
    assert "resuming from the checkpoint at step 40" in capsys.readouterr().err
    assert tiny.records(workdir) == uninterrupted   # one history, retrained exactly
    aside = f"metrics.after_step_40{'.1' if attempt else ''}.jsonl"
    assert [r["step"] for r in tiny.records(workdir) if r["step"] > 40] == [
        json.loads(line)["step"] for line in (tmp_path / aside).read_text().splitlines()]
  assert sorted(os.listdir(tmp_path / "checkpoints_unreadable")) == ["60", "60.1"]
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int) == ["20", "40", "60"]


@pytest.mark.parametrize("overrides, message", [
    ({"model.implementation": "banded"}, "config.model.implementation='banded' cannot do "
                                         "this: no window"),          # on any platform
    ({"model.implementation": "cudnn"}, "config.model.implementation='cudnn' cannot do this"),
], ids=["banded_without_window", "cudnn_float32"])
def test_an_attention_refusal_is_a_config_error_before_anything_is_written(tmp_path, overrides,
                                                                         message):
  """Found by tracing the steps with the real shapes (no request guessed beforehand)."""
  config = tiny.config(**{"model.kind": "transformer", "model.num_heads": 2, **overrides})
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, str(tmp_path), tiny.task())
  assert not (tmp_path / "config.json").exists() and not (tmp_path / "checkpoints").exists()


def test_a_step_over_the_devices_memory_is_refused_with_each_remedy_compiled(tmp_path,
                                                                             monkeypatch):
  """The refusal names the step's memory, the device's and what each remedy would need:
  accumulating 2 and 4 microbatches of the batch of 4 (less each time: one microbatch's
  activations at a time), recomputing blocks, bfloat16."""
  monkeypatch.setattr(loop, "memory_bytes", lambda device: 2**10)          # a 1 KiB device
  with pytest.raises(ConfigError) as refused:
    train_and_evaluate(tiny.config(**{"train.batch_size": 4}), str(tmp_path), tiny.task())
  assert not (tmp_path / "config.json").exists()
  message = str(refused.value)
  assert re.fullmatch(
      r"the train step needs [\d.]+ KiB per device \(arguments .*\) but a cpu device \(cpu\) "
      r"has 1.0 KiB; compiled with each remedy: --config\.train\.grad_accum_steps=2: [\d.]+ KiB "
      r"\(too much\), --config\.train\.grad_accum_steps=4: [\d.]+ KiB \(too much\), "
      r"--config\.model\.remat=block: [\d.]+ KiB \(too much\), --config\.model\.dtype=bfloat16: "
      r"[\d.]+ KiB \(too much\); or reduce config\.train\.batch_size \(now 4\), the model or "
      r"the sequence length, or use more devices", message)
  needed = [float(n) for n in re.findall(r"(?:needs |grad_accum_steps=\d: )([\d.]+) KiB", message)]
  assert needed[0] > needed[1] > needed[2]


class _Compiled:
  """What report.memory reads of an executable: `total` bytes, all temporaries."""

  def __init__(self, total: int):
    self.total = total

  def memory_analysis(self):
    return types.SimpleNamespace(argument_size_in_bytes=0, output_size_in_bytes=0,
                                 temp_size_in_bytes=self.total, generated_code_size_in_bytes=0,
                                 alias_size_in_bytes=0)


def test_each_group_of_remedies_stops_at_the_first_that_fits():
  def never():
    raise AssertionError("compiled after a smaller accumulation fitted")

  def refused():
    raise ConfigError("attention: cudnn cannot do this")

  groups = [[("k=2", lambda: _Compiled(3 * 2**30)), ("k=4", lambda: _Compiled(2**30)),
             ("k=8", never)], [("remat", refused)], [("bf16", lambda: _Compiled(5 * 2**30))]]
  assert compile_module.remedy_memory(groups, 2 * 2**30) == [
      "k=2: 3.00 GiB (too much)", "k=4: 1.00 GiB (fits)",
      "remat: not compiled (attention: cudnn cannot do this)", "bf16: 5.00 GiB (too much)"]


def _tree(directory) -> dict:
  return {os.path.join(root, name): os.path.getsize(os.path.join(root, name))
          for root, _, names in os.walk(directory) for name in names}


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    (lambda params: {("rnn" if k == "recurrent" else k): v for k, v in params.items()},
     r"params/recurrent/\S+ \([\d, ]+\) is in the checkpoint but not in the model"),
    (lambda params: {**params, "head": {**params["head"], "kernel": jnp.zeros((16, 2))}},
     r"params/head/kernel has shape \(16, 1\) in the checkpoint and \(16, 2\) in the model"),
])
def test_a_checkpoint_of_another_model_stops_the_run_and_moves_nothing(tmp_path, change, message):
  """The code renamed or reshaped a parameter since the checkpoints were written."""
  workdir = str(tmp_path)
  train_and_evaluate(tiny.config(), workdir, tiny.task())
  before = _tree(tmp_path)
  task = tiny.task()
  total = lambda params: sum(jnp.sum(x) for x in jax.tree.leaves(params))   # any structure
  edited = task._replace(build=lambda config: task.build(config)._replace(
      init=lambda rng: change(task.build(config).init(rng)),
      loss=lambda params, batch, rng: (total(params), {}),
      evaluate=lambda params, batch: {"total": (total(params) + 0 * batch["weight"],
                                                batch["weight"])}))
  with pytest.raises(CheckpointMismatchError, match="checkpoint at step 60 .* does not match "
                                                    "the model: " + message):
    train_and_evaluate(tiny.config(**{"train.num_steps": 80}), workdir, edited)
  assert _tree(tmp_path) == before                   # every checkpoint and metric in place


def _unreachable(*args, **kwargs):
  raise AssertionError("a refused sweep trained a point")


@pytest.mark.parametrize("case", ["a live run's", "a file", "under a file", "a single run's",
                                  "a sweep of other points", "a sweep of another config",
                                  "a point that is a file"])
def test_a_sweep_refuses_a_root_workdir_a_run_would_refuse_before_any_point(case, tmp_path,
                                                                          monkeypatch, capsys):
  """The root is checked and held before the first point: one error, nothing printed
  before it (a root under a file warned about every point's final_metrics.json first), and
  the workdir as found."""
  monkeypatch.setattr(sweep, "train", _unreachable)
  config, points = tiny.config(), [{"model.kind": "rnn"}, {"model.kind": "gru"}]
  root = str(tmp_path / "sweep")
  record = {"config": config.to_dict(), "points": ["model.kind=rnn", "model.kind=gru"]}
  (tmp_path / "file").write_text("x")
  if case == "a file":
    root = str(tmp_path / "file")
    refusal = (WorkdirError, f"workdir {root} is a file, not a directory")
  elif case == "under a file":
    root = str(tmp_path / "file" / "sweep")
    refusal = (WorkdirError, f"workdir {root} cannot be created (Not a directory)")
  elif case == "a single run's":
    tiny.write_json(f"{root}/config.json", config.to_dict())
    refusal = (WorkdirError, f"workdir {root} holds a single run (config.json); a sweep needs "
                             "a workdir of its own")
  elif case == "a sweep of other points":
    tiny.write_json(f"{root}/sweep.json", {**record, "points": ["seed=0", "model.kind=gru"]})
    refusal = (ConfigError, f"workdir {root} holds a sweep of other points (2 there, 2 now: "
                            "seed=0 there; model.kind=rnn now); use a new --workdir")
  elif case == "a sweep of another config":
    tiny.write_json(f"{root}/sweep.json", {**record, "config": tiny.config(
        **{"model.hidden_size": 8, "model.kind": "lstm"}).to_dict()})   # every point sets kind
    refusal = (ConfigError, f"workdir {root} holds a sweep with a different config "
                            "(config.model.hidden_size 8 there, 16 now); use a new --workdir")
  elif case == "a point that is a file":
    tiny.write_json(f"{root}/model.kind=gru", {})
    refusal = (WorkdirError, "the run writes a directory model.kind=gru there")
  else:
    refusal = (WorkdirError, f"workdir {root} is in use by a live run (pid {os.getpid()} on ")
  with workdirs.hold(root) if case == "a live run's" else contextlib.nullcontext():
    before = _tree(tmp_path)
    with pytest.raises(refusal[0]) as refused:
      run_sweep(config, points, root, tiny.task())
    assert refusal[1] in str(refused.value)
    assert _tree(tmp_path) == before
  assert capsys.readouterr().err == ""


def test_a_diverging_point_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
  """A NaN loss (a rate too high) ends its own point alone: recorded as diverged, in its
  final_metrics.json and the summary; the next point trains; a rerun skips both."""
  task, poisoned = tiny.task(), _poisoned(first_bad=5)
  either = task._replace(build=lambda c: (poisoned if c.train.learning_rate > 0.05
                                          else task).build(c))
  config = tiny.config(**{"train.num_steps": 20, "train.eval_every": 20})
  points = [{"train.learning_rate": 0.1}, {"train.learning_rate": 0.01}]
  rows = run_sweep(config, points, str(tmp_path), either)
  assert rows[0]["diverged"].startswith("loss is nan at step 5;"), rows[0]
  assert "eval/loss" not in rows[0] and np.isfinite(rows[1]["eval/loss"])
  assert "sweep point 0 (train.learning_rate=0.1): loss is nan" in capsys.readouterr().err
  with open(tmp_path / "train.learning_rate=0.1" / "final_metrics.json") as f:
    assert json.load(f) == {"diverged": rows[0]["diverged"]}
  assert run_sweep(config, points, str(tmp_path), either) == rows
  assert "recorded as diverged" not in capsys.readouterr().err        # skipped, not retrained
  with open(tmp_path / "summary.csv") as f:
    assert f.readline().rstrip().split(",")[:2] == ["train.learning_rate", "diverged"]


@pytest.mark.slow
def test_sweep_writes_a_summary_and_skips_finished_points(tmp_path):
  config = tiny.config(**{"train.num_steps": 20, "train.eval_every": 20})
  points = [{"model.kind": "rnn"}, {"model.kind": "gru"}]
  validated, task = [], tiny.task()
  counting = task._replace(validate=lambda c: validated.append(c.model.kind) or task.validate(c))
  rows = run_sweep(config, points, str(tmp_path), counting)
  assert validated == ["rnn", "gru"]                    # each point once
  assert [r["model.kind"] for r in rows] == ["rnn", "gru"]
  assert rows[0]["eval/loss"] != rows[1]["eval/loss"]
  done = tmp_path / "model.kind=gru" / "final_metrics.json"
  stamp = os.path.getmtime(done)
  with open(tmp_path / "sweep.json") as f:             # what a rerun must match
    assert json.load(f) == {"config": json.loads(config.to_json_best_effort()),
                            "points": ["model.kind=rnn", "model.kind=gru"]}
  trained = []                     # more steps (a resumable key): the sweep goes on there
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sweep, "_finished", lambda point_dir: None)
    patch.setattr(sweep, "train", lambda c, point_dir, *_, **__: trained.append(point_dir) or {})
    run_sweep(tiny.config(**{"train.num_steps": 40}), points, str(tmp_path), tiny.task())
  assert trained == [str(tmp_path / "model.kind=rnn"), str(tmp_path / "model.kind=gru")]
  assert run_sweep(config, points, str(tmp_path), tiny.task()) == rows
  assert os.path.getmtime(done) == stamp
  with open(tmp_path / "summary.csv") as f:
    header, *lines = f.read().splitlines()
  assert header.startswith("model.kind,") and "eval/loss" in header and len(lines) == 2
  with open(tmp_path / "summary.md") as f:
    assert f.read().splitlines()[2].startswith("| rnn |")
