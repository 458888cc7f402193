"""The accelerator report: one command on a GPU or TPU machine, one markdown file.

    python3 project.py bench accelerator [--output runs/accelerator_report.md] [--suite]

Runs, each as a subprocess with its own time limit (LIMITS: under 10 minutes in all),
and writes what each printed, its command and its wall time:

  1. the tests marked gpu / tpu            pytest -m "gpu or tpu"
  2. the whole suite at JAX's defaults     pytest -n auto (on a CPU only with --suite: the
                                           CPU's suite is `python3 project.py test`)
  3. the attention table                   benchmarks/attention.py: on a GPU, bf16 causal /
                                           window 256 / window 256 + 16 global tokens at
                                           (4, 2048, 8, 64), (4, 8192, 8, 64), (1, 32768, 8,
                                           128): auto, our kernels, jax.nn cuDNN, torch SDPA
  4. the recurrent table                   benchmarks/recurrent.py (against torch's cuDNN RNNs
                                           on a GPU)
  5. the main job in float32 and bfloat16  launch.py's default experiment, its final metrics

On a CPU it runs what a CPU can (small attention lengths, 200 steps of the main job) and
the report says what it shortened or skipped. A section that fails is reported with the
end of its output; the others still run.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cli  # noqa: E402

from research import jax_start  # noqa: E402

with jax_start.held_back():   # the aot toolchains' plugins log when JAX starts
  jax_start.cpu_unless_accelerators()
  import jax

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
# Seconds each section may take (the main job: each dtype); 555 in all.
LIMITS = {"tests": 60, "suite": 240, "attention": 120, "recurrent": 90, "main": 45}


def run(command: list[str], limit: int) -> tuple[str, float, int]:
  """(stdout, seconds, exit status) of a command run from the project root; its stderr
  (JAX's plugin logs, progress) is appended only when it fails."""
  start = time.perf_counter()
  try:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    output, status = done.stdout, done.returncode
    if status:
      output += "\n" + done.stderr[-3000:]
  except subprocess.TimeoutExpired as error:
    output, status = f"{error.stdout or ''}\n(stopped after {limit} s)", 124
  return output, time.perf_counter() - start, status


def pytest_summary(output: str) -> str:
  """pytest's last line: the counts of passed, failed, skipped tests."""
  lines = [line for line in output.splitlines() if " in " in line and (
      "passed" in line or "failed" in line or "skipped" in line or "error" in line)]
  return lines[-1].strip("= ") if lines else "(no summary: see the output's end below)"


def section(title: str, command: list[str], limit: int, summary=None) -> str:
  output, seconds, status = run(command, limit)
  shown = summary(output) if summary else output.strip()[-6000:]
  text = [f"## {title}", "", f"`{' '.join(command[1:])}` — {seconds:.0f} s, exit {status}", ""]
  text.append(shown if summary is None else f"**{shown}**")
  if status and summary:
    text += ["", "```", output.strip()[-3000:], "```"]
  return "\n".join(text) + "\n"


def main_job(dtype: str, cpu: bool) -> str:
  """The main job in `dtype`: its final metrics (exact match, steps/s, compile time)."""
  with tempfile.TemporaryDirectory() as workdir:
    command = [sys.executable, "launch.py", f"--workdir={workdir}",
               f"--config.model.dtype={dtype}", *(["--config.train.num_steps=200"] if cpu else [])]
    output, seconds, status = run(command, LIMITS["main"] * (4 if cpu else 1))
    path = os.path.join(workdir, "final_metrics.json")
    if status or not os.path.exists(path):
      return f"| {dtype} | failed (exit {status}): {output.strip()[-300:]!r} | | | | |"
    with open(path) as f:
      final = json.load(f)
  match = {k: v for k, v in final.items() if "exact_match" in k}
  return (f"| {dtype} | {', '.join(f'{k} {v:.3f}' for k, v in match.items())} | "
          f"{final['perf/steps_per_second']:.0f} | {final['perf/compile_seconds']:.1f} | "
          f"{seconds:.0f} |")


def report_path(text: str) -> str:
  """A file this can write at the end: not a directory, under a directory (created if
  missing) that no file stands in the way of."""
  path = os.path.abspath(text) if text else ""
  parent = os.path.dirname(path)
  while parent and not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not path or os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
    raise argparse.ArgumentTypeError(f"{text!r} is not a file path this can write (a directory, "
                                     "or under a file or an unwritable directory)")
  return path


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", type=report_path,
                      default=os.path.join(ROOT, "runs", "accelerator_report.md"))
  parser.add_argument("--suite", action="store_true", help="run the whole suite on a CPU too")
  return cli.parse(parser, argv)


def main():
  args = parse_arguments()
  backend = jax.default_backend()
  cpu = backend == "cpu"
  parts = [f"# Accelerator report, {datetime.date.today()}", "",
           f"jax {jax.__version__}; backend {backend}; devices: "
           f"{', '.join(sorted({d.device_kind for d in jax.devices()}))}", ""]
  marker = "gpu or tpu"
  parts.append(section(f"Tests marked {marker}", [*PYTEST, "-m", marker, "tests"],
                       LIMITS["tests"], pytest_summary))
  if cpu and not args.suite:
    parts.append("## The whole suite\n\nSkipped on a CPU: it is `python3 project.py test` "
                 "(or pass --suite).\n")
  else:
    parts.append(section("The whole suite at JAX's default settings",
                         [*PYTEST, "-n", "auto", "--dist", "loadgroup", "tests"],
                         LIMITS["suite"], pytest_summary))
  lengths = ["--lengths=512,2048", "--repeats=2"] if cpu else []
  parts.append(section("Attention" + (" (CPU: lengths 512 and 2048 only)" if cpu else ""),
                       [sys.executable, "benchmarks/attention.py", *lengths], LIMITS["attention"]))
  shapes = ["--shapes=base", "--repeats=3"] if cpu else []
  parts.append(section("Recurrent layers" + (" (CPU: the base shape only)" if cpu else ""),
                       [sys.executable, "benchmarks/recurrent.py", *shapes], LIMITS["recurrent"]))
  rows = [main_job(dtype, cpu) for dtype in ("float32", "bfloat16")]
  parts += ["## The main job (nmt_dates)" + (" — 200 steps on a CPU" if cpu else ""), "",
            "| dtype | exact match | steps/s | compile s | wall s |", "|---|---|---|---|---|",
            *rows, ""]
  report = "\n".join(parts)
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(f"{args.output}.tmp", "w", encoding="utf-8") as f:
    f.write(report)
  os.replace(f"{args.output}.tmp", args.output)
  print(report)
  print(f"report: {args.output}")


if __name__ == "__main__":
  cli.run(main)
