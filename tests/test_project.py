"""project.py: a benchmark's output shown and kept in results/NAME.md, whole, with the
command that made it, only for that command and only when it succeeds; a bad name refused
in one line before anything is set up; the test tiers (the linter first, `quick` without
the slow and the `aot` tests, `test` both tiers, each in its own environment) and the
environments' installations."""

import importlib
import importlib.util
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("project", os.path.join(ROOT, "project.py"))
project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(project)


def test_a_benchmarks_output_is_recorded_with_its_command(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(project, "PYTHON", sys.executable)
  path = tmp_path / "results" / "demo.md"
  script = "print('| L | speed |'); print('|---|---|'); print('| 1024 | 2.00× |')"
  assert project.run_recorded(["-c", script], path) == 0
  header, *table = path.read_text(encoding="utf-8").splitlines()
  assert header.startswith("<!-- python3 project.py bench demo ") and header.endswith("-->")
  assert table == ["| L | speed |", "|---|---|", "| 1024 | 2.00× |"]
  assert capsys.readouterr().out.splitlines() == table


def test_a_failed_benchmark_keeps_the_previous_file(tmp_path, monkeypatch):
  monkeypatch.setattr(project, "PYTHON", sys.executable)
  path = tmp_path / "demo.md"
  path.write_text("kept\n", encoding="utf-8")
  assert project.run_recorded(["-c", "print('half'); raise SystemExit(3)"], path) == 3
  assert path.read_text(encoding="utf-8") == "kept\n"
  assert not list(tmp_path.glob("*.tmp"))


def test_bench_refuses_an_unknown_benchmark_before_setting_anything_up(capsys, monkeypatch):
  monkeypatch.setattr(project, "ensure_environment", lambda *_: pytest.fail("set up"))
  for argv in (["bench", "bogus"], ["bench", "--lengths=1024"], ["bogus"]):
    assert project.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown "), err
    names = project.BENCHMARKS + project.ON_REQUEST if argv[0] == "bench" else project.TASKS
    assert all(name in err for name in names), err


def test_only_a_benchmarks_recorded_command_writes_its_results_file():
  """`bench NAME` runs the arguments results/NAME.md records and writes it; other arguments
  (a partial or different table) only print; plain `bench` runs the default three."""
  results = pathlib.Path(ROOT) / "results"
  assert project.benchmark_runs(["recurrent"]) == [
      (["benchmarks/recurrent.py", "--section", "all"], results / "recurrent.md")]
  assert project.benchmark_runs(["recurrent", "--section", "all"]) == [
      (["benchmarks/recurrent.py", "--section", "all"], results / "recurrent.md")]
  for argv in (["recurrent", "--section", "cells"], ["compile_targets", "--targets=t4"],
               ["attention", "--help"], ["accelerator"]):
    (command, path), = project.benchmark_runs(argv)
    assert command == [f"benchmarks/{argv[0]}.py", *argv[1:]] and path is None
  assert [path.name for _, path in project.benchmark_runs([])] == [
      "recurrent.md", "attention.md", "attention_bound.md"]
  for name in project.RECORDED:   # each recorded file's first line names its command
    header = (results / f"{name}.md").read_text(encoding="utf-8").splitlines()[0]
    command = shlex.join([name, *project.RECORDED[name]])
    assert header.startswith(f"<!-- python3 project.py bench {command}; commit "), header


def test_the_test_tiers_stop_at_the_linter_and_quick_leaves_out_slow_and_aot(monkeypatch):
  """`quick` runs the unit tests in the toolchain-free environment; `test` runs them there
  too, then the slow and aot tests in .venv, and `long` the long tier: every test once, in
  one of the three (each tier's selection leaves out the others')."""
  calls = []
  monkeypatch.setattr(project, "ensure_environment",
                      lambda environment, extras: calls.append((environment.name, extras)))
  status = {"lint": 1, "tiers": []}

  def call(command, cwd):
    calls.append((pathlib.Path(command[0]).parents[1].name, command[1:]))
    return status["lint"] if command[1:] == project.LINT else status["tiers"].pop(0)

  monkeypatch.setattr(project.subprocess, "call", call)
  assert project.main(["quick", "-x"]) == 1
  assert calls == [(".venv-quick", "test"), (".venv-quick", project.LINT)]   # no test ran
  calls.clear()
  status.update(lint=0, tiers=[0])
  assert project.main(["quick", "-x"]) == 0
  environment, command = calls[2]
  assert environment == ".venv-quick" and command[-1] == "-x"
  assert command[command.index("-m", 1) + 1] == "not slow and not aot and not long"
  calls.clear()
  status["tiers"] = [0, 0]
  assert project.main(["test", "-x"]) == 0
  assert calls[:2] == [(".venv-quick", "test"), (".venv", "test,aot")]
  (unit_venv, unit), (rest_venv, rest) = calls[3:]
  assert unit_venv == ".venv-quick" and rest_venv == ".venv"
  selections = {unit[unit.index("-m", 1) + 1], rest[rest.index("-m", 1) + 1]}
  assert selections == {"not slow and not aot and not long", "(slow or aot) and not long"}
  calls.clear()
  status["tiers"] = [0]
  assert project.main(["long"]) == 0
  assert calls[0] == (".venv", "test,aot") and calls[2][1][calls[2][1].index("-m", 1) + 1] == "long"
  for statuses, expected in (([1, 0], 1), ([0, 3], 3), ([5, 0], 0), ([0, 5], 0), ([5, 5], 5),
                             ([2, 1], 2)):   # 5: a tier the arguments left without tests
    status["tiers"] = list(statuses)
    assert project.main(["test"]) == expected, statuses


def test_the_linter_is_installed_with_the_tests_and_flags_what_the_config_selects(tmp_path):
  """ruff (the `test` extra) with pyproject.toml's [tool.ruff]: an unused import (F401) and a
  mutable default (B006: bugbear, which only the config selects) fail; clean code passes."""
  config = os.path.join(ROOT, "pyproject.toml")
  (tmp_path / "bad.py").write_text("import os\n\n\ndef f(x=[]):\n  return x\n",
                                   encoding="utf-8")
  (tmp_path / "good.py").write_text("def f(x=None):\n  return x\n", encoding="utf-8")
  check = lambda name: subprocess.run(
      [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", config, name],
      cwd=tmp_path, capture_output=True, text=True)
  bad = check("bad.py")
  assert bad.returncode == 1 and "F401" in bad.stdout and "B006" in bad.stdout, bad.stdout
  assert check("good.py").returncode == 0


def test_an_environment_with_more_extras_serves_a_task_that_needs_fewer(tmp_path):
  (tmp_path / ".installed-test,aot").write_text("digest", encoding="utf-8")
  (tmp_path / ".installed-base").write_text("old digest", encoding="utf-8")
  assert project.installed(tmp_path, "test", "digest")
  assert project.installed(tmp_path, "test,aot", "digest")
  assert project.installed(tmp_path, "", "digest")
  assert not project.installed(tmp_path, "test,aot,cuda", "digest")
  assert not project.installed(tmp_path, "test", "new digest")   # pyproject.toml changed
  assert not project.installed(tmp_path / "other", "", "digest")   # another environment


# (benchmark, arguments, how its `error:` line starts, what else it must show)
BAD_BENCHMARK_ARGUMENTS = [
    ("attention", ["--lengths=abc"], "argument --lengths", "positive integers"),
    ("attention", ["--lengths="], "argument --lengths", "positive integers"),
    ("attention", ["--lengths=512,512"], "argument --lengths", "twice"),
    ("attention", ["--repeats=-1"], "argument --repeats", "positive integer"),
    ("attention", ["--pause=nan"], "argument --pause", ">= 0"),
    ("attention", ["--inner=0"], "argument --inner", "positive integer"),
    ("attention", ["--bogus=1"], "unrecognized arguments", "--bogus"),
    ("attention", ["--gpu_shapes=4096"], "argument --gpu_shapes", "8192"),
    ("attention", ["--variants=bogus"], "argument --variants", "splits=1"),
    ("attention_bound", ["--length=-1"], "argument --length", "multiple of 256"),
    ("attention_bound", ["--length=1000"], "argument --length", "multiple of 256"),
    ("compile_targets", ["--targets=bogus"], "argument --targets", "tpu-v5e-1"),
    ("compile_targets", ["--targets="], "argument --targets", "tpu-v5e-1"),
    ("compile_targets", ["--experiments=bogus"], "argument --experiments", "nmt_dates"),
    ("compile_targets", ["--attention_targets=h100,bogus"], "argument --attention_targets", "t4"),
    ("lra_efficiency", ["--tpu=bogus"], "argument --tpu", "tpu-v4-1"),
    ("lra_efficiency", ["--tpu=h100"], "argument --tpu", "tpu-v4-1"),
    ("lra_efficiency", ["--attentions=full,bogus"], "argument --attentions", "performer"),
    ("lra_efficiency", ["--memory_lengths=4096"], "argument --memory_lengths", "two lengths"),
    ("lra_efficiency", ["--memory_lengths=16384,4096"], "argument --memory_lengths", "shorter first"),
    ("lra_efficiency", ["--lengths=1024", "--tpu_lengths=4096"], "argument --tpu_lengths", "--lengths"),
    ("lra_efficiency", ["--batch=0"], "argument --batch", "positive integer"),
    ("recurrent", ["--shapes=bogus"], "argument --shapes", "all"),
    ("recurrent", ["--cells="], "argument --cells", "lstm"),
    ("recurrent", ["--peers=cudnn"], "argument --peers", "torch"),
    ("recurrent", ["--linear_layers=S4"], "argument --linear_layers", "LRU"),
    ("kernel_resources", ["--shape=1,2,3"], "argument --shape", "B,L,H,d"),
    ("kernel_resources", ["--tilings=wide"], "argument --tilings", "d128"),
    ("recurrent", ["--dtypes=float16"], "argument --dtypes", "bfloat16"),
    ("recurrent", ["--section=bogus"], "argument --section", "linear"),
    ("recurrent", ["--linear_shape=1,32"], "argument --linear_shape", "B,H,N"),
    ("recurrent", ["--linear_pause=-1"], "argument --linear_pause", ">= 0"),
    ("recurrent", ["--compile_target=bogus"], "argument --compile_target", "tpu-v5e-1"),
    ("recurrent", ["--compile_lengths=0"], "argument --compile_lengths", "positive integers"),
    # sizes whose step would not fit the host's memory: refused by the estimate, not run
    ("attention", ["--lengths=512,2147483647"], "--lengths up to 2147483647 (batch 1) would "
     "need 32768.00 GiB of host memory", "available"),   # 8 arrays of NumPy's 4.00 TiB each
    ("attention_bound", ["--length=2147483392"], "--length=2147483392 would need", "available"),
    ("recurrent", ["--section=linear", "--linear_shape=2147483647,2147483647,2147483647",
                   "--lengths=1024", "--compile_target="], "--linear_shape=2147483647,"
     "2147483647,2147483647 and --lengths up to 1024 would need", "available"),
    ("recurrent", ["--section=linear", "--linear_shape=1,32,2147483647", "--compile_target="],
     "--linear_shape=1,32,2147483647 and --lengths up to 16384 would need", "available"),
    ("lra_efficiency", ["--batch=2147483647", "--tpu=", "--lengths=1024",
                        "--memory_lengths=1024,2048"],
     "--batch=2147483647 and --lengths up to 1024 would need", "available"),
    ("lra_efficiency", ["--lengths=1024,2147483647", "--tpu=", "--attentions=linear"],
     "--batch=1 and --lengths up to 2147483647 would need", "for a training step, but"),
    ("sweep_workers", ["--workers=64"], "argument --workers", "give 2 to"),
    ("sweep_workers", ["--steps=0"], "argument --steps", "positive integer"),
    ("accelerator", ["--output=."], "argument --output", "directory"),
    ("accelerator", ["--output=pyproject.toml/report.md"], "argument --output", "under a file"),
]


@pytest.mark.xdist_group("benchmark_arguments")   # one worker imports the benchmarks
@pytest.mark.parametrize("name, argv, names, shows", BAD_BENCHMARK_ARGUMENTS)
def test_a_benchmark_refuses_a_bad_argument_in_one_line_before_it_starts(
    name, argv, names, shows, capsys, monkeypatch):
  """Each benchmark's arguments parsed as its main() does: exit status 2 and one line on
  stderr naming the argument and what it allows (nothing compiled, timed or written)."""
  monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
  monkeypatch.chdir(ROOT)
  err = _refusal(importlib.import_module(name), argv, capsys)
  assert err.startswith(f"error: {names}") and shows in err, err


def _refusal(module, argv: list[str], capsys) -> str:
  """What module.parse_arguments(argv) prints, one line, exiting with status 2."""
  with pytest.raises(SystemExit) as exit_:
    module.parse_arguments(argv)
  err = capsys.readouterr().err
  assert exit_.value.code == 2 and err.count("\n") == 1, err
  return err


def test_a_benchmark_that_runs_out_of_memory_ends_in_one_line_with_exit_status_1(monkeypatch):
  """NumPy's MemoryError and its ValueError for an array too big to index, and XLA's
  RESOURCE_EXHAUSTED (as `--lengths=2147483647` meets them) end the run in one `error:`
  line (SystemExit with a message: exit status 1); any other exception stays a traceback."""
  monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
  cli = importlib.import_module("cli")
  for error in (MemoryError("Unable to allocate 4.00 TiB for an array with shape (1, "
                            "2147483647, 8, 64) and data type float32"),
                ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger than "
                           "the maximum possible size."),
                RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes."
                             "\nmore detail")):
    def fails(error=error):
      raise error
    with pytest.raises(SystemExit) as exit_:
      cli.run(fails)
    message = exit_.value.code
    assert message.startswith("error: out of memory: ") and "\n" not in message, message
    assert str(error).splitlines()[0] in message
  with pytest.raises(ZeroDivisionError):
    cli.run(lambda: 1 / 0)


