"""research.training.restore, --eval_only's evaluate_checkpoint and provenance.jsonl, on runs
trained here: a kernel_regression run (2 steps, resumed to 4: two starts) whose loop hands
its final parameters to the test through its report; an nmt_dates workdir in bfloat16 as the
loop writes one (config.json, the vocabularies and lengths, an Orbax checkpoint); a run on 8
devices restored on 1, and this 1-device run on 8 (one subprocess)."""

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import warnings

import forked_launch
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny

from research import experiments
from research.errors import CheckpointMismatchError, ConfigError, WorkdirError
from research.training import ProvenanceWarning, restore, train_and_evaluate
from research.training import experiment as registry
from research.training import workdir as workdirs
from research.training.checkpoints import Checkpoints
from research.training.config import apply_overrides
from research.training.run import UnreadableCheckpointWarning, evaluate_checkpoint
from research.training.train_step import init_state, make_optimizer

sys.path.insert(0, os.path.join(tiny.ROOT, "experiments"))
import kernel_regression  # noqa: E402
import nmt_dates  # noqa: E402

pytestmark = pytest.mark.xdist_group("restore")   # one worker: its trained fixtures run once

KERNEL_REGRESSION = {"train.num_steps": 4, "train.log_every": 2, "train.eval_every": 2,
                     "train.checkpoint_every": 2}


def _leaves(tree) -> dict:
  """{'["a"]["b"]': array} of a pytree, on the host."""
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _assert_bitwise_equal(tree, reference):
  tree, reference = _leaves(tree), _leaves(reference)
  assert tree.keys() == reference.keys()
  for key, value in reference.items():
    assert tree[key].dtype == value.dtype and np.array_equal(tree[key], value), key


def _predictions(run, params=None):
  """kernel_regression's estimates on its test grid from its training points [kernels, m]."""
  x_train, y_train = run.extras["x_train"][:, None], run.extras["y_train"][:, None]
  outputs = run.model.apply({"params": run.params if params is None else params},
                            run.extras["x_test"][:, None], x_train, y_train)
  return np.stack([np.asarray(outputs[k]) for k in sorted(outputs)])


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def trained(tmp_path_factory):
  """(workdir, final metrics, the parameters the loop ended with) of a kernel_regression run
  of 2 steps resumed to 4 (checkpoints at 2 and 4)."""
  workdir = str(tmp_path_factory.mktemp("restore") / "run")
  captured = []
  experiment = tiny.capturing(experiments.get("kernel_regression"), captured)
  config = apply_overrides(kernel_regression.get_config(), KERNEL_REGRESSION)
  train_and_evaluate(apply_overrides(config, {"train.num_steps": 2}), workdir, experiment)
  final = train_and_evaluate(config, workdir, experiment)
  return workdir, final, captured[-1]


@pytest.mark.slow
def test_restore_gives_the_parameters_and_predictions_the_run_ended_with(trained):
  workdir, _, final_params = trained
  run = restore(workdir)
  _assert_bitwise_equal(run.params, final_params)
  assert np.array_equal(_predictions(run), _predictions(run, final_params))
  assert (run.step, run.steps, run.workdir) == (4, (2, 4), workdir)
  assert run.experiment is experiments.get("kernel_regression")
  with open(os.path.join(workdir, "config.json")) as f:
    assert run.config.to_dict() == json.load(f)
  assert run.history == tiny.records(workdir)
  assert {d for leaf in jax.tree.leaves(run.params) for d in leaf.sharding.device_set} == set(
      jax.devices())
  np.testing.assert_allclose(              # one point, not the grid: its sums in another order
      run.apply(run.extras["x_test"][:1, None], run.extras["x_train"][:, None],
                run.extras["y_train"][:, None])["box"],
      _predictions(run)[0][:1], rtol=1e-6)                         # "box" sorts first
  earlier = restore(workdir, step=2)
  assert earlier.step == 2 and not np.array_equal(_predictions(earlier), _predictions(run))


@pytest.mark.slow
def test_restore_writes_nothing_and_leaves_a_live_runs_lock_alone(trained):
  workdir = trained[0]
  with workdirs.hold(workdir):                 # as a live run holds it (this process's pid)
    before = tiny.files_under(workdir)
    restore(workdir)
    assert tiny.files_under(workdir) == before


