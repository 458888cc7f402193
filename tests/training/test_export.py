"""research.training.export (`launch.py --export`) on workdirs written as the loop writes them
(config.json, the run's files, a checkpoint of its train state): nmt_dates (an LSTM with
attention, decoded greedily), kernel_regression (its training points inside the program) and a
sequence_tasks transformer (its CUDA attention, XLA's Triton kernel, takes no symbolic batch).
Their exports are loaded and called in one fresh process that cannot import this package and
imports only jax and numpy, and compared with the restored models; the parameters are read
back with the safetensors package and compared with flax's own flattening of the tree."""

import json
import os
import shutil
import signal
import subprocess
import sys

import flax.traverse_util
import jax
import numpy as np
import pytest
import tiny
from safetensors.numpy import load_file

from research import experiments
from research.data.text import BOS, EOS, tokenize
from research.errors import ConfigError, WorkdirError
from research.models.decoding import greedy_decode
from research.training import experiment as registry
from research.training import export, restore
from research.training.checkpoints import Checkpoints
from research.training.config import apply_overrides
from research.training.train_step import init_state, make_optimizer

# Every test reads the one export of the module's fixture: on one worker, the fixture runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("export")]

sys.path.insert(0, os.path.join(tiny.ROOT, "experiments"))
import kernel_regression  # noqa: E402
import nmt_dates  # noqa: E402
import sequence_tasks  # noqa: E402

RUNS = {
    "nmt_dates": (nmt_dates, None, {
        "data.train_examples": 32, "data.eval_examples": 16, "data.test_examples": 16,
        "model.embed_size": 8, "model.hidden_size": 16, "train.batch_size": 16}),
    "kernel_regression": (kernel_regression, None, {}),
    "sequence_tasks": (sequence_tasks, "task=adding,model=transformer", {
        "data.length": 16, "data.eval_examples": 8, "train.batch_size": 8, "model.num_layers": 1,
        "model.hidden_size": 16, "model.mlp_size": 16, "model.num_heads": 2}),
}
DATES = ["14 janvier 2024", "2024年1月14日", "3 March 1999"]
STEP = 5

# The user's process: this package blocked before anything is imported; jax, numpy, and the
# standard library's json and sys only.
USER = """
import sys
sys.modules["research"] = None
import json
import jax
import numpy as np

exports, out, dates = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])

def program(name):
  with open(exports[name] + "/inference.jax_exported", "rb") as f:
    return jax.export.deserialize(f.read())

with open(exports["nmt_dates"] + "/metadata.json", encoding="utf-8") as f:
  metadata = json.load(f)
about, length = metadata["about"], metadata["inputs"][0]["shape"][1]
vocabulary, unknown = about["source_vocabulary"], about["special_ids"]["unk"]
source = np.full((len(dates), length), about["special_ids"]["pad"], np.int32)
for row, date in enumerate(dates):
  source[row, :len(date)] = [vocabulary.index(c) if c in vocabulary else unknown for c in date]
lengths = np.array([len(date) for date in dates], np.int32)
outputs = program("nmt_dates").call(source, lengths)
np.savez(out + "/nmt_dates.npz", source=source, **outputs)

x = np.linspace(-1.0, 6.0, 5, dtype=np.float32)
np.savez(out + "/kernel_regression.npz", x=x, **program("kernel_regression").call(x))

inputs = np.random.default_rng(0).random((3, 16, 2), dtype=np.float32)
np.savez(out + "/sequence_tasks.npz", inputs=inputs, **program("sequence_tasks").call(inputs))
"""


