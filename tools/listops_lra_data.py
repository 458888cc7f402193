"""LRA's ListOps splits (research/data/listops.py's recipe, seed 0) written in about a minute
on a machine of many cores, for a GPU loan too short to draw them one after another.

    python tools/listops_lra_data.py snapshot tools/listops_lra_states.json
    python tools/listops_lra_data.py generate tools/listops_lra_states.json data/listops

`snapshot` (once, about 20 minutes on one core) runs the recipe's sequential draw and keeps the
random generator's state at the start of every CHUNK accepted trees, and each chunk's SHA-256;
`generate` redraws the chunks side by side from those states, checks each against its hash,
and writes train.tsv, val.tsv and test.tsv as `listops.write_splits` does, byte for byte (the
files `experiments/listops.py` reads from <data.dir>/listops/). A chunk that needed an earlier
chunk's trees to reject a duplicate would fail its hash: `generate` then says so and writes
nothing.
"""

import argparse
import csv
import hashlib
import io
import json
import multiprocessing
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from research.data import listops  # noqa: E402
from research.files import atomic_write  # noqa: E402

CHUNK = 3125          # accepted trees per chunk: LRA's 100 000 in 32 chunks


def _accepted(rng: random.Random, count: int, lengths: tuple[int, int], seen: set) -> list:
  """The next `count` trees `listops.draw_split_trees` accepts from rng (its loop)."""
  trees = []
  while len(trees) < count:
    tree, length = listops.draw_tree(rng)
    if lengths[0] < length < lengths[1]:
      source = listops.to_source(tree)
      if source not in seen:
        seen.add(source)
        trees.append(tree)
  return trees


def _rows_text(trees: list) -> str:
  """The TSV rows of `trees` as `listops.write_splits` writes them (no header)."""
  text = io.StringIO()
  csv.writer(text, delimiter="\t", lineterminator="\n").writerows(
      (listops.to_source(tree), listops.evaluate(tree)) for tree in trees)
  return text.getvalue()


def snapshot(seed: int = 0, splits=listops.LRA_SPLITS, lengths=listops.LRA_LENGTHS,
             chunk: int = CHUNK) -> dict:
  """The recipe's draw, sequentially: {seed, splits, lengths, chunks: [{state, count,
  sha256}]}, a chunk's state the generator's at its first draw."""
  rng, seen, chunks = random.Random(seed), set(), []
  total = sum(size for _, size in splits)
  for start in range(0, total, chunk):
    count = min(chunk, total - start)
    version, state, gauss = rng.getstate()
    trees = _accepted(rng, count, lengths, seen)
    chunks.append(dict(state=[version, list(state), gauss], count=count,
                       sha256=hashlib.sha256(_rows_text(trees).encode()).hexdigest()))
  return dict(seed=seed, splits=[list(s) for s in splits], lengths=list(lengths), chunks=chunks)


def _redraw(job: tuple) -> str:
  """One chunk's rows from its saved state; ValueError when they differ from the snapshot's."""
  (version, state, gauss), count, lengths, sha256 = job
  rng = random.Random()
  rng.setstate((version, tuple(state), gauss))
  text = _rows_text(_accepted(rng, count, tuple(lengths), set()))
  if hashlib.sha256(text.encode()).hexdigest() != sha256:
    raise ValueError("a chunk redrawn from its state differs from the sequential draw (a "
                     "duplicate of an earlier chunk's tree): draw the splits sequentially")
  return text


def generate(states: dict, directory: str, workers: int | None = None) -> dict[str, str]:
  """Writes <directory>/{train,val,test}.tsv from `snapshot`'s states, the chunks redrawn by
  `workers` processes (None: one per core; 1: in this one); returns split -> path."""
  jobs = [(c["state"], c["count"], states["lengths"], c["sha256"]) for c in states["chunks"]]
  if workers == 1:
    texts = list(map(_redraw, jobs))
  else:
    with multiprocessing.get_context("spawn").Pool(workers or os.cpu_count()) as pool:
      texts = pool.map(_redraw, jobs)
  lines = "".join(texts).splitlines(keepends=True)
  os.makedirs(directory, exist_ok=True)
  paths, start = {}, 0
  for name, size in states["splits"]:
    paths[name] = os.path.join(directory, f"{name}.tsv")
    with atomic_write(paths[name], "w", newline="", encoding="utf-8") as f:
      f.write("\t".join(listops.HEADER) + "\n")
      f.writelines(lines[start:start + size])
    start += size
  return paths


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  commands.add_parser("snapshot").add_argument("states", help="the JSON file to write")
  make = commands.add_parser("generate")
  make.add_argument("states", help="snapshot's JSON file")
  make.add_argument("directory", help="where train.tsv, val.tsv, test.tsv go (data/listops)")
  args = parser.parse_args(argv)
  if args.command == "snapshot":
    with atomic_write(args.states, "w", encoding="utf-8") as f:
      json.dump(snapshot(), f)
    print(f"wrote {args.states}")
    return
  with open(args.states, encoding="utf-8") as f:
    states = json.load(f)
  for name, path in generate(states, args.directory).items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  main()