@pytest.mark.slow
def test_eval_only_reproduces_the_runs_evaluations_and_report_into_a_file_of_its_own(trained):
  workdir, final, _ = trained
  before = tiny.files_under(workdir)
  path, metrics = evaluate_checkpoint(workdir)
  assert path == os.path.join(workdir, "eval_step_4.json")
  after = tiny.files_under(workdir)
  assert after.pop("eval_step_4.json") and after == before
  with open(path) as f:
    assert json.load(f) == metrics
  expected = {k: v for k, v in final.items() if k.startswith(("eval/", "test/"))}
  assert metrics == pytest.approx({"step": 4, **expected}, rel=1e-6, abs=1e-7)
  _, at_step_2 = evaluate_checkpoint(workdir, step=2)
  (record,) = [r for r in tiny.records(workdir) if r["step"] == 2 and "eval/loss" in r]
  assert {k: v for k, v in at_step_2.items() if not k.startswith("test/")} == pytest.approx(
      record, rel=1e-6, abs=1e-7)


@pytest.mark.slow
def test_provenance_records_each_start_of_the_run(trained):
  workdir = trained[0]
  records = restore(workdir).provenance
  assert records == workdirs.read_provenance(workdir)
  assert [r["step"] for r in records] == [0, 2]                # the start, then the resume
  packages = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
  git = lambda *args: subprocess.run(["git", "-C", tiny.ROOT, *args], capture_output=True,
                                     text=True)
  head = git("rev-parse", "HEAD")
  for record in records:
    assert record["argv"] == sys.argv
    assert record["versions"] == {"python": platform.python_version(),
                                  **{p: importlib.metadata.version(p) for p in packages},
                                  "research": importlib.metadata.version(
                                      "jax-attention-recurrence")}
    assert record["devices"] == {"platform": jax.devices()[0].platform,
                                 "kind": jax.devices()[0].device_kind,
                                 "count": jax.device_count(), "processes": 1}
    assert record["host"] == {"name": platform.node(), "cores": len(os.sched_getaffinity(0)),
                              "cpus": os.cpu_count(), "side_by_side": 1}
    if head.returncode == 0:
      assert record["git"]["commit"] == head.stdout.strip()
      assert isinstance(record["git"]["changes"], bool)


def test_without_git_or_a_checkout_the_record_says_so(tmp_path, monkeypatch):
  assert workdirs.git_state(str(tmp_path)) == {"commit": None, "reason": "not a git checkout"}
  monkeypatch.setenv("PATH", str(tmp_path))
  assert workdirs.git_state(tiny.ROOT) == {"commit": None, "reason": "git is not installed"}