# Each benchmark's defaults (the toolchains left out) and the arguments of a smaller run.
DEFAULTS = {"attention": [], "attention_bound": [],
            "recurrent": ["--section=linear", "--compile_target="],
            "lra_efficiency": ["--tpu="]}


@pytest.mark.xdist_group("benchmark_arguments")
def test_a_benchmarks_memory_check_passes_its_defaults_and_refuses_them_on_a_smaller_machine(
    capsys, monkeypatch):
  """The estimate of what a run's sizes need, against the memory available (monkeypatched:
  8 GiB, then 4 MiB), checked before anything runs: the defaults fit 8 GiB; on 4 MiB each
  benchmark refuses them in one line naming the sizes."""
  monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
  monkeypatch.chdir(ROOT)
  from research.training import config as checks  # noqa: PLC0415

  for available, refused in ((8 * 2**30, False), (4 * 2**20, True)):
    monkeypatch.setattr(checks, "available_ram", lambda available=available: available)
    for name, argv in DEFAULTS.items():
      module = importlib.import_module(name)
      if not refused:
        module.parse_arguments(argv)
        continue
      err = _refusal(module, argv, capsys)
      assert "of host memory" in err and "but this machine has 4.0 MiB available" in err, err


def test_our_one_line_errors_keep_the_libraries_logs_held_back_and_a_crash_shows_them(capfd):
  """What the plugins write to fd 2 inside jax_start.held_back() stays held back when the
  block ends in one of our errors (a refusal, a failed run, an exit with its message) and
  is shown when it ends in a crash."""
  from research import jax_start  # noqa: PLC0415
  from research.errors import ConfigError, RunFailed  # noqa: PLC0415

  for error, shown in ((ConfigError("bad"), False), (RunFailed("failed"), False),
                       (SystemExit("error: out of memory"), False), (KeyError("crash"), True)):
    with pytest.raises(type(error)), jax_start.held_back():
      os.write(2, b"a plugin's log line\n")
      raise error
    assert ("a plugin's log line" in capfd.readouterr().err) == shown, error


@pytest.mark.xdist_group("benchmark_arguments")
def test_a_benchmark_starts_jaxs_backends_with_their_logs_held_back(capfd, monkeypatch):
  """The plugins log when the backends start (the CUDA plugin's traceback on a machine
  without CUDA): cli.parse starts them inside held_back, so no run prints those lines."""
  monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
  import jax  # noqa: PLC0415

  cli = importlib.import_module("cli")
  started = []
  monkeypatch.setattr(jax, "devices", lambda: started.append(os.write(2, b"plugin log\n")))
  args = cli.parse(cli.Parser(), [])
  assert started and args is not None and "plugin log" not in capfd.readouterr().err
