"""Set up the project's virtual environment if needed, then run one task in it.

    python3 project.py main     # the main job: launch.py's default experiment (nmt_dates)
    python3 project.py test     # the linter, then the whole test suite (arguments: pytest's)
    python3 project.py quick    # the linter, then the unit tests alone, without the compile
                                # toolchains: no `slow` or `aot` test (about 2 minutes)
    python3 project.py bench [NAME [arguments]]   # NAME: recurrent, attention, attention_bound,
                                # compile_targets, accelerator, lra_efficiency

`test` and `quick` run `ruff check .` first (the configuration in pyproject.toml) and stop
there when it fails. Plain `bench` runs recurrent, attention and attention_bound; `bench NAME`
runs benchmarks/NAME.py with the arguments that made results/NAME.md, and writes its output
there (the command and the commit in its first line: the docs quote these files) when it
ends with exit status 0; a run that failed or was refused leaves the committed file as it
was. `bench NAME arguments` with other arguments only prints (a different table is no
replacement). `bench accelerator` writes its own report (runs/accelerator_report.md).

Needs only Python >= 3.11 and pip. The first call creates `.venv` and installs the
package with what the task needs: `test` and `bench` the `test` extra and `aot`, the
toolchains that compile for TPUs and GPUs from a CPU (about 1.5 GB); `quick` the `test`
extra alone. Later calls reinstall only when pyproject.toml changed (an environment with
more extras serves a task that needs fewer), so they start at once. On an accelerator,
name its extra:

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
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")

# one worker per core (pytest-xdist); tests of one xdist_group share a worker
PYTEST = ["-m", "pytest", "-n", "auto", "--dist", "loadgroup"]
TASKS = {
    # name: (pip extras, command run inside the environment; extra arguments go after it)
    "main": ("", ["launch.py"]),
    "test": ("test,aot", PYTEST),
    "quick": ("test", [*PYTEST, "-m", "not slow and not aot"]),   # tests/markers.txt
    "bench": ("test,aot", []),   # benchmarks/NAME.py; aot: deviceless compiles
}
LINTED = ("test", "quick")   # `ruff check .` first
LINT = ["-m", "ruff", "check", "."]
# NAME: the arguments of the command results/NAME.md records
RECORDED = {"recurrent": ["--section", "all"], "attention": [], "attention_bound": [],
            "compile_targets": [], "lra_efficiency": []}
BENCHMARKS = ("recurrent", "attention", "attention_bound")   # plain `bench` runs these
ON_REQUEST = ("compile_targets", "accelerator", "lra_efficiency")   # by name only (minutes each)


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


def ensure_environment(extras: str) -> None:
  """Creates .venv and installs `.[extras]` (and $RESEARCH_EXTRAS) unless an installation of
  those extras, or more, from this pyproject.toml is there already."""
  extras = ",".join(filter(None, [extras, *os.environ.get("RESEARCH_EXTRAS", "").split(",")]))
  digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
  if PYTHON.exists() and installed(extras, digest):
    return
  if not PYTHON.exists():
    print("Creating .venv ...", flush=True)
    venv.create(VENV, with_pip=True)
  target = f".[{extras}]" if extras else "."
  print(f"Installing {target} into .venv (first run only) ...", flush=True)
  pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-compile"]   # modules compile when first imported: set-up in half the time
  subprocess.run([*pip, "-e", target], cwd=ROOT, check=True)
  if "aot" in extras.split(","):
    subprocess.run([*pip, *aot_pins()], cwd=ROOT, check=True)
  (VENV / f".installed-{extras or 'base'}").write_text(digest)


def installed(extras: str, digest: str) -> bool:
  """Whether .venv holds `extras` (comma-separated), or more, installed from the
  pyproject.toml of this `digest`: each installation leaves .installed-EXTRAS holding it."""
  wanted = set(extras.split(",")) - {""}
  return any(wanted <= set(stamp.name.removeprefix(".installed-").split(","))
             and stamp.read_text() == digest for stamp in VENV.glob(".installed-*"))


def aot_pins() -> list[str]:
  """The compile-only toolchains at the installed JAX's own version (the `aot` extra's
  ranges cannot name it)."""
  version = subprocess.run([str(PYTHON), "-c", "import jax; print(jax.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
  return [f"jax[tpu]=={version}", f"jax-cuda12-plugin=={version}",
          f"jax-cuda12-pjrt=={version}"]


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
  extras, command = TASKS[task]
  ensure_environment(extras)
  if task in LINTED and (status := subprocess.call([str(PYTHON), *LINT], cwd=ROOT)):
    print(f"error: `ruff check .` failed (exit {status}); the tests did not run",
          file=sys.stderr)
    return status
  if task != "bench":
    return subprocess.call([str(PYTHON), *command, *args], cwd=ROOT)
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