@pytest.mark.slow
def test_restore_warns_in_one_line_when_versions_or_devices_differ(trained, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(trained[0], workdir)
  with warnings.catch_warnings():
    warnings.simplefilter("error", ProvenanceWarning)
    restore(workdir)                                            # the same: no warning
  records = workdirs.read_provenance(workdir)
  records[-1]["versions"]["jax"] = "0.4.30"
  records[-1]["devices"]["count"] = 8
  with open(os.path.join(workdir, "provenance.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with pytest.warns(ProvenanceWarning) as warned:
    restore(workdir)
  (message,) = [str(w.message) for w in warned]
  kind = jax.devices()[0].device_kind
  assert "\n" not in message
  assert (f"(jax 0.4.30 then, {jax.__version__} now; devices 8 × {kind} then, "
          f"{jax.device_count()} × {kind} now)") in message


@pytest.mark.slow
def test_restore_refuses_what_does_not_fit_today_and_writes_nothing(trained, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(trained[0], workdir)
  config_path = os.path.join(workdir, "config.json")
  with open(config_path) as f:
    config = json.load(f)

  def refused(error, step=None):
    before = tiny.files_under(str(tmp_path))
    with pytest.raises(error) as raised:
      restore(workdir, step)
    assert tiny.files_under(str(tmp_path)) == before
    return str(raised.value)

  assert refused(WorkdirError, 3) == (f"workdir {workdir} has no checkpoint of step 3; its "
                                      "checkpoints: steps 2, 4")
  tiny.write_json(config_path, {**config, "model": {**config["model"], "kernels": "gaussian,box"}})
  assert refused(CheckpointMismatchError) == (
      f"the checkpoint at step 4 in {workdir}/checkpoints does not match the model: "
      "params/triangle/log_bandwidth () is in the checkpoint but not in the model; read it "
      "with the code and config that wrote it")
  tiny.write_json(config_path, {**config, "model": {**config["model"], "dropout": 0.1}})
  assert refused(ConfigError).startswith(
      f"workdir {workdir} was written with config.model.dropout, now called "
      "config.model.dropout_rate: this version cannot restore it")


@pytest.mark.parametrize("case", ["missing", "a file", "no config.json", "a sweep",
                                  "no checkpoint", "cut config.json", "unregistered",
                                  "without build_model"])
def test_restore_refuses_a_workdir_without_a_run_to_restore_and_writes_nothing(
    case, tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  config = tiny.config().to_dict()
  message = {"missing": f"workdir {workdir} does not exist",
             "a file": f"workdir {workdir} is a file, not a run's workdir",
             "no config.json": f"workdir {workdir} holds no run (no config.json)",
             "a sweep": f"workdir {workdir} holds a sweep (sweep.json), not a single run: "
                        f"restore one of its points, e.g. {workdir}/model.kind=gru",
             "no checkpoint": f"workdir {workdir} holds no checkpoint: its run saved none yet",
             "cut config.json": f"workdir {workdir} cannot be restored: {workdir}/config.json "
                                "is cut short or not JSON",
             "unregistered": f"workdir {workdir} holds a run of the experiment 'mine', which "
                             f"is not registered here (registered: {', '.join(registry.names())}): "
                             "register it first",
             "without build_model": f"workdir {workdir} holds a run of the experiment 'mine', "
                                    "registered without build_model: register it with one to "
                                    "restore its runs"}[case]
  if case == "a file":
    (tmp_path / "run").write_text("x")
  elif case == "no config.json":
    os.makedirs(os.path.join(workdir, "checkpoints", "20"))
  elif case == "a sweep":
    tiny.write_json(f"{workdir}/sweep.json", {"config": config, "points": ["model.kind=gru"]})
    tiny.write_json(f"{workdir}/model.kind=gru/config.json", config)
  elif case == "cut config.json":
    os.makedirs(workdir)
    (tmp_path / "run" / "config.json").write_text(json.dumps(config)[:40])
  elif case != "missing":
    if case in ("unregistered", "without build_model"):
      config["experiment"] = "mine"
    if case == "without build_model":
      monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
      experiments.register("mine", validate=lambda config: None, build=lambda config: None)
    tiny.write_json(f"{workdir}/config.json", config)
  before = tiny.files_under(str(tmp_path))
  with pytest.raises((WorkdirError, ConfigError)) as refused:
    restore(workdir)
  assert str(refused.value).startswith(message), refused.value
  assert tiny.files_under(str(tmp_path)) == before


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def nmt_workdir(tmp_path_factory):
  """(workdir, config, workload, the parameters saved at step 7) of an nmt_dates run in
  bfloat16, its workdir as the loop writes one: config.json, the run's files, a checkpoint
  of its train state (here the initial one)."""
  workdir = str(tmp_path_factory.mktemp("nmt") / "run")
  config = apply_overrides(nmt_dates.get_config(), {
      "data.train_examples": 32, "data.eval_examples": 16, "data.test_examples": 16,
      "model.embed_size": 8, "model.hidden_size": 16, "train.batch_size": 16,
      "model.dtype": "bfloat16"})
  workload = experiments.get("nmt_dates").build(config)
  tiny.write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
  for name, text in workload.files.items():
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
      f.write(text)
  state = init_state(workload, make_optimizer(config.train), jax.random.key(1))
  checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), keep=3, is_async=False)
  checkpoints.save(7, state, {"step": 7})
  checkpoints.close()
  return workdir, config, workload, state.params


@pytest.mark.slow
@pytest.mark.long
def test_an_nmt_dates_run_in_bfloat16_restores_from_its_files_with_its_vocabularies(
    nmt_workdir, tmp_path):
  workdir, config, workload, params = nmt_workdir
  run = restore(workdir)
  _assert_bitwise_equal(run.params, params)
  assert {leaf.dtype for leaf in jax.tree.leaves(run.params)} == {jnp.dtype(jnp.float32)}
  batch = workload.eval_data[0]
  inputs = (batch["source"], batch["source_lengths"], batch["target_in"])
  logits, weights = run.apply(*inputs)
  reference = run.model.apply({"params": params}, *inputs)
  assert np.array_equal(logits, reference[0]) and np.array_equal(weights, reference[1])
  for name in ("source_vocab", "target_vocab"):
    with open(os.path.join(workdir, f"{name}.json"), encoding="utf-8") as f:
      assert run.extras[name].tokens == json.load(f)["tokens"]
  assert run.extras["max_source_length"] == batch["source"].shape[1]     # padded to the longest
  assert run.extras["max_target_length"] + 1 == batch["target_out"].shape[1]
  assert run.extras["level"] == "char" and run.model.dtype == "bfloat16"

  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  os.remove(os.path.join(copy, "lengths.json"))
  with pytest.raises(WorkdirError, match=f"^workdir {copy} has no lengths.json, which its "
                                         "nmt_dates model is built from"):
    restore(copy)
  tiny.write_json(os.path.join(copy, "config.json"), json.loads(
      apply_overrides(config, {"model.embed_size": 4}).to_json_best_effort()))
  shutil.copy(os.path.join(workdir, "lengths.json"), copy)
  with pytest.raises(CheckpointMismatchError) as refused:
    restore(copy)
  assert str(refused.value) == (
      f"the checkpoint at step 7 in {copy}/checkpoints does not match the model: "
      f"params/decoder/embed/embedding has shape ({run.extras['target_vocab'].size}, 8) in the "
      f"checkpoint and ({run.extras['target_vocab'].size}, 4) in the model; read it with the "
      "code and config that wrote it")


EIGHT_DEVICES = """
import json, os, sys
import jax, numpy as np
sys.path.insert(0, {tests!r})
import test_restore, tiny
from research import experiments
from research.training import restore, train_and_evaluate

captured = []
train_and_evaluate(tiny.config(), {workdir!r},
                   tiny.capturing(experiments.get("sequence_tasks"), captured))
np.savez({out!r} + "/captured.npz", **test_restore._leaves(captured[-1]))
run = restore({one_device!r})          # kernel_regression's, trained on 1 device
assert all(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(run.params))
np.savez({out!r} + "/kernel_regression.npz", predictions=test_restore._predictions(run),
         **test_restore._leaves(run.params))
"""


@pytest.mark.slow
@pytest.mark.long
def test_a_run_on_8_devices_restores_on_1_and_a_run_on_1_on_8(trained, tmp_path):
  """One subprocess with 8 CPU devices trains the tiny sequence_tasks run (jit over a mesh of
  8) and restores the kernel_regression run of 1 device; this process (1 device) restores the
  8-device run."""
  assert jax.device_count() == 1
  workdir, out = str(tmp_path / "eight"), str(tmp_path)
  code = EIGHT_DEVICES.format(tests=os.path.dirname(__file__), workdir=workdir, out=out,
                              one_device=trained[0])
  done = subprocess.run([sys.executable, "-c", code], env=tiny.environment(devices=8),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "devices 1 × cpu then, 8 × cpu now" in done.stderr     # the warning, there
  with pytest.warns(ProvenanceWarning, match="devices 8 × cpu then, 1 × cpu now"):
    run = restore(workdir)
  assert _leaves(run.params).keys() == np.load(f"{out}/captured.npz").keys()
  for key, value in np.load(f"{out}/captured.npz").items():
    assert np.array_equal(_leaves(run.params)[key], value), key
  on_eight = np.load(f"{out}/kernel_regression.npz")
  one = restore(trained[0])
  for key, value in _leaves(one.params).items():
    assert np.array_equal(on_eight[key], value), key
  assert np.array_equal(on_eight["predictions"], _predictions(one))


# Issue 45: a config.json read back, an unreadable checkpoint, a workdir that cannot be written.

def _copy(trained, tmp_path) -> str:
  """A copy of the trained kernel_regression run (checkpoints at steps 2 and 4)."""
  workdir = str(tmp_path / "copy")
  shutil.copytree(trained[0], workdir)
  return workdir


def _nested(depth: int):
  """A JSON value of `depth` groups, one inside the other: {"a": {"a": ... 1}}."""
  value = 1
  for _ in range(depth):
    value = {"a": value}
  return value


# case: (how config.json is edited: a function of its JSON, or its whole text; what the
# refusal says after "config.json does not pass today's checks: ", or after "config.json ")
EDITS = {
    "an experiment's value": (lambda c: c["model"].update(kernels="bogus"),
                              "does not pass today's checks: config.model.kernels='bogus': "
                              "'bogus' is not allowed"),
    "a shared key's type": (lambda c: c["train"].update(batch_size="16"),
                            "does not pass today's checks: config.train.batch_size='16' must be "
                            "of type int"),
    "a float for an int": (lambda c: c["train"].update(num_steps=4.5),
                           "does not pass today's checks: config.train.num_steps=4.5 must be of "
                           "type int"),
    "a bool for an int": (lambda c: c["train"].update(log_every=True),
                          "does not pass today's checks: config.train.log_every=True must be of "
                          "type int"),
    "a value for a group": (lambda c: c.update(train=[16]),
                            "does not pass today's checks: config.train=[16] must be a group of "
                            "keys (adam_b2, batch_size, checkpoint_every"),
    "a number for an address": (lambda c: c["distributed"].update(coordinator_address=5),
                                "does not pass today's checks: "
                                "config.distributed.coordinator_address=5 must be of type str"),
    "a shared value out of range": (lambda c: c["train"].update(adam_b2=1.5),
                                    "does not pass today's checks: config.train.adam_b2=1.5 must "
                                    "be in [0, 1)"),
    "a negative seed": (lambda c: c.update(seed=-1),
                        "does not pass today's checks: config.seed=-1 must be in 0 … "),
    "an experiment key's type": (lambda c: c["model"].update(grid_size="1000"),
                                 "does not pass today's checks: config.model.grid_size='1000' "
                                 "must be a number > 0"),
    "a dotted key": (lambda c: c["model"].update({"grid.size": 1}),
                     "does not pass today's checks: ConfigDict does not accept dots in field "
                     "names"),
    "a NaN": ('{"experiment": "kernel_regression", "train": {"learning_rate": NaN}}',
              "does not pass today's checks: config.train.learning_rate=nan must be a finite "
              "number"),
    "nested 40 deep": (lambda c: c["data"].update(extra=_nested(40)),
                       "nests its groups more than 16 levels deep, at 'config.data.extra.a.a."),
    "nested 100 000 deep": ('{"a":' * 100_000 + "1" + "}" * 100_000,
                            "nests its groups deeper than the JSON parser reads"),
    "a list nested 100 000 deep": ("[" * 100_000 + "]" * 100_000,
                                   "nests its groups deeper than the JSON parser reads"),
    "larger than any config": (lambda c: c.update(notes="x" * 2**21), "holds 2"),
}


def _edit(workdir: str, edit) -> None:
  path = os.path.join(workdir, "config.json")
  if isinstance(edit, str):
    with open(path, "w") as f:
      f.write(edit)
    return
  config = tiny.read_json(path)
  edit(config)
  tiny.write_json(path, config)


@pytest.mark.slow
@pytest.mark.parametrize("case", EDITS)
def test_a_config_json_edited_by_hand_is_refused_by_every_reader_naming_it_and_the_key(
    case, trained, tmp_path, monkeypatch):
  """restore, --eval_only's evaluate_checkpoint and --export's export_run read config.json in
  one place and refuse it alike, in one line, before anything is built or written."""
  from research.training import export, run  # noqa: PLC0415

  workdir = _copy(trained, tmp_path)
  edit, message = EDITS[case]
  _edit(workdir, edit)
  monkeypatch.setattr(run, "compiled_eval_step", _unreachable)
  monkeypatch.setattr(export, "export_programs", _unreachable)
  before = tiny.files_under(workdir)
  refusals = set()
  for reader in (restore, run.evaluate_checkpoint, export.export_run):
    with pytest.raises(ConfigError) as refused:
      reader(workdir)
    refusals.add(str(refused.value))
  (refusal,) = refusals
  assert refusal.startswith(f"workdir {workdir} cannot be restored: {workdir}/config.json "
                            f"{message}"), refusal
  if case == "larger than any config":
    size = os.path.getsize(os.path.join(workdir, "config.json"))
    assert f" holds {size} bytes, more than a run's config ({2**20} at most)" in refusal
  assert "\n" not in refusal
  assert tiny.files_under(workdir) == before


def _unreachable(*args, **kwargs):
  raise AssertionError("a refused command went on to compile")


@pytest.mark.slow
def test_a_config_json_of_an_earlier_version_restores_its_missing_shared_keys_at_their_defaults(
    trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  config = tiny.read_json(os.path.join(workdir, "config.json"))
  del config["wandb"], config["train"]["recurrence_learning_rate"], config["train"]["schedule"]
  config["train"]["learning_rate"] = 1                  # an int where a float is: as a flag
  tiny.write_json(os.path.join(workdir, "config.json"), config)
  run = restore(workdir)
  assert run.config.to_dict() == config and run.step == 4


@pytest.mark.slow
def test_where_the_data_was_need_not_be_here_to_restore_but_to_evaluate(nmt_workdir, tmp_path):
  """data.corpus names a file on the machine that trained the run: restoring reads no data,
  --eval_only reads it and checks it as a launched config's."""
  workdir = str(tmp_path / "copy")
  shutil.copytree(nmt_workdir[0], workdir)
  config = tiny.read_json(os.path.join(workdir, "config.json"))
  config["data"]["corpus"] = missing = str(tmp_path / "elsewhere" / "dates.tsv")
  tiny.write_json(os.path.join(workdir, "config.json"), config)
  assert restore(workdir).config.data.corpus == missing
  before = tiny.files_under(workdir)
  with pytest.raises(ConfigError, match=f"config.data.corpus='{missing}' is not a file"):
    evaluate_checkpoint(workdir)
  assert tiny.files_under(workdir) == before


def _corrupt(workdir: str, step: int, arrays_only: bool) -> None:
  """Cuts to nothing every file of the state of the checkpoint of `step`, or only its array
  data (its metadata still reads: the read itself fails), as tests/training/test_loop.py."""
  for root, _, names in os.walk(os.path.join(workdir, "checkpoints", str(step), "state")):
    for name in names:
      if not arrays_only or os.sep + "d" in root:
        open(os.path.join(root, name), "w").close()


@pytest.mark.slow
@pytest.mark.parametrize("arrays_only", [False, True], ids=["metadata", "arrays"])
def test_an_unreadable_latest_checkpoint_falls_back_to_the_latest_that_reads_as_training_does(
    arrays_only, trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  _corrupt(workdir, 4, arrays_only)
  before = tiny.files_under(workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  with pytest.warns(UnreadableCheckpointWarning) as warned:
    run = restore(workdir)
  (message,) = [str(w.message) for w in warned if w.category is UnreadableCheckpointWarning]
  assert message.startswith(f"the checkpoint at step 4 in {checkpoints} cannot be read (")
  assert message.endswith("; using step 2, the latest checkpoint that reads")
  assert "\n" not in message
  assert (run.step, run.steps) == (2, (2,))
  _assert_bitwise_equal(run.params, restore(trained[0], step=2).params)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UnreadableCheckpointWarning)
    assert restore(workdir, step=2).step == 2                 # asked for: no warning

  with pytest.raises(WorkdirError) as refused:
    restore(workdir, step=4)
  assert str(refused.value).startswith(f"the checkpoint at step 4 in {checkpoints} cannot be "
                                       "read (")
  assert str(refused.value).endswith("; the checkpoints there that read: step 2")
  _corrupt(workdir, 2, arrays_only)
  with pytest.raises(WorkdirError) as refused:
    restore(workdir)
  assert str(refused.value).startswith(f"no checkpoint of {checkpoints} reads: the checkpoint "
                                       f"at step 4 in {checkpoints} cannot be read (")
  assert f"; the checkpoint at step 2 in {checkpoints} cannot be read (" in str(refused.value)
  with pytest.raises(WorkdirError, match="; no other checkpoint there reads$"):
    restore(workdir, step=4)
  after = tiny.files_under(workdir)                 # nothing moved aside, nothing written
  assert after.keys() == before.keys()
  assert {k: v for k, v in after.items() if "/2/state/" not in k} == {
      k: v for k, v in before.items() if "/2/state/" not in k}


@pytest.mark.slow
def test_eval_only_and_export_refuse_a_workdir_they_cannot_write_before_compiling(
    trained, tmp_path, monkeypatch):
  from research.training import export, run  # noqa: PLC0415

  monkeypatch.setattr(run, "compiled_eval_step", _unreachable)
  monkeypatch.setattr(export, "export_programs", _unreachable)
  workdir = _copy(trained, tmp_path)
  before = tiny.files_under(workdir)
  with tiny.unwritable(workdir):
    for command in (run.evaluate_checkpoint, export.export_run):
      with pytest.raises(WorkdirError) as refused:
        command(workdir)
      assert str(refused.value).startswith(f"workdir {workdir} cannot be written (")
  assert tiny.files_under(workdir) == before
  for name in ("eval_step_4.json", "export_step_4"):     # (another test's, in the copy)
    shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
    if os.path.exists(os.path.join(workdir, name)):
      os.remove(os.path.join(workdir, name))
  os.makedirs(os.path.join(workdir, "eval_step_4.json"))
  (tmp_path / "copy" / "export_step_4").write_text("mine")
  for command, path, kind in ((run.evaluate_checkpoint, "eval_step_4.json", "file"),
                              (export.export_run, "export_step_4", "directory")):
    with pytest.raises(WorkdirError) as refused:
      command(workdir)
    assert str(refused.value) == (f"workdir {workdir}: {workdir}/{path} is in the way (not a "
                                  f"{kind}, which this command writes there): move it away")


@pytest.mark.slow
def test_launch_reads_a_workdir_back_in_one_line_each(trained, tmp_path):
  """launch.py --eval_only and --export: a config.json edited by hand refused in one line,
  exit 2, nothing compiled or written; an unreadable latest checkpoint passed over with one
  line `warning: ...`, an unreadable --step refused naming the step that reads."""
  root = str(tmp_path)
  edited = {}
  for case in ("an experiment's value", "nested 100 000 deep", "a shared key's type"):
    edited[case] = os.path.join(root, case.replace(" ", "_").replace("'", ""))
    shutil.copytree(trained[0], edited[case])
    _edit(edited[case], EDITS[case][0])
  corrupt = _copy(trained, tmp_path)
  _corrupt(corrupt, 4, arrays_only=True)
  commands = {f"{case} {flag}": [f"--workdir={workdir}", f"--{flag}"]
              for case, workdir in edited.items() for flag in ("eval_only", "export")}
  commands |= {"fallback eval_only": [f"--workdir={corrupt}", "--eval_only"],
               "fallback export": [f"--workdir={corrupt}", "--export"],
               "unreadable step": [f"--workdir={corrupt}", "--export", "--step=4"]}
  output = os.path.join(root, "output")
  os.makedirs(output)
  before = {workdir: tiny.files_under(workdir) for workdir in edited.values()}
  results = forked_launch.run_all(commands, output)
  for case, workdir in edited.items():
    for flag in ("eval_only", "export"):
      status, stdout, stderr = results[f"{case} {flag}"]
      assert status == 2 and not stdout, (case, flag, stderr[-2000:])
      (line,) = stderr.strip().splitlines()               # JAX logs every compile: none
      assert line.startswith(f"error: workdir {workdir} cannot be restored: {workdir}/config.json "
                             f"{EDITS[case][1]}"), line
    assert tiny.files_under(workdir) == before[workdir]
  checkpoints = os.path.join(corrupt, "checkpoints")
  for flag, written in (("eval_only", "eval_step_2.json"), ("export", "export_step_2")):
    status, stdout, stderr = results[f"fallback {flag}"]
    assert status == 0, stderr[-2000:]
    (line,) = [line for line in stderr.splitlines() if "checkpoint" in line]
    assert line.startswith(f"warning: the checkpoint at step 4 in {checkpoints} cannot be read")
    assert line.endswith("; using step 2, the latest checkpoint that reads")
    assert os.path.exists(os.path.join(corrupt, written)), stdout
  (record,) = [r for r in tiny.records(corrupt) if r["step"] == 2 and "eval/loss" in r]
  evaluated = tiny.read_json(os.path.join(corrupt, "eval_step_2.json"))
  assert {k: v for k, v in evaluated.items() if not k.startswith("test/")} == pytest.approx(
      record, rel=1e-6, abs=1e-7)
  status, _, stderr = results["unreadable step"]
  assert status == 2
  (line,) = stderr.strip().splitlines()
  assert line.startswith(f"error: the checkpoint at step 4 in {checkpoints} cannot be read (")
  assert line.endswith("; the checkpoints there that read: step 2")


@pytest.mark.parametrize("case", ["/dev/zero", "a directory"])
def test_a_config_json_that_is_no_file_is_refused_without_reading_it(case, tmp_path):
  """An endless device (read whole, it would never end) or a directory: refused, unread."""
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  path = os.path.join(workdir, "config.json")
  if case == "/dev/zero":
    os.symlink("/dev/zero", path)
  else:
    os.makedirs(path)
  with pytest.raises(WorkdirError) as refused:
    restore(workdir)
  assert str(refused.value) == f"workdir {workdir} cannot be restored: {path} is not a file"
