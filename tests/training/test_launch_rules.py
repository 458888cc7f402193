"""launch.py's rules for its flags and `--compile_only`: a flag without its value, an
argument that is no flag, an unknown target refused in one line (listing the targets), and
a workdir compile_only cannot use refused before anything is compiled or written, left as
found; first in process (command.parse, read_overrides, compile_sweep), then as a user
runs the commands (tests/training/forked_launch.py: one start-up for all, JAX's compile log
on). None of this needs the compile toolchains (tests/aot compiles for real)."""

import contextlib
import os
import sys

import forked_launch
import pytest
import tiny
from absl import flags as absl_flags

from research.errors import ConfigError, UserError
from research.training import command
from research.training import compile_only as compile_only_module
from research.training import workdir as workdirs

sys.path.insert(0, tiny.ROOT)
import launch  # noqa: E402, F401 - defines launch.py's flags, which command.parse reads

TARGETS = "tpu-v5e-1, tpu-v5e-8, tpu-v4-1, tpu-v4-8, tpu-v6e-1, h100, h100x8, a100, l4, t4"
NO_TARGET = f"--compile_only needs a target: --compile_only=TARGET, one of: {TARGETS}"
NO_WORKDIR = "--workdir needs a directory: --workdir=DIR (without the flag: a new one under runs/)"
TINY = f"--config={tiny.CONFIG}"


def parse(*argv: str) -> command.Command:
  return command.parse(["launch.py", *argv])


@pytest.mark.parametrize("flags, message", [
    (["--compile_only"], NO_TARGET),                 # last: absl would say "missing value"
    (["--compile_only", "--sweep"], NO_TARGET),      # absl would take --sweep for the target
    (["--compile_only", "--workdir=/tmp/x"], NO_TARGET),
    (["--compile_only="], NO_TARGET),                # empty: it trained for real
    (["--compile_only=  "], NO_TARGET),
    (["--compile_only=t4", "--compile_only="], NO_TARGET),   # the last counts, as in absl
    (["--workdir", "--sweep"], NO_WORKDIR),          # it trained into a directory "--sweep"
    (["--workdir="], NO_WORKDIR),                    # it trained into runs/NAME-TIME
    (["--workdir", "-v"], NO_WORKDIR),
])
def test_a_flag_without_its_value_is_refused_saying_what_it_takes(flags, message):
  with pytest.raises(ConfigError) as refused:
    parse("--config=c.py", *flags)
  assert str(refused.value) == message


def test_an_override_without_its_value_is_refused_and_a_negative_number_is_a_value():
  config = tiny.config()
  with pytest.raises(ConfigError, match=r"^--config.data.length needs a value: "
                                        r"--config.data.length=VALUE$"):
    command.read_overrides(config, ["launch.py", "--config.data.length", "--sweep"])
  overridden, _ = command.read_overrides(config, ["launch.py", "--config.train.learning_rate",
                                                  "-0.1"])
  assert overridden.train.learning_rate == -0.1   # a value (of the right type: validation
  # refuses its sign later, naming the key)


@pytest.mark.parametrize("argv, message", [
    (["-config.model.bogus=1"], "unknown config key config.model.bogus; keys under config.model"),
    (["--config.model.bogus=1"], "unknown config key config.model.bogus; keys under config.model"),
    (["-config.model.bogus", "1"], "unknown config key config.model.bogus; keys under"),
    (["-config.model.dropout=0.1"], "config key config.model.dropout, now called "
                                    "config.model.dropout_rate: set that key instead"),
    (["-config.train.num_steps=abc"], "config.train.num_steps='abc' must be of type int"),
    (["-config.train.num_steps", "abc"], "config.train.num_steps='abc' must be of type int"),
    (["-config.train.num_steps"], "--config.train.num_steps needs a value"),
    (["--noconfig.train.num_steps"], "--noconfig.train.num_steps sets a bool key to False and "
                                     "takes no value; config.train.num_steps is 60"),
])
def test_an_override_is_checked_in_every_spelling_absl_accepts(argv, message):
  """One dash or two, `=VALUE` or the next argument, `--noKEY` (config_flags applied each;
  a one-dash typo ended in an AttributeError traceback)."""
  with pytest.raises(ConfigError) as refused:
    command.read_overrides(tiny.config(), ["launch.py", *argv])
  assert str(refused.value).startswith(message), refused.value


def test_flags_are_read_as_absl_reads_them():
  """launch.py's flags and the config's keys in one command line, `-NAME` or `--NAME`, with
  `=VALUE` or the next argument, the last one counting; nothing after `--` is a flag."""
  parsed = parse("-config", tiny.CONFIG, "--config.seed=1", "-config.train.num_steps", "7",
                 "--sweep", "--config.seed", "3", "--workdir=/w")
  assert (parsed.mode, parsed.config.seed, parsed.config.train.num_steps) == ("train", 3, 7)
  assert parsed.config.model.kind == "lstm" and absl_flags.FLAGS.sweep
  with pytest.raises(ConfigError, match="^unexpected argument '--config=b.py'"):
    parse(TINY, "--", "--config=b.py")


