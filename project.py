"""Set up the project's virtual environments if needed, then run one task in them.

    python3 project.py main     # the main job: launch.py's default experiment (nmt_dates)
    python3 project.py test     # the linter, then the whole test suite (arguments: pytest's)
    python3 project.py quick    # the linter, then the unit tests alone, without the compile
                                # toolchains: no `slow` or `aot` test (about 3 minutes)
    python3 project.py long     # the long tier: the notebooks in quick mode, whole-preset
                                # compiles, the multi-process run, the exhaustive grids
    python3 project.py bench [NAME [arguments]]   # NAME: recurrent, attention, attention_bound,
                                # compile_targets, accelerator, lra_efficiency,
                                # sweep_workers

`test` and `quick` run `ruff check .` first (the configuration in pyproject.toml) and stop
there when it fails. `test` then runs its two tiers, each in its own environment: the unit
tests in `.venv-quick`, which holds the `test` extra alone, as `quick` runs them (what they
check must hold on a machine without the toolchains), then the `slow` and `aot` tests in
`.venv`; it fails if either fails. Tests marked `long` (in the test files: tests/conftest.py
says which) are left to `long`, which keeps `test` within CI's 12 minutes on 2 cores. Plain
`bench` runs recurrent, attention and attention_bound; `bench NAME` runs benchmarks/NAME.py
with the arguments that made results/NAME.md, and writes its output there (the command and the
commit in its first line: the docs quote these files) when it ends with exit status 0; a run
that failed or was refused leaves the committed file as it was. `bench NAME arguments` with
other arguments only prints (a different table is no replacement). `bench accelerator` writes
its own report (runs/accelerator_report.md).

Needs only Python >= 3.11 and pip. The first call creates the environment a task needs and
installs the package with its extras: `main` none in `.venv`; `test` and `bench` the `test`
extra and `aot`, the toolchains that compile for TPUs and GPUs from a CPU (about 1.5 GB), in
`.venv`; `quick` (and `test`'s unit tier) the `test` extra in `.venv-quick`. Later calls
reinstall only when pyproject.toml changed (an environment with more extras serves a task
that needs fewer), so they start at once. On an accelerator, name its extra:

    RESEARCH_EXTRAS=cuda python3 project.py main    # NVIDIA GPU (jax[cuda13]); or tpu
"""

import datetime
import hashlib
import os
import pathlib
import shlex
import subprocess
import sys
import venv

ROOT = pathlib.Path(__file__).resolve().parent
VENV = ROOT / ".venv"                # main, bench and the slow and aot tests
QUICK_VENV = ROOT / ".venv-quick"    # the unit tests, without the compile toolchains


def python(venv: pathlib.Path) -> pathlib.Path:
  return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


PYTHON = python(VENV)

# one worker per core (pytest-xdist); tests of one xdist_group share a worker
PYTEST = ["-m", "pytest", "-n", "auto", "--dist", "loadgroup"]
UNIT_TIER = (QUICK_VENV, "test", [*PYTEST, "-m", "not slow and not aot and not long"])
TOOLCHAIN_TIER = (VENV, "test,aot", [*PYTEST, "-m", "(slow or aot) and not long"])
LONG_TIER = (VENV, "test,aot", [*PYTEST, "-m", "long"])     # markers: tests/conftest.py
TASKS = {
    # name: its steps, each (environment, pip extras, command run inside it; extra arguments
    # go after it)
    "main": [(VENV, "", ["launch.py"])],
    "test": [UNIT_TIER, TOOLCHAIN_TIER],
    "quick": [UNIT_TIER],
    "long": [LONG_TIER],
    "bench": [(VENV, "test,aot", [])],   # benchmarks/NAME.py; aot: deviceless compiles
}
NO_TESTS = 5                         # pytest's exit status when a tier selects no test
LINTED = ("test", "quick", "long")   # `ruff check .` first
LINT = ["-m", "ruff", "check", "."]
# NAME: the arguments of the command results/NAME.md records
RECORDED = {"recurrent": ["--section", "all"], "attention": [], "attention_bound": [],
            "compile_targets": [], "lra_efficiency": []}
BENCHMARKS = ("recurrent", "attention", "attention_bound")   # plain `bench` runs these
ON_REQUEST = ("compile_targets", "accelerator", "lra_efficiency",   # by name only (minutes
              "sweep_workers")                                     # each)


class UsageError(ValueError):
  """A command line project.py refuses (one `error:` line, exit status 2)."""


def benchmark_runs(args: list[str]) -> list[tuple[list[str], pathlib.Path | None]]:
  """(command, the file its output is written to, or None) of each benchmark `bench args`
  runs: plain `bench` runs BENCHMARKS, `bench NAME` NAME with its RECORDED arguments, `bench
  NAME ARGS` NAME with ARGS. Only a run with the RECORDED arguments writes results/NAME.md."""
  if not args:
    return [run for name in BENCHMARKS for run in benchmark_runs([name])]
  name, *arguments = args
  if name not in BENCHMARKS + ON_REQUEST:
    raise UsageError(f"unknown benchmark {name!r}; choose one of: "
                     f"{', '.join(BENCHMARKS + ON_REQUEST)} (python3 project.py bench "
                     "[NAME [arguments]])")
  if name in RECORDED and not arguments:
    arguments = RECORDED[name]
  recorded = name in RECORDED and arguments == RECORDED[name]
  return [([f"benchmarks/{name}.py", *arguments],
           ROOT / "results" / f"{name}.md" if recorded else None)]


