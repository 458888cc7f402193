"""Copies a finished run (or sweep) into results/, where the README's figures are read from.

    python tools/record_run.py runs/listops_cpu results/listops_cpu
    python tools/record_run.py runs/20261125-103000 results/main_job

Kept: each run's config.json, final_metrics.json and metrics.jsonl, and a sweep's
summary.csv / summary.md; checkpoints, TensorBoard files and plots stay behind (they can be
regenerated, and they are large). A README block between `<!-- from results/... -->` and
`<!-- /from -->` quotes one of these files, and tests/test_readme_results.py checks it.
"""

import os
import shutil
import sys

RUN_FILES = ("config.json", "final_metrics.json", "metrics.jsonl")
SWEEP_FILES = ("summary.csv", "summary.md")


def record(source: str, destination: str) -> list[str]:
  """Copies the kept files of the run or sweep at source; returns the paths written."""
  written = []
  for directory, _, names in os.walk(source):
    if "final_metrics.json" not in names and not set(SWEEP_FILES) & set(names):
      continue
    target = os.path.join(destination, os.path.relpath(directory, source))
    os.makedirs(target, exist_ok=True)
    for name in sorted(set(names) & {*RUN_FILES, *SWEEP_FILES}):
      shutil.copyfile(os.path.join(directory, name), os.path.join(target, name))
      written.append(os.path.join(target, name))
  if not written:
    raise SystemExit(f"error: no finished run under {source} (no final_metrics.json)")
  return written


if __name__ == "__main__":
  if len(sys.argv) != 3:
    raise SystemExit(__doc__)
  print("\n".join(record(*sys.argv[1:])))