def _workdir(root: str, name: str) -> str:
  """A workdir of the run RUNS[name] as the loop writes one, its checkpoint at STEP holding
  random parameters."""
  module, arg, overrides = RUNS[name]
  config = apply_overrides(module.get_config(arg) if arg else module.get_config(), overrides)
  workload = experiments.get(name).build(config)
  workdir = os.path.join(root, name)
  tiny.write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
  for file, text in workload.files.items():
    with open(os.path.join(workdir, file), "w", encoding="utf-8") as f:
      f.write(text)
  rng = np.random.default_rng(0)       # parameters drawn here: faster than the model's init
  shapes = jax.eval_shape(workload.init, jax.random.key(0))
  params = jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(x.dtype), shapes)
  state = init_state(workload._replace(init=lambda _: params), make_optimizer(config.train),
                     None)
  checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"), keep=3, is_async=False)
  checkpoints.save(STEP, state, {"step": STEP})
  checkpoints.close()
  return workdir


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """{name: (the restored run, export_run's directory and metadata, what the user's process
  got, the workdir's files before the export)} for each of RUNS, exported and called in one
  user process."""
  root = tmp_path_factory.mktemp("export")
  results, before = {}, {}
  for name in RUNS:
    workdir = _workdir(str(root), name)
    before[name] = tiny.files_under(workdir)
    results[name] = (restore(workdir), *export.export_run(workdir))
  user = subprocess.run([sys.executable, "-I", "-c", USER,
                         json.dumps({name: r[1] for name, r in results.items()}), str(root),
                         json.dumps(DATES)],
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600)
  assert user.returncode == 0, user.stderr[-3000:]
  return {name: (*r, dict(np.load(root / f"{name}.npz")), before[name])
          for name, r in results.items()}


def test_a_process_without_this_package_runs_the_exports_as_the_restored_models(exported):
  run, _, metadata, got, _ = exported["nmt_dates"]
  vocabulary, length = run.extras["source_vocab"], run.extras["max_source_length"]
  source = np.zeros((len(DATES), length), np.int32)
  for row, date in enumerate(DATES):                  # the dates as the package encodes them
    source[row, :len(date)] = vocabulary.encode(tokenize(date, "char"))
  assert np.array_equal(got["source"], source)
  tokens, weights = greedy_decode(run.model, run.params, source,
                                  np.array([len(d) for d in DATES], np.int32), bos_id=BOS,
                                  eos_id=EOS, max_len=run.extras["max_target_length"] + 1)
  assert np.array_equal(got["tokens"], tokens)
  np.testing.assert_allclose(got["attention"], weights, rtol=1e-5, atol=1e-6)
  assert [o["name"] for o in metadata["outputs"]] == ["attention", "tokens"]
  assert metadata["inputs"][0]["shape"] == ["b", length]

  run, _, metadata, got, _ = exported["kernel_regression"]
  estimates = jax.jit(run.apply)(got["x"][:, None], run.extras["x_train"][:, None],
                                 run.extras["y_train"][:, None])
  assert set(estimates) == {"gaussian", "box", "triangle"} == {o["name"]
                                                                for o in metadata["outputs"]}
  for kernel, value in estimates.items():
    np.testing.assert_allclose(got[kernel], value[:, 0], rtol=1e-5, atol=1e-6)

  run, _, metadata, got, _ = exported["sequence_tasks"]
  np.testing.assert_allclose(got["outputs"], jax.jit(run.apply)(got["inputs"]), rtol=1e-5,
                             atol=1e-6)
  assert metadata["programs"][0]["batch"] == "any" and "cpu" in metadata["programs"][0][
      "platforms"]


def test_the_parameters_are_a_safetensors_file_of_the_tree_as_flax_flattens_it(exported):
  for name, (run, directory, metadata, _, _) in exported.items():
    assert sorted(os.listdir(directory)) == sorted(
        ["params.safetensors", "metadata.json"] + [p["file"] for p in metadata["programs"]])
    expected = flax.traverse_util.flatten_dict(jax.device_get(run.params), sep="/")
    read = load_file(os.path.join(directory, "params.safetensors"))
    assert read.keys() == expected.keys(), name
    assert name != "nmt_dates" or "encoder/embed/embedding" in read
    for key, value in expected.items():
      assert read[key].dtype == np.float32 and np.array_equal(read[key], value), (name, key)
    assert (metadata["experiment"], metadata["step"]) == (name, STEP)
    assert metadata["config"] == run.config.to_dict()
    assert metadata["jax_version"] == jax.__version__