def run_recorded(command: list[str], path: pathlib.Path) -> int:
  """Runs `command` in .venv, its output shown and written to `path` (whole, after the
  command succeeds), headed by the command line, the commit and the date."""
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "no git"
  lines = [f"<!-- python3 project.py bench {shlex.join([path.stem, *command[1:]])}; commit "
           f"{commit}; {datetime.date.today()} -->\n"]
  with subprocess.Popen([str(PYTHON), *command], cwd=ROOT, stdout=subprocess.PIPE,
                        text=True) as process:
    for line in process.stdout:
      sys.stdout.write(line)
      sys.stdout.flush()
      lines.append(line)
  if process.returncode == 0:
    path.parent.mkdir(exist_ok=True)
    temporary = path.with_suffix(".md.tmp")
    temporary.write_text("".join(lines), encoding="utf-8")
    os.replace(temporary, path)
  return process.returncode


def ensure_environment(environment: pathlib.Path, extras: str) -> None:
  """Creates `environment` (a virtual environment) and installs `.[extras]` (and
  $RESEARCH_EXTRAS) unless an installation of those extras, or more, from this
  pyproject.toml and package version is there already."""
  extras = ",".join(filter(None, [extras, *os.environ.get("RESEARCH_EXTRAS", "").split(",")]))
  digest = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in (   # the version
      "pyproject.toml", "research/__init__.py"))).hexdigest()        # is research.__version__
  interpreter = python(environment)
  if interpreter.exists() and installed(environment, extras, digest):
    return
  if not interpreter.exists():
    print(f"Creating {environment.name} ...", flush=True)
    venv.create(environment, with_pip=True)
  target = f".[{extras}]" if extras else "."
  print(f"Installing {target} into {environment.name} (first run only) ...", flush=True)
  pip = [str(interpreter), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-compile"]   # modules compile when first imported: set-up in half the time
  subprocess.run([*pip, "-e", target], cwd=ROOT, check=True)
  if "aot" in extras.split(","):
    subprocess.run([*pip, *aot_pins(interpreter)], cwd=ROOT, check=True)
  (environment / f".installed-{extras or 'base'}").write_text(digest)


def installed(environment: pathlib.Path, extras: str, digest: str) -> bool:
  """Whether `environment` holds `extras` (comma-separated), or more, installed from the
  pyproject.toml and version of this `digest`: each installation leaves .installed-EXTRAS
  holding it."""
  wanted = set(extras.split(",")) - {""}
  return any(wanted <= set(stamp.name.removeprefix(".installed-").split(","))
             and stamp.read_text() == digest for stamp in environment.glob(".installed-*"))


def aot_pins(interpreter: pathlib.Path) -> list[str]:
  """The compile-only toolchains at the installed JAX's own version (the `aot` extra's
  ranges cannot name it)."""
  version = subprocess.run([str(interpreter), "-c", "import jax; print(jax.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
  return [f"jax[tpu]=={version}", f"jax-cuda12-plugin=={version}",
          f"jax-cuda12-pjrt=={version}"]


def worst(statuses: list[int]) -> int:
  """The exit status of a task of several steps: the first failure's; a tier that selected
  no test (the arguments chose tests of the other tier only) fails only if all did."""
  failures = [status for status in statuses if status not in (0, NO_TESTS)]
  if failures:
    return failures[0]
  return NO_TESTS if all(status == NO_TESTS for status in statuses) else 0


def main(argv: list[str]) -> int:
  if not argv:
    print(__doc__.strip())
    print(f"error: name a task: {', '.join(TASKS)}", file=sys.stderr)
    return 2
  task, *args = argv
  try:
    if task not in TASKS:
      raise UsageError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    runs = benchmark_runs(args) if task == "bench" else []
  except UsageError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  steps = TASKS[task]
  for environment, extras, _ in steps:
    ensure_environment(environment, extras)
  if task in LINTED and (status := subprocess.call([str(python(steps[0][0])), *LINT],
                                                   cwd=ROOT)):
    print(f"error: `ruff check .` failed (exit {status}); the tests did not run",
          file=sys.stderr)
    return status
  if task != "bench":
    return worst([subprocess.call([str(python(step[0])), *step[2], *args], cwd=ROOT)
                  for step in steps])
  for command, path in runs:
    if path is None:
      status = subprocess.call([str(PYTHON), *command], cwd=ROOT)
      name = pathlib.Path(command[0]).stem
      if name in RECORDED and status == 0:
        print(f"(printed only: results/{name}.md records `python3 project.py bench "
              f"{shlex.join([name, *RECORDED[name]])}`)", file=sys.stderr)
    else:
      status = run_recorded(command, path)
    if status:
      return status
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
