"""Warm start (config.train.init_from, init_params) on the tiny config: a run started from a
trained one evaluates at step 0 exactly as that run's last evaluation and trains on from step
0; a pattern takes its parameters alone, the others those of a fresh initialisation with the
same seed; each refusal one ConfigError before anything compiles, the workdir as found; a
resume never reads the other run again."""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny

from research.errors import ConfigError
from research.training import loop
from research.training import workdir as workdirs
from research.training.checkpoints import (
  Checkpoints,
  WarmSource,
  leaves_by_path,
  merged,
  parse_warm_start,
  read_warm_start,
)
from research.training.loop import train_and_evaluate
from research.training.metrics import MetricsWriter
from research.training.train_step import root_key

pytestmark = pytest.mark.xdist_group("warm_start")    # one worker: the source trains once

SOURCE = {"train.num_steps": 40, "train.checkpoint_every": 20, "train.eval_every": 20}
WARM = {"train.num_steps": 10, "train.checkpoint_every": 10, "train.eval_every": 10}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """(the workdir of a tiny run of 40 steps, checkpoints at 20 and 40, its final params as
  the loop held them)."""
  workdir, captured = str(tmp_path_factory.mktemp("source")), []
  train_and_evaluate(tiny.config(**SOURCE), workdir, tiny.capturing(tiny.task(), captured))
  return workdir, jax.device_get(captured[0])


def _evaluations(workdir: str) -> list[dict]:
  """metrics.jsonl's evaluation records."""
  return [record for record in tiny.records(workdir) if "eval/loss" in record]


@pytest.mark.slow
def test_a_warm_run_evaluates_as_its_source_at_step_0_trains_on_and_resumes_its_own(
    source, tmp_path):
  workdir, params = source
  copy, warm = str(tmp_path / "copy"), str(tmp_path / "warm")
  shutil.copytree(workdir, copy)
  overrides = {**WARM, "train.init_from": f"{copy}:20"}
  train_and_evaluate(tiny.config(**overrides), warm, tiny.task())
  evaluations = _evaluations(warm)
  assert [record["step"] for record in evaluations] == [0, 10]     # its own steps, from 0
  (at_20,) = [record for record in _evaluations(workdir) if record["step"] == 20]
  assert {**evaluations[0], "step": 20} == at_20                    # the source's, exactly
  assert evaluations[1]["eval/loss"] != evaluations[0]["eval/loss"]  # and trains on
  assert [record["step"] for record in tiny.records(warm) if "train/loss" in record] == [10]
  (start,) = workdirs.read_provenance(warm)
  assert start["step"] == 0 and start["init_from"] == {
      "workdir": os.path.abspath(copy), "step": 20,
      "params_taken": len(leaves_by_path(params)), "params_total": len(leaves_by_path(params))}

  shutil.rmtree(copy)                      # the resume would fail, were it read again
  train_and_evaluate(tiny.config(**{**overrides, "train.num_steps": 20}), warm, tiny.task())
  records = workdirs.read_provenance(warm)
  assert [record["step"] for record in records] == [0, 10] and "init_from" not in records[1]
  assert [record["step"] for record in _evaluations(warm)] == [0, 10, 20]
  with pytest.raises(ConfigError, match=re.escape(
      f"(config.train.init_from '{copy}:20' there, '{workdir}' now)")):
    train_and_evaluate(tiny.config(**{**overrides, "train.init_from": workdir}), warm,
                       tiny.task())


def _fresh(config):
  """The workload of `config` and the parameters the loop initialises it with (its seed's
  first key, loop.Steps.keys)."""
  workload = tiny.task().build(config)
  key = jax.random.split(root_key(config.seed, jax.devices()[0].platform))[0]
  return workload, key, jax.device_get(workload.init(key))


@pytest.mark.slow
@pytest.mark.parametrize("pattern, taken", [
    ("recurrent/.*", {"recurrent/l0/bias_hh", "recurrent/l0/bias_ih", "recurrent/l0/kernel_hh",
                      "recurrent/l0/kernel_ih"}),
    ("head/(bias|kernel)", {"head/bias", "head/kernel"}),
    (".*kernel.*", {"head/kernel", "recurrent/l0/kernel_hh", "recurrent/l0/kernel_ih"})])
