"""Every user error of every experiment as one line `error: ...`, exit status 2, no
traceback, before anything is compiled, and the workdir left as it was found (issue 22):
launch.py commands run as a user runs them (tests/training/forked_launch.py: one start-up
for all of them), then the recoveries (a corrected command, a sweep point's cut metrics)."""

import collections
import json
import os

import forked_launch
import pytest
import tiny

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("user_errors")]

EXPERIMENTS = os.path.join(tiny.ROOT, "experiments")
GOOD_TSV = "Source\tTarget\n( ( [MAX 2 ) 9 ) ] )\t9\n( ( [MIN 2 ) 9 ) ] )\t2\n"
LONG_SOURCE = "( ( [SM " + "1 " * 300 + ") ] )"
SWEEP_CONFIG = """
import importlib.util
_spec = importlib.util.spec_from_file_location("base", {base!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
get_config = _base.get_config


def get_sweep():
  return {points}
"""
CHAR_LM = [f"--config={EXPERIMENTS}/char_lm.py", "--config.model.kind=rnn",
           "--config.model.hidden_size=8", "--config.model.embed_size=8",
           "--config.data.context=16", "--config.data.eval_windows=4",
           "--config.data.test_lanes=1", "--config.sample.num_samples=1",
           "--config.sample.length=4", "--config.train.batch_size=4",
           "--config.train.num_steps=2", "--config.train.warmup_steps=0",
           "--config.train.log_every=1", "--config.train.eval_every=2",
           "--config.train.checkpoint_every=2"]


