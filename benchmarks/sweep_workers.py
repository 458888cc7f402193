"""A sweep's wall time with worker processes against the serial sweep, measured side by side.

    python3 project.py bench sweep_workers              # 4 points, 2 workers, 3 repeats
    python benchmarks/sweep_workers.py --sizes small --steps 3000 --repeats 1

Four points of sequence_tasks' adding problem with an LSTM, four learning rates (points of
one cost), are trained into fresh workdirs by `run_sweep(..., workers=1)` (one point after
another in this process, on every core it has) and by `run_sweep(..., workers=N)` (N worker
processes, each on its share of the cores), in alternating order, `--repeats` times; the
persistent compilation cache is off, so both compile every point. `--sizes` picks the points:

  config  the experiment's own sizes (width 64, batch 64, T = 100) and its 2 000 steps: the
          points of its README sweep. A step's XLA work (about 7 ms) dwarfs Python's
          dispatch; the serial sweep keeps 1.27 cores busy (XLA splits some of a step's
          operations over its 2 threads). Measured 0.73× (55.7 s against 75.9 s, medians
          of 3 repeats), the same final metrics.
  small   width 16, batch 16, T = 12, 100 000 steps: a step of about 0.3 ms, as long as
          Python's dispatch of it. The serial sweep keeps 1.54 cores busy alone (Python
          dispatches a step while XLA runs the last), which leaves workers less than half
          a core to win: 0.76× (99.6 s against 130.4 s, one repeat).
  long    width 32, batch 32, T = 400, 2 000 steps: a step of about 10 ms, one long scan of
          small operations. The serial sweep still keeps 1.25 cores busy; 0.611× (54.0 s
          against 88.3 s, medians of 3 repeats whose ratios ran 0.565 to 0.792), the same
          final metrics.

Each worker's XLA pool has as many threads as the serial sweep's (on its one core), so that
its long reductions split as the serial sweep's do and every point ends with the serial
sweep's bits (research/training/sweep_workers.py). Workers whose pool had one thread (started
on one core) were faster, 0.64× for `config` (50.2 s against 76.8 s), but ended with other
last digits; workers sharing both cores with 2 threads each took 0.72×.

It prints each repeat's wall seconds and their ratio (workers / serial), the CPU seconds each
sweep took (this process's threads and the workers it started), the median ratio, whether
every point's final metrics (beyond perf/*) are the same in both, and the load average before
and after: on a machine shared with other work the wall times are noisy, and Linux's
scheduler shares the cores out by session. The workers' time includes starting them (an
interpreter and the package's imports each, about 5 s of CPU).
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
SIZES = {  # --sizes: the overrides of the config's keys (module docstring)
    "config": {},
    "small": {"data.length": 12, "data.eval_examples": 64, "model.hidden_size": 16,
              "train.batch_size": 16, "train.log_every": 100, "train.num_steps": 100_000},
    "long": {"data.length": 400, "data.eval_examples": 64, "model.hidden_size": 32,
             "train.batch_size": 32, "train.log_every": 100},
}
RATES = (0.01, 0.003, 0.001, 0.0003)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
  parser = cli.Parser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=cli.positive_int, default="2",
                      help="worker processes of the parallel sweep")
  parser.add_argument("--sizes", default="config", choices=tuple(SIZES),
                      help="the points' sizes (module docstring; default: %(default)s)")
  parser.add_argument("--steps", type=cli.positive_int, default=None,
                      help="training steps of each point (default: the sizes' own, 2 000 or "
                           "100 000)")
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
  config = apply_overrides(load_config(CONFIG)[0], SIZES[args.sizes])
  steps = args.steps or config.train.num_steps
  config = apply_overrides(config, {"train.num_steps": steps, "train.eval_every": steps,
                                    "train.checkpoint_every": steps})
  points = [{"train.learning_rate": rate} for rate in RATES]
  print(f"{len(points)} points of {steps} steps ({args.sizes} sizes); "
        f"{len(os.sched_getaffinity(0))} cores; "
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
