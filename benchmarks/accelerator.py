"""The accelerator report: one command on a GPU or TPU machine, one markdown file.

    python3 project.py bench accelerator [--output runs/accelerator_report.md]
                                         [--artifacts DIR] [--suite]
                                         [--sections suite,adding --limit 540]

Runs, each as a subprocess with its own time limit (LIMITS: under 10 minutes in all on a
GPU, `--limit` for each chosen one), and writes what each printed, its command and its wall
time, the report rewritten after every section (a call cut short keeps what finished).
On an H200 (results/accelerator/h200.md) the whole suite needs about 10 minutes: give it a
call of its own, `--sections=suite,adding --limit=540`. The sections (`--sections`):

  1. the attention table                   benchmarks/attention.py: on a GPU, bf16 causal /
                                           window 256 / window 256 + 16 global tokens /
                                           BigBird at (4, 2048, 8, 64), (4, 8192, 8, 64),
                                           (1, 32768, 8, 128): auto, our kernels, jax.nn
                                           cuDNN, torch SDPA, and the goals' lines
  2. the recurrent table                   benchmarks/recurrent.py (against torch's cuDNN RNNs
                                           on a GPU)
  3. LRU and S5, parallel and stepwise     benchmarks/recurrent.py --section linear
  4. the main job in float32 and bfloat16  launch.py's default experiment, its final metrics
  5. a profile of one LRA training step    listops' `lra` preset (its data cut to a few
                                           hundred trees), train.profile_steps: the step
                                           times and the costliest device operations
  6. the whole suite at JAX's defaults     pytest -n auto (on a CPU only with --suite: the
                                           CPU's suite is `python3 project.py test`), beside
     the adding problem at T = 1000        the LRU with phases below π/10 (2 blocks, batch 256)
                                           on an accelerator: its final metrics

On a CPU it runs what a CPU can (small attention lengths, 200 steps of the main job, the
tests marked gpu or tpu instead of the suite) and the report says what it shortened or
skipped. A section that fails is reported with the end of its output; the others still
run. `--artifacts` keeps each section's whole output, the profile's Perfetto trace and the
adding run's metrics.
"""

import argparse
import datetime
import json
import os
import shutil
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

  from research.training import metrics

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
# Seconds each section may take (the main job: each dtype; the adding run beside the suite).
LIMITS = {"tests": 60, "suite": 130, "attention": 140, "recurrent": 80, "linear": 40,
          "main": 50, "profile": 120}
SECTIONS = ("attention", "recurrent", "linear", "main", "profile", "suite", "adding")
# The adding problem at T = 1000: the LRU with phases in [0, π/10), the restriction the
# T = 100 probe found (results/exploratory/adding_100_phase), 2 bidirectional blocks.
ADDING_1000 = ["--config=experiments/sequence_tasks.py:task=adding,length=1000",
               "--config.model.kind=lru", "--config.model.num_layers=2",
               "--config.model.recurrence.lru.max_phase=0.314", "--config.train.batch_size=256",
               "--config.train.num_steps=8000", "--config.train.learning_rate=3e-3",
               "--config.train.eval_every=1000"]
# One LRA training step profiled: listops' lra preset with a few hundred trees.
LRA_PROFILE = ["--config=experiments/listops.py:preset=lra", "--config.data.train_examples=640",
               "--config.data.eval_examples=64", "--config.data.test_examples=64",
               "--config.train.num_steps=8", "--config.train.warmup_steps=4",
               "--config.train.log_every=4", "--config.train.eval_every=8",
               "--config.train.checkpoint_every=8", "--config.train.profile_steps=6,8"]


def run(command: list[str], limit: int, log: str | None = None) -> tuple[str, float, int]:
  """(stdout, seconds, exit status) of a command run from the project root; its stderr
  (JAX's plugin logs, progress) is appended only when it fails. `log`: a file that gets
  the whole stdout and stderr."""
  start = time.perf_counter()
  try:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    output, errors, status = done.stdout, done.stderr, done.returncode
  except subprocess.TimeoutExpired as error:
    output = (error.stdout or b"").decode() if isinstance(error.stdout, bytes) else error.stdout or ""
    errors = (error.stderr or b"").decode() if isinstance(error.stderr, bytes) else error.stderr or ""
    output, status = f"{output}\n(stopped after {limit} s)", 124
  if log:
    with open(log, "w", encoding="utf-8") as f:
      f.write(f"$ {' '.join(command)}\n{output}\n--- stderr ---\n{errors}")
  if status:
    output += "\n" + errors[-3000:]
  return output, time.perf_counter() - start, status


