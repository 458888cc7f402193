"""A sweep's wall time with worker processes against the serial sweep, measured side by side.

    python3 project.py bench sweep_workers              # 4 points, 2 workers, 3 repeats
    python benchmarks/sweep_workers.py --steps 3000 --repeats 1

Four points of a small sequence_tasks config (an LSTM of width 16 on the adding task, four
learning rates: points of one cost) are trained into fresh workdirs by
`run_sweep(..., workers=1)` (one point after another in this process, on every core it has)
and by `run_sweep(..., workers=N)` (N worker processes, each on its share of the cores), in
alternating order, `--repeats` times; the persistent compilation cache is off, so both
compile every point. It prints each repeat's wall seconds and their ratio (workers /
serial), the CPU seconds each sweep took (this process's threads and the workers it
started), the median ratio, whether every point's final metrics (beyond perf/*) are the
same in both, and the load average before and after: on a machine shared with other work the
wall times are noisy, and Linux's scheduler shares the cores out by session. The workers'
time includes starting them (an interpreter and the package's imports each, about 5 s of
CPU): points of 100 000 steps (about 30 s each on 2 cores) make it a small part.

The ratio cannot fall much below the serial sweep's CPU seconds over its wall seconds,
halved on 2 cores: this LSTM keeps 1.57 cores busy alone (the Python thread dispatching a
step while XLA's runs the last), which leaves the workers 0.43 of a core to win (0.71 at
100 000 steps, docs/running.md). Workers sharing every core instead of one each did worse
(0.94 against 0.83 at 10 000 steps): each worker's threads then contend with the other's.
"""

import argparse
import os
import resource
import statistics
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

  from research import experiments
  from research.training.config import apply_overrides, load_config
  from research.training.sweep import run_sweep

CONFIG = os.path.join(ROOT, "experiments", "sequence_tasks.py") + ":task=adding,model=lstm"
OVERRIDES = {"data.length": 12, "data.eval_examples": 64, "model.hidden_size": 16,
             "train.batch_size": 16, "train.log_every": 100}
RATES = (0.01, 0.003, 0.001, 0.0003)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=cli.positive_int, default="2",
                      help="worker processes of the parallel sweep")
  parser.add_argument("--steps", type=cli.positive_int, default="100000",
                      help="training steps of each point")
  parser.add_argument("--repeats", type=cli.positive_int, default="3",
                      help="times each sweep runs (alternating which goes first)")
  return cli.parse(parser, argv, check_workers)


def check_workers(parser: cli.Parser, args: argparse.Namespace) -> None:
  if not 2 <= args.workers <= min(len(os.sched_getaffinity(0)), len(RATES)):
    parser.error(f"argument --workers: {args.workers}: give 2 to "
                 f"{min(len(os.sched_getaffinity(0)), len(RATES))} (this process has "
                 f"{len(os.sched_getaffinity(0))} cores; the sweep {len(RATES)} points)")


def sweep_seconds(config, points: list[dict], workers: int) -> tuple[float, float, list[dict]]:
  """(wall seconds, CPU seconds, rows) of the sweep trained into a new temporary workdir."""
  with tempfile.TemporaryDirectory(prefix="sweep_workers_") as workdir:
    start, cpu = time.perf_counter(), cpu_seconds()
    rows = run_sweep(config, points, workdir, experiments.get(config.experiment),
                     workers=workers)
    return time.perf_counter() - start, cpu_seconds() - cpu, rows


def cpu_seconds() -> float:
  """User and system seconds of this process (every thread) and of its ended children."""
  return sum(usage.ru_utime + usage.ru_stime for usage in (
      resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def without_perf(rows: list[dict]) -> list[dict]:
  return [{key: value for key, value in row.items() if not key.startswith("perf/")}
          for row in rows]


def main():
  args = parse_arguments()
  jax.config.update("jax_enable_compilation_cache", False)    # every point compiles
  config = apply_overrides(load_config(CONFIG)[0], {
      **OVERRIDES, "train.num_steps": args.steps, "train.eval_every": args.steps,
      "train.checkpoint_every": args.steps})
  points = [{"train.learning_rate": rate} for rate in RATES]
  print(f"{len(points)} points of {args.steps} steps; {len(os.sched_getaffinity(0))} cores; "
        f"load average before: {os.getloadavg()[0]:.2f}")
  print("| repeat | serial s | workers s | ratio | serial CPU s | workers CPU s |\n"
        "|---|---|---|---|---|---|")
  ratios, serials, parallels, same = [], [], [], True
  for repeat in range(args.repeats):
    order = (1, args.workers) if repeat % 2 == 0 else (args.workers, 1)
    measured = {workers: sweep_seconds(config, points, workers) for workers in order}
    (serial, serial_cpu, serial_rows) = measured[1]
    (parallel, parallel_cpu, parallel_rows) = measured[args.workers]
    same = same and without_perf(serial_rows) == without_perf(parallel_rows)
    serials.append(serial)
    parallels.append(parallel)
    ratios.append(parallel / serial)
    print(f"| {repeat + 1} | {serial:.1f} | {parallel:.1f} | {parallel / serial:.3f} | "
          f"{serial_cpu:.1f} | {parallel_cpu:.1f} |", flush=True)
  print(f"\nmedian ratio (workers={args.workers} / serial): {statistics.median(ratios):.3f} "
        f"(median seconds {statistics.median(parallels):.1f} / "
        f"{statistics.median(serials):.1f})")
  print(f"same final metrics per point: {'yes' if same else 'NO'}")
  print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  cli.run(main)
