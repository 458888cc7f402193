"""Long rows of a visit list cut into slices, one program each (split-K, as flash decoding).

A tile whose visit list is far longer than the others' (a query tile holding global rows
sees every key; a key tile holding global tokens is seen by every query) is one program
walking all its tiles while the rest of the grid has finished. `split` cuts each such row
into consecutive slices that separate programs walk; the kernels combine their partial
results afterwards (`pallas_gpu`). Everything here is NumPy, at trace time.
"""

import math
from typing import NamedTuple

import numpy as np

# A row is long when it visits more than this many times the median row's tiles. Dense
# causal rows visit at most about twice the median (the last row sees every key): never
# split; nor a window's rows, all alike.
LONG_FACTOR = 3


class Slices(NamedTuple):
  """The long rows of a visit list, each cut into `parts` consecutive slices.

  Slice s of long row n is entry n · parts + s of `visits` / `counts` / `owners`, in the
  format of `masks.visit_lists` (its partially visible tiles first, then the full ones)."""
  rows: np.ndarray      # int32 [long]: the long rows (tile indices along the row axis)
  parts: int            # slices per long row
  visits: np.ndarray    # int32 [long · parts, most]: the tiles each slice visits
  counts: np.ndarray    # int32 [long · parts, 2]: (partial, all) of each slice
  owners: np.ndarray    # int32 [long · parts]: the row each slice belongs to


def default_parts(longest: int) -> int:
  """√(the tiles the longest row visits), rounded up: √n slices of √n tiles each, so that the
  row's programs take about √n steps instead of n, for √n partial results to combine."""
  return math.ceil(math.sqrt(longest))


def long_rows(counts: np.ndarray) -> np.ndarray:
  """int [rows]: the rows visiting more than LONG_FACTOR × the median row's tiles (rows
  that visit nothing aside) and at least 2 tiles. counts: int [rows, 2] (partial, all)."""
  visited = counts[:, 1]
  if not (visited > 0).any():
    return np.zeros(0, np.int64)
  median = np.median(visited[visited > 0])
  return np.flatnonzero((visited > LONG_FACTOR * median) & (visited >= 2))


def split(visits: np.ndarray, counts: np.ndarray,
          parts: int | None) -> tuple[np.ndarray, Slices | None]:
  """(counts with the long rows emptied, their Slices), or (counts, None) when no row is
  long or `parts` < 2. parts: slices per long row (None: `default_parts` of the longest),
  at most the shortest long row's tiles; a row of c tiles gets slices of ⌊c / parts⌋ or
  ⌈c / parts⌉ tiles. visits, counts: `masks.visit_lists`' arrays."""
  rows = long_rows(counts)
  if not rows.size:
    return counts, None
  parts = default_parts(int(counts[rows, 1].max())) if parts is None else parts
  parts = min(parts, int(counts[rows, 1].min()))
  if parts < 2:
    return counts, None
  starts = [[c * s // parts for s in range(parts + 1)] for c in counts[rows, 1]]
  most = max(b - a for bounds in starts for a, b in zip(bounds, bounds[1:]))
  sliced = np.zeros((rows.size * parts, most), np.int32)
  sliced_counts = np.zeros((rows.size * parts, 2), np.int32)
  for n, (row, bounds) in enumerate(zip(rows, starts)):
    for s, (first, end) in enumerate(zip(bounds, bounds[1:])):
      sliced[n * parts + s, :end - first] = visits[row, first:end]
      partial = min(max(counts[row, 0] - first, 0), end - first)  # the partial tiles come first
      sliced_counts[n * parts + s] = (partial, end - first)
  short = counts.copy()
  short[rows] = 0
  owners = np.repeat(rows, parts).astype(np.int32)
  return short, Slices(rows.astype(np.int32), parts, sliced, sliced_counts, owners)