def pytest_summary(output: str) -> str:
  """pytest's last line: the counts of passed, failed, skipped tests; for a run cut short,
  the counts of its verbose lines so far."""
  lines = [line for line in output.splitlines() if " in " in line and (
      "passed" in line or "failed" in line or "skipped" in line or "error" in line)]
  if lines:
    return lines[-1].strip("= ")
  counts = {word: sum(f" {word} " in f" {line} " for line in output.splitlines())
            for word in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
  return ("cut short: " + ", ".join(f"{n} {w.lower()}" for w, n in counts.items())
          if any(counts.values()) else "(no summary: see the output's end below)")


def section(title: str, command: list[str], limit: int, summary=None, log=None) -> str:
  output, seconds, status = run(command, limit, log)
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
  match = {k: v for k, v in final.items() if "exact_match" in k and "_len_" not in k}
  return (f"| {dtype} | {', '.join(f'{k} {v:.3f}' for k, v in match.items())} | "
          f"{final['perf/steps_per_second']:.0f} | {final['perf/compile_seconds']:.1f} | "
          f"{seconds:.0f} |")


def lra_profile(artifacts: str) -> str:
  """One LRA training step profiled (LRA_PROFILE): each traced step's time and the
  costliest operations of the device."""
  workdir = os.path.join(artifacts, "lra_profile")
  command = [sys.executable, "launch.py", f"--workdir={workdir}",
             f"--config.data.dir={os.path.join(artifacts, 'data')}", *LRA_PROFILE]
  output, seconds, status = run(command, LIMITS["profile"], os.path.join(artifacts, "profile.log"))
  text = [f"`{' '.join(command[1:])}` — {seconds:.0f} s, exit {status}", ""]
  traces = metrics.trace_files(workdir)
  if status or not traces:
    return "\n".join([*text, "```", output.strip()[-3000:], "```"])
  found = metrics.profile_summary(traces[-1])
  text += ["Steps: " + ", ".join(f"{step}: {ms:.1f} ms" for step, ms in found["steps"]), "",
           "| operation | total ms | count |", "|---|---|---|"]
  text += [f"| `{name[:90]}` | {ms:.2f} | {count} |" for name, ms, count in found["operations"]]
  shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
  return "\n".join(text)


def adding_run(artifacts: str) -> subprocess.Popen:
  """The adding problem at T = 1000 (ADDING_1000), started in the background."""
  workdir = os.path.join(tempfile.mkdtemp(), "adding_1000_lru")
  log = open(os.path.join(artifacts, "adding_1000_lru.log"), "w", encoding="utf-8")  # noqa: SIM115
  process = subprocess.Popen([sys.executable, "launch.py", f"--workdir={workdir}", *ADDING_1000],
                             cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
  process.workdir = workdir
  return process


def adding_result(process: subprocess.Popen, artifacts: str) -> str:
  """The adding run's final metrics (or its last evaluation, stopped), its files kept."""
  if process.poll() is None:
    process.terminate()
    process.wait(60)
  kept = os.path.join(artifacts, "adding_1000_lru")
  os.makedirs(kept, exist_ok=True)
  for name in ("config.json", "metrics.jsonl", "final_metrics.json"):
    if os.path.exists(os.path.join(process.workdir, name)):
      shutil.copy(os.path.join(process.workdir, name), kept)
  command = f"`python launch.py {' '.join(ADDING_1000)}`"
  final = os.path.join(kept, "final_metrics.json")
  if os.path.exists(final):
    with open(final) as f:
      metrics = json.load(f)
    return (f"{command}: finished, eval MSE {metrics['eval/mse']:.5f}, "
            f"{metrics['perf/steps_per_second']:.0f} steps/s (beside the suite)")
  rows = []
  if os.path.exists(os.path.join(kept, "metrics.jsonl")):
    with open(os.path.join(kept, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if "eval/mse" in line]
  last = f"; last evaluation: step {rows[-1]['step']}, eval MSE {rows[-1]['eval/mse']:.5f}" if rows else ""
  return f"{command}: stopped with the suite (exit {process.returncode}){last}"


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
  parser.add_argument("--sections", type=cli.names_of(SECTIONS), default=",".join(SECTIONS),
                      help="which sections to run (the adding run goes beside the suite)")
  parser.add_argument("--limit", type=cli.positive_int, default=0,
                      help="seconds each chosen section may take (default: LIMITS)")
  parser.add_argument("--artifacts", default="",
                      help="a directory for each section's whole output, the profile's trace "
                           "and the adding run's metrics (default: a temporary one)")
  return cli.parse(parser, argv)


def main():
  args = parse_arguments()
  backend = jax.default_backend()
  cpu = backend == "cpu"
  artifacts = args.artifacts or tempfile.mkdtemp()
  os.makedirs(artifacts, exist_ok=True)
  parts = [f"# Accelerator report, {datetime.date.today()}", "",
           f"jax {jax.__version__}; backend {backend}; devices: "
           f"{', '.join(sorted({d.device_kind for d in jax.devices()}))}; commit "
           f"{commit()}", ""]

  def write(part: str) -> None:
    parts.append(part)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(f"{args.output}.tmp", "w", encoding="utf-8") as f:
      f.write("\n".join(parts))
    os.replace(f"{args.output}.tmp", args.output)
    print(part, flush=True)

  log = lambda name: os.path.join(artifacts, f"{name}.log")
  chosen = set(args.sections)
  if "attention" in chosen:
    lengths = ["--lengths=512,2048", "--repeats=2"] if cpu else []
    write(section("Attention" + (" (CPU: lengths 512 and 2048 only)" if cpu else ""),
                  [sys.executable, "benchmarks/attention.py", *lengths],
                  args.limit or LIMITS["attention"], log=log("attention")))
  if "recurrent" in chosen:
    shapes = ["--shapes=base", "--repeats=3"] if cpu else ["--repeats=7"]
    write(section("Recurrent layers" + (" (CPU: the base shape only)" if cpu else ""),
                  [sys.executable, "benchmarks/recurrent.py", *shapes],
                  args.limit or LIMITS["recurrent"], log=log("recurrent")))
  if "linear" in chosen:
    linear = ["--lengths=1024,4096", "--linear_repeats=3"] if cpu else ["--linear_repeats=5"]
    write(section("LRU and S5: parallel against stepwise",
                  [sys.executable, "benchmarks/recurrent.py", "--section=linear",
                   "--compile_target=", *linear], args.limit or LIMITS["linear"],
                  log=log("linear")))
  if "main" in chosen:
    rows = [main_job(dtype, cpu) for dtype in ("float32", "bfloat16")]
    write("\n".join(["## The main job (nmt_dates)" + (" — 200 steps on a CPU" if cpu else ""),
                     "", "| dtype | exact match | steps/s | compile s | wall s |",
                     "|---|---|---|---|---|", *rows, ""]))
  if "profile" in chosen:
    write("## One LRA training step, profiled\n\n" + lra_profile(artifacts) + "\n")
  adding = adding_run(artifacts) if "adding" in chosen and not cpu else None
  if "suite" in chosen and cpu and not args.suite:
    marker = "gpu or tpu"
    write(section(f"Tests marked {marker} (the whole suite: `python3 project.py test`, or "
                  "--suite)", [*PYTEST, "-m", marker, "tests"], LIMITS["tests"], pytest_summary))
  elif "suite" in chosen:
    write(section("The whole suite at JAX's default settings",   # -v: each test's outcome
                  [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rf",
                   "-n", "12", "--dist", "loadgroup", "tests",
                   "--ignore=tests/training/test_wandb.py"],
                  args.limit or LIMITS["suite"], pytest_summary, log=log("suite")))
  if adding is not None:
    if "suite" not in chosen:
      time.sleep(args.limit or LIMITS["suite"])
    write("## The adding problem at T = 1000, the LRU\n\n" + adding_result(adding, artifacts)
          + "\n")
  print(f"report: {args.output}")


def commit() -> str:
  """The checkout's commit, with "+" when files differ from it."""
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                        text=True).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
  return (head or "unknown") + ("+" if dirty else "")


if __name__ == "__main__":
  cli.run(main)