def test_an_export_writes_its_directory_alone_and_exporting_again_replaces_it(exported):
  run, directory, _, _, before = exported["kernel_regression"]
  first = tiny.files_under(run.workdir)
  assert {k: v for k, v in first.items() if not k.startswith("export_step_5/")} == before
  with open(os.path.join(directory, "stale"), "w") as f:
    f.write("from an earlier export")
  assert export.export_run(run.workdir, step=STEP)[0] == directory
  again = tiny.files_under(run.workdir)
  assert again.keys() == first.keys()               # the stale file gone, no temporary left
  assert again["export_step_5/metadata.json"] == first["export_step_5/metadata.json"]


@pytest.mark.aot
def test_the_cuda_and_tpu_programs_are_exported_and_name_their_unguaranteed_kernels(
    exported, monkeypatch):
  """The sequence_tasks transformer's CUDA attention is XLA's Triton kernel, which needs a
  fixed batch: its own program, whose Triton calls jax.export refuses unless told."""
  for name in ("nmt_dates", "kernel_regression"):
    (program,) = exported[name][2]["programs"]
    assert program["platforms"] == ["cpu", "cuda", "tpu"] and program["batch"] == "any"
  run, directory, metadata, _, _ = exported["sequence_tasks"]
  assert metadata["platforms"] == ["cpu", "cuda", "tpu"] and not metadata["not_exported"]
  symbolic, fixed = metadata["programs"]
  assert (symbolic["platforms"], fixed["platforms"], fixed["batch"]) == (["cpu", "tpu"],
                                                                         ["cuda"], 8)
  with open(os.path.join(directory, fixed["file"]), "rb") as f:
    assert jax.export.deserialize(f.read()).platforms == ("cuda",)
  kernel = "__gpu$xla.gpu.triton"
  assert fixed["custom_calls_without_compatibility_guarantee"] == [kernel]
  monkeypatch.setattr(export, "export_checks_to_disable", lambda: [])
  inference = run.experiment.inference(run.config, run.model, run.extras)
  _, failures = export.export_programs(inference, jax.device_get(run.params), ("cpu", "cuda"),
                                       8)
  assert failures["cuda"].startswith("Cannot serialize code with custom calls whose targets "
                                     "have no compatibility guarantees")


def test_an_experiment_without_inference_is_refused_before_anything_is_written(
    exported, tmp_path, monkeypatch):
  run = exported["kernel_regression"][0]
  workdir = str(tmp_path / "run")
  shutil.copytree(run.workdir, workdir, ignore=shutil.ignore_patterns("export_step_*"))
  tiny.write_json(os.path.join(workdir, "config.json"), {**run.config.to_dict(),
                                                         "experiment": "mine"})
  monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
  experiments.register("mine", validate=run.experiment.validate, build=run.experiment.build,
                       build_model=run.experiment.build_model)
  before = tiny.files_under(workdir)
  with pytest.raises(ConfigError) as refused:
    export.export_run(workdir)
  assert str(refused.value) == (f"workdir {workdir} holds a run of the experiment 'mine', "
                                "registered without inference: register it with one to export "
                                "its runs")
  assert tiny.files_under(workdir) == before


# A killed export (issue 45): a child process exports the kernel_regression run, for the CPU
# alone, and stops or kills itself at one point of `publish`.
KILLED = """
import os, signal, sys
import research.experiments  # the built-in experiments, registered for restoring
from research.training import export

workdir, point = sys.argv[1], sys.argv[2]
halt = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGSTOP if point == "writing"
                                       else signal.SIGKILL)
if point == "writing":                               # stopped, then killed, by the test
  export.save_file = halt
elif point == "after the exchange":
  exchange = export._exchange
  export._exchange = lambda first, second: exchange(first, second) and halt()
else:                                                # where no exchange is possible
  export._exchange = lambda first, second: False
  rename = os.rename

  def renaming(source, target):
    rename(source, target)
    if target.endswith(export.OLD):
      halt()

  os.rename = renaming
export.export_run(workdir, platforms=("cpu",))
"""


def _leftovers(workdir: str) -> list[str]:
  return sorted(name for name in os.listdir(workdir) if name.startswith(".export_step_"))


def _is_old(directory: str) -> bool:
  """Whether `directory` is the export the test marked before the killed one."""
  return os.path.exists(os.path.join(directory, "old"))


