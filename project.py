"""Set up the project's virtual environment if needed, then run one task in it.

    python3 project.py main     # the main job: launch.py's default experiment (nmt_dates)
    python3 project.py test     # the test suite (extra arguments go to pytest)
    python3 project.py bench [recurrent|attention|attention_bound|compile_targets|accelerator|lra_efficiency] [args]

A benchmark's output is printed and also written to results/NAME.md (the command and the
commit in its first line), where the README's figures are quoted from.

Needs only Python >= 3.11 and pip. The first call creates `.venv` and installs the
package (with the `test` extra and `aot`, the toolchains that compile for TPUs and GPUs
from a CPU, for `test` and `bench`); later calls reinstall only
when pyproject.toml changed, so they start at once. On an accelerator, name its extra:

    RESEARCH_EXTRAS=cuda python3 project.py main    # NVIDIA GPU (jax[cuda13]); or tpu
"""

import datetime
import hashlib
import os
import pathlib
import subprocess
import sys
import venv

ROOT = pathlib.Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")

TASKS = {
    # name: (pip extras, command run inside the environment)
    "main": ("", ["launch.py"]),   # extra arguments go to launch.py
    # one worker per core (pytest-xdist); tests of one xdist_group share a worker
    "test": ("test,aot", ["-m", "pytest", "-n", "auto", "--dist", "loadgroup"]),
    "bench": ("test,aot", []),   # benchmarks/NAME.py (`benchmark_commands`); aot: deviceless compiles
}
BENCHMARKS = ("recurrent", "attention", "attention_bound")   # plain `bench` runs these
ON_REQUEST = ("compile_targets", "accelerator", "lra_efficiency")   # by name only (minutes each)


def benchmark_commands(args: list[str]) -> list[list[str]]:
  """`bench NAME [args]` runs benchmarks/NAME.py with args; plain `bench` runs BENCHMARKS."""
  if args and args[0] in BENCHMARKS + ON_REQUEST:
    return [[f"benchmarks/{args[0]}.py", *args[1:]]]
  return [[f"benchmarks/{name}.py", *args] for name in BENCHMARKS]


def run_recorded(command: list[str], path: pathlib.Path) -> int:
  """Runs `command` in .venv, its output shown and written to `path` (whole, after the
  command succeeds), headed by the command line, the commit and the date."""
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "no git"
  lines = [f"<!-- python3 project.py bench {' '.join([path.stem, *command[1:]])}; commit "
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
  """Creates .venv and installs `.[extras]` (and $RESEARCH_EXTRAS) unless pyproject.toml
  is unchanged."""
  extras = ",".join(filter(None, [extras, *os.environ.get("RESEARCH_EXTRAS", "").split(",")]))
  digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
  stamp = VENV / f".installed-{extras or 'base'}"
  if stamp.exists() and stamp.read_text() == digest and PYTHON.exists():
    return
  if not PYTHON.exists():
    print("Creating .venv ...", flush=True)
    venv.create(VENV, with_pip=True)
  target = f".[{extras}]" if extras else "."
  print(f"Installing {target} into .venv (first run only) ...", flush=True)
  pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
  subprocess.run([*pip, "-e", target], cwd=ROOT, check=True)
  if "aot" in extras.split(","):
    subprocess.run([*pip, *aot_pins()], cwd=ROOT, check=True)
  stamp.write_text(digest)


def aot_pins() -> list[str]:
  """The compile-only toolchains at the installed JAX's own version (the `aot` extra's
  ranges cannot name it)."""
  version = subprocess.run([str(PYTHON), "-c", "import jax; print(jax.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
  return [f"jax[tpu]=={version}", f"jax-cuda12-plugin=={version}",
          f"jax-cuda12-pjrt=={version}"]


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in TASKS:
    print(__doc__.strip())
    print(f"\nunknown or missing task; choose one of: {', '.join(TASKS)}", file=sys.stderr)
    return 2
  extras, command = TASKS[argv[0]]
  ensure_environment(extras)
  if argv[0] != "bench":
    return subprocess.call([str(PYTHON), *command, *argv[1:]], cwd=ROOT)
  for command in benchmark_commands(argv[1:]):
    status = run_recorded(command, ROOT / "results" / f"{pathlib.Path(command[0]).stem}.md")
    if status:
      return status
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