def _files(root: str) -> dict:
  """The users' files of the cases, made under root; {name: path}."""
  paths = {}

  def write(name: str, files: dict[str, str | bytes]) -> str:
    paths[name] = directory = os.path.join(root, name)
    os.makedirs(directory)
    for file, content in files.items():
      with open(os.path.join(directory, file), "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    return directory

  good = {f"{split}.tsv": GOOD_TSV for split in ("train", "val", "test")}
  write("superscript_target", {**good, "val.tsv": GOOD_TSV + "( ( [MAX 1 ) 2 ) ] )\t²\n"})
  write("long_row", {**good, "test.tsv": GOOD_TSV + f"{LONG_SOURCE}\t12\n"})
  unreadable = write("unreadable", good)
  os.remove(os.path.join(unreadable, "train.tsv"))
  os.symlink("/proc/self/mem", os.path.join(unreadable, "train.tsv"))   # EIO, even for root
  write("a_file", {"file": "x"})
  library = write("library", {f"m{i}.py": f"x = {i}  # a line of Python source\n" * 8
                              for i in range(60)})
  write("fixed_library", {f"m{i}.py": f"x = {i}  # a line of Python source\n" * 8
                          for i in range(60)})
  os.symlink(os.path.join(root, "nowhere.py"), os.path.join(library, "dangling.py"))
  write("corpus", {"latin1.tsv": b"caf\xe9\tcoffee\n", "pairs": ""})
  os.symlink("/proc/self/mem", os.path.join(paths["corpus"], "unreadable.tsv"))
  write("truncated", {"config.json": '{\n  "data": {\n    "eval_ex', "metrics.jsonl": ""})
  write("found", {"notes.txt": "the user's own file\n"})
  write("old_key", {"config.json": json.dumps({"model": {"dropout": 0.0}})})
  base = f"{EXPERIMENTS}/sequence_tasks.py"
  write("sweep", {"bad.py": SWEEP_CONFIG.format(base=base, points=[
      {"model.kind": "gru"}, {"model.kind": "transformer", "model.num_heads": 3}]),
                  "good.py": SWEEP_CONFIG.format(base=base, points=[{"model.kind": "gru"}])})
  return paths


def _cases(paths: dict, root: str) -> dict:
  """name: (launch.py arguments without --workdir, workdir, what the one line must say)."""
  fresh = lambda name: os.path.join(root, "runs", name)
  listops = [f"--config={EXPERIMENTS}/listops.py:preset=cpu", "--config.model.num_layers=1",
             "--config.model.hidden_size=8", "--config.model.mlp_size=8"]
  kernel = [f"--config={EXPERIMENTS}/kernel_regression.py"]
  nmt = [f"--config={EXPERIMENTS}/nmt_dates.py"]
  sequence = tiny.launch_command("")[2:3] + [f"--config.{k}={v}" for k, v in tiny.OVERRIDES.items()]
  corpus = paths["corpus"]
  return {
      "listops target ²": (
          listops + [f"--config.data.files={paths['superscript_target']}"], paths["found"],
          "val.tsv:4: expected Source<TAB>Target with a target 0–9, got the target '²'"),
      "listops target after a long source": (
          listops + [f"--config.data.files={paths['long_row']}"], fresh("long_row"),
          "test.tsv:4: expected Source<TAB>Target with a target 0–9, got the target '12' "
          "after the source '( ( [SM 1 1 1 1 1 1 1 1 1 1 1 '…"),
      "listops unreadable file": (
          listops + [f"--config.data.files={paths['unreadable']}"], fresh("unreadable"),
          "unreadable/train.tsv: cannot be read (Input/output error)"),
      "listops max_length": (
          listops + ["--config.data.max_length=1000000000"], fresh("max_length"),
          "config.data.max_length=1000000000, config.train.batch_size=32, "
          "config.data.train_examples=20000"),
      "listops data.dir is a file": (
          listops + [f"--config.data.dir={paths['a_file']}/file"], fresh("data_dir"),
          f"config.data.dir='{paths['a_file']}/file' is a file; give a directory"),
      "listops lru max_phase inf": (     # a NaN loss, then config.json refused the fix
          listops + ["--config.model.kind=lru", "--config.model.recurrence.lru.max_phase=inf"],
          fresh("max_phase"),
          "config.model.recurrence.lru.max_phase=inf must be a finite number (not inf or nan)"),
      "listops s5 dt_max 1e300": (
          listops + ["--config.model.kind=s5", "--config.model.recurrence.s5.dt_max=1e300"],
          fresh("dt_max"), "config.model.recurrence: s5: need 0 < dt_min <= dt_max <= 174, "
          "got dt_min=0.001, dt_max=1e+300"),
      "listops reformer num_hashes": (   # an OverflowError
          listops + ["--config.model.attention=reformer", "--config.model.num_hashes=100000000"],
          fresh("num_hashes"), "config.model.num_hashes: num_hashes=100000000 rounds of 16 "
          "buckets over 256 positions need sort keys up to"),
      "listops sinkhorn block_size": (   # XLA aborted, leaving run.lock
          listops + ["--config.model.attention=sinkhorn", "--config.model.block_size=2147483647"],
          paths["found"], "config.model.block_size=2147483647 must be at most the longest input, "
          "256 positions (config.data.max_length=255 and the CLS token)"),
      "listops s5 state_size": (         # a 298 GiB NumPy allocation
          listops + ["--config.model.kind=s5", "--config.model.state_size=200000"],
          fresh("state_size"), "config.model.state_size=200000, config.model.recurrence.s5."
          "blocks=1 would need "),
      "char_lm dangling symlink": (
          CHAR_LM + [f"--config.data.stdlib={paths['library']}"], fresh("char_lm"),
          f"{paths['library']}/dangling.py: a symlink to '{root}/nowhere.py', which does not "
          "exist"),
      "kernel_regression bandwidth nan": (
          kernel + ["--config.model.bandwidth=nan"], fresh("nan"),
          "config.model.bandwidth=nan must be a finite number (not inf or nan)"),
      "kernel_regression bandwidth inf": (
          kernel + ["--config.model.bandwidth=inf"], fresh("inf"),
          "config.model.bandwidth=inf must be a finite number (not inf or nan)"),
      "kernel_regression bandwidth 1e300": (
          kernel + ["--config.model.bandwidth=1e300"], fresh("big"),
          "config.model.bandwidth=1e+300 must be a number in [1e-06, 1e+06]"),
      "kernel_regression variant": (
          [kernel[0] + ":kernel=box"], fresh("variant"),
          "this config takes no variant arguments, got 'kernel=box'"),
      "nmt_dates corpus not UTF-8": (
          nmt + [f"--config.data.corpus={corpus}/latin1.tsv"], fresh("latin1"),
          "latin1.tsv:1: not UTF-8 (invalid continuation byte at byte 3)"),
      "nmt_dates unreadable corpus": (
          nmt + [f"--config.data.corpus={corpus}/unreadable.tsv"], paths["found"],
          "unreadable.tsv: cannot be read (Input/output error)"),
      "nmt_dates corpus is a directory": (
          nmt + [f"--config.data.corpus={corpus}"], fresh("corpus_dir"),
          f"config.data.corpus='{corpus}' is not a file"),
      "nmt_dates length_penalty nan": (
          nmt + ["--config.decode.length_penalty=nan"], fresh("penalty"),
          "config.decode.length_penalty=nan must be a finite number (not inf or nan)"),
      "nmt_dates too many examples": (
          nmt + ["--config.data.train_examples=2000000000"], fresh("examples"),
          "config.data.train_examples=2000000000, config.data.eval_examples=1000, "
          "config.data.test_examples=2000, config.train.batch_size=128 would need "),
      "nmt_dates unknown variant": (
          [nmt[0] + ":cel=gru"], fresh("nmt_variant"),
          "unknown variant 'cel' in --config ...:cel=gru; allowed: attention, cell, style"),
      "sequence_tasks learning_rate inf": (
          sequence + ["--config.train.learning_rate=inf"], fresh("rate"),
          "config.train.learning_rate=inf must be a finite number > 0"),
      "sequence_tasks length": (
          sequence + ["--config.data.length=2000000000"], fresh("length"),
          "config.data.length=2000000000 would need"),
      "sequence_tasks num_steps beyond int32": (
          sequence + ["--config.train.num_steps=3000000000"], fresh("steps"),
          "config.train.num_steps=3000000000 must be at most 2147483647"),
      "sequence_tasks negative seed": (
          sequence + ["--config.seed=-1"], fresh("seed"),
          "config.seed=-1 must be in 0 … 9223372036854775807"),
      "sequence_tasks truncated config.json": (
          sequence, paths["truncated"],
          f"workdir {paths['truncated']} cannot be resumed: {paths['truncated']}/config.json is "
          "cut short or not JSON (Unterminated string"),
      "sequence_tasks sweep point": (
          [f"--config={paths['sweep']}/bad.py", *sequence[1:], "--sweep"], fresh("sweep"),
          "sweep point 1 (model.kind=transformer,model.num_heads=3): config.model.num_heads=3 "
          "must divide config.model.hidden_size=16"),
      "sequence_tasks workdir of a renamed key": (
          sequence, paths["old_key"],
          f"workdir {paths['old_key']} was written with config.model.dropout, now called "
          "config.model.dropout_rate: this version cannot resume it"),
      "sequence_tasks variant without a value": (
          [sequence[0].replace("task=adding,model=lstm", "model")], fresh("no_value"),
          "variant 'model' in --config ...:model has no value; write model=VALUE"),
  }


@pytest.fixture(scope="session")   # kept when other modules' tests run between its own
def runs(tmp_path_factory):
  """Every case, then the char_lm command corrected into the workdir its refusal used."""
  root = str(tmp_path_factory.mktemp("user_errors"))
  paths = _files(root)
  cases = _cases(paths, root)
  before = {name: tiny.files_under(workdir) for name, (_, workdir, _) in cases.items()}
  commands = {name: [*argv, f"--workdir={workdir}"] for name, (argv, workdir, _) in cases.items()}
  corrected = cases["char_lm dangling symlink"][1]
  commands["char_lm corrected"] = [*CHAR_LM, f"--config.data.stdlib={root}/fixed_library",
                                   f"--workdir={corrected}"]
  commands["char_lm export"] = [f"--workdir={corrected}", "--export"]
  commands["char_lm eval_only"] = [f"--workdir={corrected}", "--eval_only"]
  sweep, point = os.path.join(root, "runs", "good_sweep"), "model.kind=gru"
  commands["sweep"] = [f"--config={paths['sweep']}/good.py", *tiny.launch_command("")[3:],
                       "--sweep", f"--workdir={sweep}"]
  commands["cut"] = {"cut": os.path.join(sweep, point, "final_metrics.json"), "keep": 40}
  commands["sweep again"] = commands["sweep"]
  output = os.path.join(root, "output")
  os.makedirs(output)
  results = forked_launch.run_all(commands, output)
  return cases, before, results, corrected, os.path.join(sweep, point)


@pytest.mark.parametrize("case", _cases(collections.defaultdict(lambda: "/user"), "/"))
def test_a_user_error_is_one_line_exit_2_and_the_workdir_stays_as_found(runs, case):
  cases, before, results, corrected, _ = runs
  status, _, stderr = results[case]
  assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
  (line,) = stderr.strip().splitlines()          # nothing compiled (JAX's log is on) or printed
  assert line.startswith("error: ") and cases[case][2] in line, line
  workdir = cases[case][1]
  if workdir != corrected:                       # (the corrected command ran there since)
    assert tiny.files_under(workdir) == before[case]   # no run.lock, no config.json, nothing
    assert os.path.exists(workdir) == bool(before[case])   # a fresh one is not even made


def test_the_corrected_command_runs_in_the_workdir_of_the_refused_one(runs):
  _, _, results, corrected, _ = runs
  status, stdout, stderr = results["char_lm corrected"]
  assert status == 0, stderr[-3000:]
  assert f"workdir: {corrected}" in stdout
  with open(os.path.join(corrected, "config.json")) as f:
    assert json.load(f)["data"]["stdlib"].endswith("fixed_library")


def test_the_corrected_run_exports_into_a_directory_of_its_own(runs):
  _, _, results, corrected, _ = runs
  status, stdout, stderr = results["char_lm export"]
  assert status == 0, stderr[-3000:]
  directory = os.path.join(corrected, "export_step_2")
  with open(os.path.join(directory, "metadata.json")) as f:
    platforms = json.load(f)["platforms"]
  assert stdout == f"exported step 2 for {', '.join(platforms)}: {directory}\n"
  assert sorted(os.listdir(directory)) == ["inference.jax_exported", "metadata.json",
                                           "params.safetensors"]
  assert not [name for name in os.listdir(corrected) if name.startswith(".export")]


def test_the_corrected_run_evaluates_again_into_a_file_of_its_own(runs):
  """launch.py --eval_only reproduces the run's last evaluation and test metrics."""
  _, _, results, corrected, _ = runs
  status, stdout, stderr = results["char_lm eval_only"]
  assert status == 0, stderr[-3000:]
  path = os.path.join(corrected, "eval_step_2.json")
  assert stdout.splitlines()[-1] == f"eval metrics: {path}"
  with open(path) as f, open(os.path.join(corrected, "final_metrics.json")) as g:
    evaluated, final = json.load(f), json.load(g)
  measured = lambda metrics: {k: v for k, v in metrics.items() if k.startswith(("eval/", "test/"))}
  assert evaluated["step"] == 2 and measured(final)            # beside them, perf/test_seconds
  assert measured(evaluated) == pytest.approx(measured(final), rel=1e-6, abs=1e-7)


def test_a_sweep_point_whose_final_metrics_were_cut_is_trained_again(runs):
  """An older version's kill while final_metrics.json was written: the point resumes from
  its last checkpoint and writes the file again, instead of the sweep stopping on it."""
  _, _, results, _, point = runs
  (status, _, _), (again, _, stderr) = results["sweep"], results["sweep again"]
  assert status == 0 and again == 0, stderr[-3000:]
  assert (f"sweep: {point}/final_metrics.json is cut short or not JSON" in stderr
          and "training the point again (it resumes from its last checkpoint)" in stderr)
  assert "resuming from the checkpoint at step 60" in stderr       # no step trained again
  with open(os.path.join(point, "final_metrics.json")) as f:
    final = json.load(f)
  last = tiny.records(point)[-1]                 # the run's own last evaluation
  assert last["step"] == 60 and final["eval/loss"] == last["eval/loss"]