@pytest.mark.parametrize("flags, target", [
    ([], None),
    (["--compile_only=t4"], "t4"),
    (["--compile_only", "tpu-v4-8"], "tpu-v4-8"),   # absl's other spelling of a value
    (["-compile_only=H100 "], "h100"),              # case and surrounding spaces aside
    (["--compile_only= A100"], "a100"),
    (["--compile_only=t4", "--compile_only=l4"], "l4"),
    (["--compile_only=", "--compile_only=t4", "--workdir=", "--workdir=/w"], "t4"),
])
def test_a_target_is_read_as_absl_reads_the_flag(flags, target):
  parsed = parse(TINY, *flags)
  assert (parsed.mode, parsed.target) == ("train" if target is None else "compile", target)


@pytest.mark.parametrize("value, hint", [("tpu-v9", ""),
                                         ("tpuv5e1", " (did you mean 'tpu-v5e-1'?)"),
                                         ("h100x4", " (did you mean 'h100x8'?)")])
def test_an_unknown_target_is_refused_listing_the_targets_and_the_nearest(value, hint):
  with pytest.raises(ConfigError) as refused:
    parse(TINY, f"--compile_only={value}")
  assert str(refused.value) == (f"--compile_only: unknown target {value!r}{hint}; choose one "
                                f"of: {TARGETS}")


@pytest.mark.parametrize("flags, message", [
    (["--export", "--eval_only"], "--eval_only does not go with --export: evaluate and export "
                                  "in two commands"),
    (["--export", "--sweep"], "--export does not go with --sweep: export each point's workdir"),
    (["--export", "--compile_only=t4"], "--export does not go with --compile_only"),
    (["--export", "--config=c.py"], "--export does not go with --config: it takes the run's "
                                    "own config (its config.json)"),
    (["--eval_only", "-config.seed", "1"], "--eval_only does not go with --config.seed: it "
                                           "takes the run's own config (its config.json)"),
    (["--workers=2"], "--workers goes with --sweep, training a sweep's points"),
    (["--sweep", "--shard=0/2", "--compile_only=t4"], "--shard goes with --sweep, training"),
    (["--step=3"], "--step goes with --eval_only or --export: --workdir DIR --eval_only "
                   "--step=N evaluates the checkpoint of step N, --export --step=N exports it"),
    (["--export", "--step=3", "--workdir="], "--workdir needs a directory"),
])
def test_what_does_not_go_with_eval_only_or_export_is_refused(flags, message):
  with pytest.raises(ConfigError) as refused:
    parse("--workdir=/w", *flags)
  assert str(refused.value).startswith(message), refused.value


def test_export_needs_a_workdir():
  with pytest.raises(ConfigError) as refused:
    parse("--export", "--step=3")
  assert str(refused.value) == "--export needs --workdir=DIR, the workdir of the run to export"


@pytest.mark.parametrize("flags, expected", [
    (["--export", "--step", "3"], "export"),
    (["--eval_only=true"], "eval_only"),
    (["--export", "--noexport", TINY], "train"),          # the last one counts, as in absl
])
def test_eval_only_and_export_are_read_as_absl_reads_them(flags, expected):
  assert parse("--workdir=/w", *flags).mode == expected
  with pytest.raises(ConfigError, match="^unexpected argument '--export'"):
    parse("--workdir=/w", TINY, "--", "--export")       # after --: not a flag


def _unreachable(*args, **kwargs):
  raise AssertionError("a refused compile_only reached the toolchain or the compiler")


@pytest.mark.parametrize("case", ["under a file", "a live run's", "report is a directory",
                                  "sweep point is a file", "checkpoints of another config",
                                  "a run under a renamed key", "a single run, for a sweep",
                                  "a sweep's root, for a single run", "a config.json too deep"])