@pytest.mark.parametrize("point", [pytest.param("writing", marks=pytest.mark.long),
                                   pytest.param("after the exchange", marks=pytest.mark.long),
                                   "between the two renames"])
def test_a_killed_export_leaves_the_old_or_the_new_and_the_next_export_cleans_up(
    point, exported, tmp_path, monkeypatch):
  """At each point a kill leaves the old export or the new one whole at export_step_5 (but
  between the two renames of a filesystem without an exchange: the old one aside, which the
  next export puts back); a live export's temporary is neither removed nor written over by
  another export; the next export removes what the dead one left, and only that."""
  run = exported["kernel_regression"][0]
  workdir = str(tmp_path / "run")
  shutil.copytree(run.workdir, workdir)
  directory = os.path.join(workdir, "export_step_5")
  (tmp_path / "run" / "export_step_5" / "old").write_text("the export before")
  mine = [".export_step_5.notes", ".export_step_5.abcdefgh.kept"]   # not an export's names
  os.makedirs(os.path.join(workdir, mine[0]))
  (tmp_path / "run" / mine[1]).write_text("mine")
  child = subprocess.Popen([sys.executable, "-c", KILLED, workdir, point],
                           env={**os.environ, "JAX_PLATFORMS": "cpu"}, stderr=subprocess.PIPE)
  if point == "writing":
    _, status = os.waitpid(child.pid, os.WUNTRACED)       # stopped with its temporary open
    assert os.WIFSTOPPED(status), child.stderr.read()[-3000:]
    (temporary,) = [name for name in _leftovers(workdir) if name not in mine]
    monkeypatch.setattr(export, "export_programs", _unreachable)
    with pytest.raises(WorkdirError) as refused:
      export.export_run(workdir)
    assert str(refused.value) == (f"workdir {workdir} is being exported by another live "
                                  "process: wait for it to end, then export again")
    assert temporary in _leftovers(workdir)
    monkeypatch.undo()
    child.kill()
  assert child.wait(timeout=600) == -signal.SIGKILL, child.stderr.read()[-3000:]
  child.stderr.close()

  left = [name for name in _leftovers(workdir) if name not in mine]
  if point == "between the two renames":
    assert not os.path.exists(directory)
    (old,) = [name for name in left if name.endswith(".old")]
    assert _is_old(os.path.join(workdir, old))
  else:
    assert _is_old(directory) == (point == "writing")
    assert sorted(os.listdir(directory)) == sorted(
        ["params.safetensors", "inference.jax_exported", "metadata.json"]
        + ["old"] * _is_old(directory))
    assert len(left) == 1 and _is_old(os.path.join(workdir, left[0])) == (point != "writing")
  with export.exporting(workdir):
    assert export.remove_dead_exports(workdir) == sorted(left)
  assert _leftovers(workdir) == sorted(mine)
  assert _is_old(directory) == (point != "after the exchange")
  assert export.export_run(workdir, platforms=("cpu",))[0] == directory
  assert not _is_old(directory) and _leftovers(workdir) == sorted(mine)
  assert tiny.read_json(os.path.join(directory, "metadata.json"))["step"] == STEP


def test_a_second_export_removes_what_a_killed_one_left(exported, tmp_path):
  """The next export itself (not only remove_dead_exports) cleans up, and puts an old export
  left aside back before it replaces it."""
  run = exported["kernel_regression"][0]
  workdir = str(tmp_path / "run")
  shutil.copytree(run.workdir, workdir)
  os.rename(os.path.join(workdir, "export_step_5"),
            os.path.join(workdir, ".export_step_5.k1ll3d_x.old"))
  os.makedirs(os.path.join(workdir, ".export_step_5.k1ll3d_x", "partial"))
  os.makedirs(os.path.join(workdir, ".export_step_3.a0000000"))
  directory, _ = export.export_run(workdir, platforms=("cpu",))
  assert _leftovers(workdir) == [] and sorted(os.listdir(directory)) == [
      "inference.jax_exported", "metadata.json", "params.safetensors"]


def _unreachable(*args, **kwargs):
  raise AssertionError("a refused export went on to compile")
