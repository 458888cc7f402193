"""tools/listops_lra_data.py: ListOps splits redrawn in parallel from saved generator states
are `listops.write_splits`' files byte for byte; a chunk that does not redraw its trees is
refused."""

import os
import sys

import pytest

from research.data import listops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import listops_lra_data  # noqa: E402

SPLITS, LENGTHS = (("train", 40), ("val", 6), ("test", 7)), (10, 80)


@pytest.mark.slow   # the pool's processes start a Python each
def test_parallel_splits_are_the_sequential_ones(tmp_path):
  """Chunks of 9 trees (53 in all: the last chunk short, a chunk across the split borders),
  redrawn by 2 workers, against the recipe's own sequential writer."""
  states = listops_lra_data.snapshot(seed=3, splits=SPLITS, lengths=LENGTHS, chunk=9)
  assert [c["count"] for c in states["chunks"]] == [9] * 5 + [8]
  ours = listops_lra_data.generate(states, str(tmp_path / "parallel"), workers=2)
  theirs = listops.write_splits(tmp_path / "sequential", 3, SPLITS, LENGTHS)
  for split, path in theirs.items():
    with open(path, "rb") as want, open(ours[split], "rb") as got:
      assert got.read() == want.read(), split


def test_a_chunk_that_differs_is_refused(tmp_path):
  """A saved hash that the redrawn chunk does not match: ValueError, no file written."""
  states = listops_lra_data.snapshot(seed=3, splits=SPLITS, lengths=LENGTHS, chunk=20)
  states["chunks"][1]["sha256"] = "0" * 64
  with pytest.raises(ValueError, match="differs from the sequential draw"):
    listops_lra_data.generate(states, str(tmp_path / "out"), workers=1)
  assert not os.path.exists(tmp_path / "out")