def test_a_pattern_takes_the_parameters_it_matches_whole_the_rest_fresh(source, pattern, taken):
  workdir, trained = source
  config = tiny.config(**{"train.init_from": workdir, "train.init_params": pattern})
  workload, key, fresh = _fresh(config)
  read = read_warm_start(parse_warm_start(config.train), workload.init, key,
                         jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  started = leaves_by_path(jax.device_get(merged(workload.init(key), read)))
  assert set(started) == set(leaves_by_path(fresh))
  for path, value in started.items():
    expected = leaves_by_path(trained if path in taken else fresh)[path]
    assert value.dtype == expected.dtype and np.array_equal(value, expected), path
  assert read.record["params_taken"] == len(taken) and read.record["params_total"] == 6


@pytest.mark.slow
def test_a_pattern_takes_what_fits_from_a_model_of_other_sizes(source):
  workdir, trained = source
  config = tiny.config(**{"train.init_from": workdir, "train.init_params": "head/bias",
                          "model.hidden_size": 32})
  workload, key, _ = _fresh(config)
  read = read_warm_start(parse_warm_start(config.train), workload.init, key,
                         jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  assert np.array_equal(leaves_by_path(read.params)["head/bias"], trained["head"]["bias"])


def _first_shape_difference(config, other) -> tuple[str, tuple, tuple]:
  """(path, its shape in `config`'s model, in `other`'s): the first, in the paths' order, of
  the parameters whose shapes differ (from jax.eval_shape, reading no checkpoint)."""
  shapes = [{path: leaf.shape for path, leaf in leaves_by_path(jax.eval_shape(
      tiny.task().build(c).init, jax.random.key(0))).items()} for c in (config, other)]
  path = min(p for p in shapes[0] if shapes[0][p] != shapes[1][p])
  return path, shapes[0][path], shapes[1][path]


def _refusal(tmp_path, monkeypatch, **overrides) -> str:
  """The ConfigError of a warm run with `overrides`, which compiles nothing and leaves its
  workdir as it found it."""
  def compiled(*args, **kwargs):
    raise AssertionError("a step was compiled before the refusal")

  monkeypatch.setattr(loop.Steps, "train", compiled)
  warm = str(tmp_path / "warm")
  with pytest.raises(ConfigError) as refused:
    train_and_evaluate(tiny.config(**WARM, **overrides), warm, tiny.task())
  assert tiny.files_under(warm) is None
  message = str(refused.value)
  assert "\n" not in message
  return message


@pytest.mark.slow
def test_a_model_of_other_shapes_is_refused_naming_the_first_path_and_both_shapes(
    source, tmp_path, monkeypatch):
  workdir, _ = source
  path, saved, model = _first_shape_difference(tiny.config(), tiny.config(
      **{"model.hidden_size": 32}))
  message = _refusal(tmp_path, monkeypatch, **{"train.init_from": workdir,
                                               "model.hidden_size": 32})
  assert message.startswith(f"config.train.init_from={workdir!r}: ")
  assert (f"params/{path} has shape {saved} in the checkpoint and {model} in the model"
          in message)
  assert "config.train.init_params" in message       # how to take those that fit


@pytest.mark.slow
def test_refusals_of_the_other_run_name_what_is_there(source, tmp_path, monkeypatch):
  workdir, _ = source
  empty = tmp_path / "empty"
  empty.mkdir()
  (tmp_path / "sweep").mkdir()
  (tmp_path / "sweep" / workdirs.SWEEP_RECORD).write_text("{}")
  cases = {
      str(tmp_path / "none"): f"there is no workdir {tmp_path / 'none'}",
      str(empty): f"workdir {empty} holds no checkpoint",
      str(tmp_path / "sweep"): "holds a sweep (sweep.json), not a single run; give one of its "
                               "points",
      f"{workdir}:30": f"workdir {workdir} has no checkpoint of step 30; its checkpoints: "
                       "steps 20, 40",
  }
  for init_from, expected in cases.items():
    message = _refusal(tmp_path, monkeypatch, **{"train.init_from": init_from})
    assert message.startswith(f"config.train.init_from={init_from!r}: ") and expected in message


@pytest.mark.slow
def test_a_pattern_that_matches_no_parameter_is_refused_listing_the_paths(
    source, tmp_path, monkeypatch):
  workdir, _ = source
  message = _refusal(tmp_path, monkeypatch, **{"train.init_from": workdir,
                                               "train.init_params": "recurrent"})
  assert message.startswith("config.train.init_params='recurrent' matches none of this "
                            "model's 6 parameters")
  assert "recurrent/l0/kernel_ih" in message


def test_a_pattern_that_is_no_regular_expression_is_refused_by_validate():
  with pytest.raises(ConfigError, match=r"^config.train.init_params='\(' is not a regular "):
    loop.validate(tiny.config(**{"train.init_params": "("}), tiny.task())


def test_a_workdir_of_a_version_without_the_keys_resumes():
  config = json.loads(tiny.config().to_json_best_effort())
  older = {**config, "train": {key: value for key, value in config["train"].items()
                               if key not in ("init_from", "init_params")}}
  assert workdirs.config_changes(older, config, "runs/x") == ""
  changed = {**config, "train": {**config["train"], "init_params": "head/.*"}}
  assert "config.train.init_params '.*' there, 'head/.*' now" in workdirs.config_changes(
      older, changed, "runs/x")


def test_a_checkpoint_of_other_dtypes_is_read_in_the_models(tmp_path):
  saved = {"dense": {"kernel": jnp.arange(6, dtype=jnp.float16).reshape(2, 3) / 7},
           "bias": jnp.full((3,), 0.1, jnp.bfloat16)}
  checkpoints = Checkpoints(str(tmp_path / workdirs.CHECKPOINTS), keep=1, is_async=False)
  checkpoints.save(5, {"params": saved, "opt_state": jnp.zeros(2)}, {})
  checkpoints.close()
  fresh = lambda key: {"dense": {"kernel": jnp.zeros((2, 3))}, "bias": jnp.zeros(3)}
  source = WarmSource(str(tmp_path), str(tmp_path), None, re.compile(".*"))
  read = read_warm_start(source, fresh, jax.random.key(0),
                         jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  for path, value in leaves_by_path(read.params).items():
    expected = np.asarray(leaves_by_path(saved)[path]).astype(np.float32)
    assert value.dtype == jnp.float32 and np.array_equal(value, expected), path
  assert read.record["step"] == 5


def test_a_start_from_nothing_moves_an_earlier_attempts_step_0_record_aside(tmp_path):
  lines = [json.dumps({"step": step, "eval/loss": 1.0}) + "\n" for step in (0, 10)]
  (tmp_path / workdirs.METRICS_FILE).write_text("".join(lines))
  writer = MetricsWriter(str(tmp_path), resume_step=0)
  writer.write(0, {"eval/loss": 0.5})
  writer.close()
  assert tiny.records(str(tmp_path)) == [{"step": 0, "eval/loss": 0.5}]
  assert (tmp_path / "metrics.after_step_0.jsonl").read_text() == "".join(lines)
