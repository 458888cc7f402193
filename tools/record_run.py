"""Copies a finished run (or sweep) into results/, where the docs' result tables are read from.

    python tools/record_run.py runs/listops_cpu results/listops_cpu
    python tools/record_run.py runs/20261125-103000 results/main_job
    python tools/record_run.py --exploratory runs/probe results/exploratory/probe

Kept: each run's config.json, final_metrics.json, metrics.jsonl and provenance.jsonl, and a
sweep's summary.csv / summary.md and sweep.json (what `research.predict.compare_runs` reads
to rebuild the summary, commits and machines included); checkpoints, TensorBoard files and
plots stay behind (they can be regenerated, and they are large). A run is a directory
holding config.json or metrics.jsonl; every run under RUN_DIR must have finished (written
final_metrics.json), or nothing is copied: a stopped run is no result. `--exploratory`
records such runs (and runs that shared a device or ran beside edits) apart, under
results/exploratory/ only. Then add the row (command, commit, machine) to results/README.md,
or to results/exploratory/README.md with why the run is exploratory.
A block between `<!-- from results/... -->` and `<!-- /from -->` in README.md
or docs/ quotes one of these files, and tests/test_docs_results.py checks it.
"""

import os
import shutil
import sys

RUN_FILES = ("config.json", "final_metrics.json", "metrics.jsonl", "provenance.jsonl")
SWEEP_FILES = ("summary.csv", "summary.md", "sweep.json")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPLORATORY = os.path.join("results", "exploratory")


class RecordError(Exception):
  """A run that cannot be recorded where asked; nothing was copied."""


def runs(source: str) -> dict[str, list[str]]:
  """Each directory under source holding a run's or a sweep's files: the kept names in it."""
  found = {}
  for directory, _, names in os.walk(source):
    kept = sorted(set(names) & {*RUN_FILES, *SWEEP_FILES})
    if kept:
      found[directory] = kept
  return found


def record(source: str, destination: str, exploratory: bool = False) -> list[str]:
  """Copies the kept files of the run or sweep at source; returns the paths written.

  Refuses (RecordError, nothing copied) a run without final_metrics.json unless exploratory,
  and an exploratory record outside results/exploratory/."""
  inside = os.path.relpath(os.path.abspath(destination), ROOT).split(os.sep)
  if exploratory and EXPLORATORY.split(os.sep) != inside[:2]:
    raise RecordError(f"an exploratory run goes under {EXPLORATORY}/, not {destination}")
  found = runs(source)
  if not found:
    raise RecordError(f"no run under {source} (no config.json, metrics.jsonl or summary)")
  unfinished = [d for d, names in found.items()
                if "final_metrics.json" not in names and not set(SWEEP_FILES) & set(names)]
  if unfinished and not exploratory:
    raise RecordError(f"{unfinished[0]} has no final_metrics.json: a stopped run is no result "
                      f"(record it with --exploratory under {EXPLORATORY}/)")
  written = []
  for directory, names in found.items():
    target = os.path.join(destination, os.path.relpath(directory, source))
    os.makedirs(target, exist_ok=True)
    for name in names:
      shutil.copyfile(os.path.join(directory, name), os.path.join(target, name))
      written.append(os.path.join(target, name))
  return written


def main(argv: list[str]) -> int:
  exploratory = "--exploratory" in argv
  paths = [a for a in argv if a != "--exploratory"]
  if len(paths) != 2 or any(a.startswith("-") for a in paths):
    print(__doc__.strip(), file=sys.stderr)
    return 2
  try:
    print("\n".join(record(*paths, exploratory=exploratory)))
  except RecordError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  readme = os.path.join(EXPLORATORY if exploratory else "results", "README.md")
  print(f"now add its row (command, commit, machine) to {readme}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