def test_a_workdir_compile_only_cannot_use_is_refused_before_compiling_left_as_found(
    case, tmp_path, monkeypatch):
  """The workdir rules of a training run (one wrote compile_report.json into a finished run
  of another experiment), before anything is compiled or written."""
  monkeypatch.setattr(compile_only_module, "target_devices", _unreachable)
  monkeypatch.setattr(compile_only_module, "compile_report", _unreachable)
  config, points = tiny.config(), None
  (tmp_path / "file").write_text("x")
  workdir = str(tmp_path / "run")
  other = tiny.config(**{"model.hidden_size": 8}).to_dict()
  if case == "checkpoints of another config":
    tiny.write_json(f"{workdir}/config.json", other)
    os.makedirs(f"{workdir}/checkpoints/20")
    message = (f"workdir {workdir} holds checkpoints of a run with a different config "
               "(config.model.hidden_size 8 there, 16 now); use a new --workdir")
  elif case == "a run under a renamed key":
    other = config.to_dict()
    other["model"]["dropout"] = other["model"].pop("dropout_rate")
    tiny.write_json(f"{workdir}/config.json", other)
    message = f"workdir {workdir} was written with config.model.dropout, now called"
  elif case == "a config.json too deep":       # read as every reader of a config.json reads it
    os.makedirs(workdir)
    (tmp_path / "run" / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    message = (f"workdir {workdir} cannot be resumed: {workdir}/config.json nests its groups "
               "deeper than the JSON parser reads")
  elif case == "a single run, for a sweep":
    points = [{"model.hidden_size": 8}, {"model.hidden_size": 16}]
    tiny.write_json(f"{workdir}/config.json", config.to_dict())
    message = f"workdir {workdir} holds a single run (config.json); a sweep needs a workdir"
  elif case == "a sweep's root, for a single run":
    tiny.write_json(f"{workdir}/sweep.json", {"config": config.to_dict(), "points": ["a=1"]})
    message = f"workdir {workdir} holds a sweep (sweep.json, its points in subdirectories)"
  elif case == "under a file":
    workdir = str(tmp_path / "file" / "sub")
    message = f"workdir {workdir} cannot be created (Not a directory)"
  elif case == "report is a directory":
    os.makedirs(os.path.join(workdir, "compile_report.json"))
    message = f"the run writes a file compile_report.json there, and {workdir}/compile_report.json"
  elif case == "sweep point is a file":
    points = [{"model.hidden_size": 8}, {"model.hidden_size": 16}]
    os.makedirs(workdir)
    (tmp_path / "run" / "model.hidden_size=16").write_text("x")
    message = "the run writes a directory model.hidden_size=16 there"
  else:
    message = f"workdir {workdir} is in use by a live run (pid {os.getpid()} on "
  with workdirs.hold(workdir) if case == "a live run's" else contextlib.nullcontext():
    before = tiny.files_under(str(tmp_path))
    with pytest.raises(UserError) as refused:
      compile_only_module.compile_sweep(config, points, workdir, tiny.task(), "t4")
    assert message in str(refused.value)
    assert tiny.files_under(str(tmp_path)) == before


@pytest.mark.slow
def test_launch_refuses_each_in_one_line_exit_2_nothing_compiled_the_workdir_as_found(tmp_path):
  root = str(tmp_path)
  (tmp_path / "file").write_text("x")
  live = os.path.join(root, "live")

  def command(name: str, *flags: str, workdir: str | None = None) -> list[str]:
    return [*tiny.launch_command(workdir or os.path.join(root, name))[2:], *flags]

  # sequence_tasks' sweep at the tiny width: the selective layers' heads (GLA's and DeltaNet's
  # state_size, Mamba-2's head_dim) must divide 16, or the points are refused before the workdir
  narrow = ("--config.model.state_size=16", "--config.model.recurrence.mamba2.head_dim=16")

  cases = {
      "no target, last": (command("a", "--compile_only"), NO_TARGET),
      "no target, then a flag": (command("b", "--compile_only", "--sweep"), NO_TARGET),
      "empty target": (command("c", "--compile_only="), NO_TARGET),
      "unknown target": (command("d", "--compile_only=tpu-v5e"),
                         f"--compile_only: unknown target 'tpu-v5e' (did you mean 'tpu-v5e-8'?); "
                         f"choose one of: {TARGETS}"),
      "workdir under a file": (command("e", "--compile_only=t4", workdir=f"{root}/file/sub"),
                               f"workdir {root}/file/sub cannot be created (Not a directory)"),
      "a live run's workdir": (command("f", "--compile_only=tpu-v5e-1", "--sweep", *narrow, workdir=live),
                               f"workdir {live} is in use by a live run (pid {os.getpid()} on "),
      "workdir without a value": ([*command("g"), "--workdir", "--sweep"], NO_WORKDIR),
      "a one-dash override": (command("i", "-config.model.bogus=1"),
                              "unknown config key config.model.bogus; keys under config.model"),
      "a sweep into a live run's workdir": (command("j", "--sweep", *narrow, workdir=live),
                                            f"workdir {live} is in use by a live run (pid "),
      "a sweep into a file": (command("k", "--sweep", *narrow, workdir=f"{root}/file"),   # no warning first
                              f"workdir {root}/file is a file, not a directory"),
      "a config file without --config": (
          command("h", "experiments/char_lm.py"),
          "unexpected argument 'experiments/char_lm.py': launch.py takes flags only (--config "
          "FILE[:ARGS], --config.KEY=VALUE, --workdir DIR, --sweep, --workers N, --shard I/N, "
          "--compile_only=TARGET, --eval_only, --export, --step N, --verbose); for a config "
          "file write "
          "--config=experiments/char_lm.py"),
      "an export of no run": ([f"--workdir={root}/none", "--export"],
                              f"workdir {root}/none does not exist"),
  }
  output = os.path.join(root, "output")
  os.makedirs(output)
  with workdirs.hold(live):
    before = tiny.files_under(root)
    results = forked_launch.run_all({name: argv for name, (argv, _) in cases.items()}, output)
    assert {k: v for k, v in tiny.files_under(root).items() if not k.startswith("output")} == before
  assert not os.path.exists(os.path.join(tiny.ROOT, "--sweep"))
  for name, (_, message) in cases.items():
    status, _, stderr = results[name]
    assert status == 2, (name, stderr[-2000:])
    (line,) = stderr.strip().splitlines()          # nothing compiled: JAX logs every compile
    assert line.startswith(f"error: {message}"), (name, line)
