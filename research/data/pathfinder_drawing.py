"""Drawing Pathfinder images (Linsley et al., NeurIPS 2018): the recipe of Linsley's
`snakes2.py`, re-implemented in numpy over a block of images at once. research.data.pathfinder
holds LRA's parameters for it and the files; this module draws (`draw_samples`).
"""

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

ANGLES, OFFSETS = 128, 4      # directions and sub-cell positions of the precomputed zones
CANDIDATES = 10               # directions tried per paddle (the original: ~9 pixels of a circle)
DISTRACTOR_TRIES = 5          # the original's max_distractor_contour_retrial 4, plus the first
TRIAL_ROWS = 1024             # attempts at the target paths drawn at once
TRIAL_BYTES = 64 << 20        # and at most this much grid for them
CHUNK = 256                   # rows whose zones are marked at once (their temporaries in cache)
BLOCK_DIVIDES = 1000          # block sizes divide LRA's folders of 1000 images


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The generator's parameters; lengths in pixels of the final image."""
  resolution: int                  # images are resolution x resolution
  contour_length: int              # paddles in each target path
  distractor_length: int           # paddles in each distractor path
  num_distractors: int             # distractor paths (fewer when no room is left)
  paddle_length: float
  paddle_thickness: float
  paddle_margins: tuple[int, ...]  # the margin m, one drawn per image; dashes are 2m apart
  continuity: float                # turn weight cos^2(min(continuity |turn|, pi/2))
  marker_radius: float
  seed_distance: float             # between the starts of the two target paths
  padding: float                   # paddles stay this far inside the image
  paddle_contrast: float           # a paddle's peak grey, a marker's being 1
  antialias_scale: int = 2         # drawn this many times finer, then averaged down
  clearance: float = 1.0           # ours: extra room between paths (draw_samples)


class Samples(NamedTuple):
  images: np.ndarray    # uint8 [count, R zoom, R zoom], grey levels
  labels: np.ndarray    # int32 [count], 1 = the markers are on one path; image i has i % 2
  markers: np.ndarray   # float32 [count, 2, 2], the markers' centres (row, column) in pixels
  margins: np.ndarray   # int32 [count], each image's paddle margin


def draw_samples(seed: int, count: int, recipe: Recipe, start: int = 0, zoom: int = 1
                 ) -> Samples:
  """Images start .. start + count - 1 of the sequence `seed` and `recipe` define; with `zoom`,
  the same images drawn zoom times larger (markers stay in pixels of the resolution).

  Images are drawn in blocks of `block_size(recipe)`, block b from
  numpy.random.default_rng([seed, contour_length, resolution, b]), so image i depends on
  neither count nor start. Labels alternate, 0 for even i.

  An image shows two markers (small discs) and several paths, each a chain of short dashes
  ("paddles"); the label is 1 when the markers sit at the two ends of one path, 0 when they
  sit on two different paths.

  * Two target paths of `contour_length` paddles start `seed_distance` apart near the centre
    (the first start uniform in the square [2 seed_distance, R - 2 seed_distance]^2, the second
    at a uniform angle around it, each first paddle in a uniform direction). A paddle is a
    segment `paddle_length` px long and `paddle_thickness` px wide. From a paddle with unit
    direction u the path pivots at its head + m u (m the paddle margin) and the next paddle runs
    from pivot + m v to pivot + (paddle_length + m) v: dashes 2m apart, the path bending in the
    middle of the gap. The turn d from u to v is drawn with weight cos^2(continuity d) among
    CANDIDATES directions spread over |d| < pi / (2 continuity) (90 deg at continuity 1.0, 50 at
    1.8), those whose paddle stays clear of everything drawn. The two paths grow a paddle each
    in turn; when one finds no room (or the far marker would come too close to the other path)
    the image is drawn again from the start, as the original does.
  * A positive marks both ends of path 0; a negative marks the start of path 0 and the far end
    of path 1. Both classes hold the same two target paths, so ink counts say nothing.
  * `num_distractors` paths of `distractor_length` paddles then start at random free places; one
    that finds no room in DISTRACTOR_TRIES starts is left out (the original's allow_incomplete).
  * Keep-out: the centre lines of two paths stay at least 2m + thickness + `clearance` apart,
    and at least marker_radius more from a marker of the other path; a path stays as far from
    its own paddles except the one before. The original's rule is the same with clearance 0
    (a paddle dilated by m may not overlap the others dilated by m): the ink of two paths is
    then as close as two dashes of one path (2m). `clearance` (1 px by default) is ours: it
    makes every gap between paths wider than every gap within one, so whether the markers are
    connected can be read from the drawing. At 32 x 32 the pixels blur each stroke by about a
    pixel, so the images themselves do not always show it; drawn with `zoom` 4 they do
    (tests/data/test_pathfinder.py checks it with scipy).
  * Each paddle (a flat-ended stroke) and marker (a disc), both with a soft edge of one fine
    pixel, is drawn antialias_scale times finer, averaged down over antialias_scale^2 blocks
    on its own (the original: a Lanczos resize) and scaled to a peak of paddle_contrast (1 for
    markers), as the original's per-paddle imresize did; the strokes combine by their maximum,
    and each image is scaled so its brightest pixel is 255 (the original's imsave did). So at
    32 x 32 (contrast 1.5) the dashes are white and the markers grey, as in LRA's images.
  """
  size, parts = block_size(recipe), []
  for block in range(start // size, -(-(start + count) // size)):
    rng = np.random.default_rng([seed, recipe.contour_length, recipe.resolution, block])
    keep = slice(max(start - block * size, 0), min(start + count - block * size, size))
    parts.append(_draw_block(rng, block * size, size, recipe, keep, zoom))
  if not parts:
    side = recipe.resolution * zoom
    return Samples(np.zeros((0, side, side), np.uint8), np.zeros(0, np.int32),
                   np.zeros((0, 2, 2), np.float32), np.zeros(0, np.int32))
  return Samples(*(np.concatenate(arrays) for arrays in zip(*parts, strict=True)))


def block_size(recipe: Recipe) -> int:
  """Images drawn together: about 8192 / resolution (250 at 32, 50 at 128), dividing 1000."""
  return max(size for size in range(1, BLOCK_DIVIDES + 1)
             if BLOCK_DIVIDES % size == 0 and size <= max(1, 8192 // recipe.resolution))


# A block's state, `_Board`: `grid` [B, G, G] int8 (antialias_scale cells per pixel, plus a
# border) marks each paddle's keep-out zone with its slot + 1 (-1 where several zones meet,
# or a marker's); `tails`, `heads` [B, P, 2] hold each paddle slot's ends (row, column in
# pixels) and `drawn` [B, P] which slots hold a paddle. Slots 0 .. n-1 are target path 0,
# n .. 2n-1 path 1, then the distractors'. A new paddle may lie only on free cells or on the
# zone of the paddle before it. Zones come from precomputed masks per direction and sub-cell
# position (`_zone_masks`), widened by the masks' and the grid's rounding so that the
# keep-out distances hold exactly.

class _Board:

  def __init__(self, recipe: Recipe, rows: int):
    self.recipe, self.scale = recipe, recipe.antialias_scale
    # A zone reaches `slack` beyond keep_out: a point of a paddle lies within half a cell of
    # one of its `points` (one cell apart), which lies within half a cell's diagonal of its
    # cell's centre; so a paddle whose points all avoid a zone keeps keep_out from its paddle.
    self.slack = (math.sqrt(0.5) + 0.5) / self.scale
    widest = _keep_out(recipe, max(recipe.paddle_margins))
    reach = recipe.paddle_length + 2 * (widest + recipe.marker_radius + self.slack)
    self.border = math.ceil(reach * self.scale) + 4   # room for the zones of edge paddles
    cells = recipe.resolution * self.scale + 2 * self.border
    self.grid = np.zeros((rows, cells, cells), np.int8)
    slots = 2 * recipe.contour_length + recipe.num_distractors * recipe.distractor_length
    self.tails = np.zeros((rows, slots, 2), np.float32)
    self.heads = np.zeros((rows, slots, 2), np.float32)
    self.drawn = np.zeros((rows, slots), bool)
    if slots + 1 > np.iinfo(self.grid.dtype).max:
      raise ValueError(f"{slots} paddles per image: the grid's marks hold at most 126")
    self.margins = np.zeros(rows, np.float32)
    self.keep_out = np.zeros(rows, np.float32)
    count = math.ceil(recipe.paddle_length * self.scale) + 1
    self.fractions = np.linspace(0, 1, count, dtype=np.float32)[:, None]

  def reset(self, margins: np.ndarray) -> None:
    """Empties the first len(margins) rows, for images with these paddle margins."""
    count = len(margins)
    self.grid[:count], self.drawn[:count], self.margins[:count] = 0, False, margins
    self.keep_out[:count] = _keep_out(self.recipe, self.margins[:count])

  def flat(self, rows: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Indices into grid.ravel() of the cells of points [n, ..., 2] (pixels) of `rows` [n]."""
    cells = self.grid.shape[1]
    index = np.clip(np.floor(points * self.scale).astype(np.int64) + self.border, 0, cells - 1)
    rows = rows.reshape(rows.shape + (1,) * (points.ndim - 2))
    return (rows * cells + index[..., 0]) * cells + index[..., 1]

  def free(self, rows: np.ndarray, points: np.ndarray, own: np.ndarray) -> np.ndarray:
    """[n, ...] whether every point [n, ..., S, 2] lies inside the padding, in cells that are
    free or marked `own` [n] (the zone of the paddle before)."""
    pad, size = self.recipe.padding, self.recipe.resolution
    inside = ((points >= pad) & (points <= size - pad)).all(-1)
    marks = self.grid.ravel()[self.flat(rows, points)]
    own = own.astype(np.int8).reshape(own.shape + (1,) * (marks.ndim - 1))
    return (inside & ((marks == 0) | (marks == own))).all(-1)

  def place(self, rows: np.ndarray, slot: int, tails: np.ndarray, heads: np.ndarray,
            marked: bool = True) -> None:
    """Puts paddles tails -> heads [n, 2] in `slot` of `rows`; marks their zones slot + 1."""
    self.tails[rows, slot], self.heads[rows, slot], self.drawn[rows, slot] = tails, heads, True
    if marked:
      self.mark(rows, tails, heads, self.recipe.paddle_length, 0.0, slot + 1)

  def mark(self, rows: np.ndarray, tails: np.ndarray, heads: np.ndarray, length: float,
           extra: float, mark: int) -> None:
    """Marks the zones of segments tails -> heads [n, 2], `length` px long (0: discs around
    the tails), of `rows`: the cells within keep_out + extra (+ slack) of them, with `mark`,
    or -1 where another mark is there. The zones are `_zone_masks` of the segments'
    direction and sub-cell position, CHUNK rows at a time (their temporaries in cache)."""
    start = tails * self.scale
    base = np.floor(start).astype(np.int64)
    offset = np.minimum(((start - base) * OFFSETS).astype(np.int64), OFFSETS - 1)
    angles = ANGLES if length else 1
    angle = np.rint(np.arctan2(*(heads - tails).T) * (angles / (2 * np.pi))).astype(np.int64)
    angle %= angles
    cells, grid, mark = self.grid.shape[1], self.grid.ravel(), np.int8(mark)
    radii = self.keep_out[rows]
    for radius, chunk in itertools.product(np.unique(radii), range(0, len(rows), CHUNK)):
      group = np.zeros(len(rows), bool)
      group[chunk:chunk + CHUNK] = radii[chunk:chunk + CHUNK] == radius
      zones, corners = _zone_cells(length * self.scale,
                                   float(radius + extra + self.slack) * self.scale, cells)
      corner = base[group] + corners[angle[group]] + self.border
      first = (rows[group] * cells + corner[:, 0]) * cells + corner[:, 1]
      index = first[:, None] + zones[angle[group], offset[group, 0], offset[group, 1]]
      old = grid[index]
      grid[index] = np.where((old == 0) | (old == mark), mark, np.int8(-1))

  def points(self, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Points [..., S, 2] along segments [..., 2], at most a cell apart."""
    return tails[..., None, :] + self.fractions * (heads - tails)[..., None, :]

  def far(self, points: np.ndarray, tails: np.ndarray, heads: np.ndarray, distance
          ) -> np.ndarray:
    """Whether the segment that `points` [..., S, 2] sample lies at least `distance` from the
    segments tails -> heads [..., 2] (every point of it is within half a cell of a sample)."""
    return _distance(points, tails[..., None, :], heads[..., None, :]).min(-1) >= (
        distance + 0.5 / self.scale)


@functools.lru_cache(maxsize=16)
def _zone_masks(length: float, radius: float) -> tuple[np.ndarray, np.ndarray]:
  """The zones of segments `length` cells long: (masks bool [A, OFFSETS, OFFSETS, W, W],
  corners int [A, 2]), A = ANGLES (1 for length 0, a disc). masks[a, i, j] marks the cells of
  a window whose corner is corners[a] cells from the cell holding the tail, for a segment of
  direction 2 pi a / A from the point (i + 1/2, j + 1/2) / OFFSETS of that cell: the cells
  whose centres lie within `radius` cells of it, widened by the farthest a segment in that bin
  can lie from it (so the mask holds the zone of every segment the bin stands for)."""
  angles = ANGLES if length else 1
  reach = radius + math.sqrt(0.5) / OFFSETS + length * math.pi / angles
  ways = _unit(np.arange(angles) * (2 * np.pi / angles)).astype(np.float64)
  corners = np.floor(np.minimum(0, length * ways) - reach).astype(np.int64) - 1
  steps = np.arange(math.ceil(length + 2 * reach) + 3)
  starts = (np.arange(OFFSETS) + 0.5) / OFFSETS
  masks = np.zeros((angles, OFFSETS, OFFSETS, len(steps), len(steps)), bool)
  for angle, (corner, way) in enumerate(zip(corners, length * ways, strict=True)):
    y = (corner[0] + steps[:, None] + 0.5 - starts[:, None, None, None])   # [Q, 1, W, 1]
    x = (corner[1] + steps + 0.5 - starts[:, None, None])                 # [Q, 1, W]
    t = np.clip((y * way[0] + x * way[1]) / max(length, 1e-9) ** 2, 0, 1)
    masks[angle] = (y - t * way[0]) ** 2 + (x - t * way[1]) ** 2 <= reach ** 2
  return masks, corners


def _keep_out(recipe: Recipe, margins):
  """The least distance between the centre lines of two paths: 2 margin + thickness +
  clearance (their ink 2 margin + clearance apart, the dashes of one path at most 2 margin)."""
  return 2 * margins + recipe.paddle_thickness + recipe.clearance


@functools.lru_cache(maxsize=16)
def _zone_cells(length: float, radius: float, cells: int) -> tuple[np.ndarray, np.ndarray]:
  """`_zone_masks` as offsets into a grid `cells` wide: (zones int [A, OFFSETS, OFFSETS, N],
  corners [A, 2]), each zone's cells from its window's corner, padded by repeating one."""
  masks, corners = _zone_masks(length, radius)
  flat = masks.reshape(-1, masks.shape[-2] * masks.shape[-1])
  window = (np.arange(masks.shape[-2])[:, None] * cells + np.arange(masks.shape[-1])).ravel()
  size = flat.sum(-1).max()
  order = np.argsort(~flat, axis=-1, kind="stable")[:, :size]         # the marked cells first
  zones = np.where(np.arange(size) < flat.sum(-1, keepdims=True), window[order],
                   window[order[:, :1]])
  return zones.reshape(masks.shape[:3] + (size,)), corners


def _distance(points: np.ndarray, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
  """Euclidean distance from points [..., 2] to segments tails -> heads [..., 2]."""
  along = heads - tails
  length2 = np.maximum((along * along).sum(-1), 1e-12)
  t = np.clip(((points - tails) * along).sum(-1) / length2, 0, 1)
  return np.linalg.norm(points - tails - t[..., None] * along, axis=-1)


def _unit(angles: np.ndarray) -> np.ndarray:
  return np.stack([np.sin(angles), np.cos(angles)], -1).astype(np.float32)



def _extend(board: _Board, rows: np.ndarray, slot: int, rng: np.random.Generator,
            trying: int | None = None) -> np.ndarray:
  """Adds to `rows` the paddle after slot - 1, in `slot`; returns which rows found room.
  `trying`: the first slot of a path being tried (a distractor), not yet on the grid: the
  new paddle keeps keep_out from its paddles before slot - 1 by distance, and is not marked."""
  recipe = board.recipe
  tails, heads = board.tails[rows, slot - 1], board.heads[rows, slot - 1]
  margin = board.margins[rows][:, None, None]
  direction = np.arctan2(*(heads - tails).T)
  pivot = heads + margin[:, 0] * _unit(direction)
  limit = np.pi / (2 * recipe.continuity)
  turns = (np.arange(CANDIDATES) + rng.random((len(rows), 1))) * (2 * limit / CANDIDATES) - limit
  ways = _unit(direction[:, None] + turns)                                    # [n, K, 2]
  new_tails = pivot[:, None] + margin * ways
  new_heads = pivot[:, None] + (margin + recipe.paddle_length) * ways
  points = board.points(new_tails, new_heads)                                 # [n, K, S, 2]
  if trying is None:
    free = board.free(rows, points, np.full(len(rows), slot))
  else:
    free = board.free(rows, points, np.zeros(len(rows)))
    for before in range(trying, slot - 1):
      free &= board.far(points, board.tails[rows, before, None], board.heads[rows, before, None],
                        board.keep_out[rows, None])
  weights = np.cumsum(np.cos(recipe.continuity * turns) ** 2 * free, -1)      # [n, K]
  ok = weights[:, -1] > 0
  pick = (weights < rng.random((len(rows), 1)) * weights[:, -1:]).sum(-1)
  pick = np.minimum(pick, CANDIDATES - 1)[ok]
  board.place(rows[ok], slot, new_tails[ok, pick], new_heads[ok, pick], trying is None)
  return ok


def _seed_targets(board: _Board, rows: np.ndarray, rng: np.random.Generator) -> None:
  """First paddles of both target paths (slots 0 and n) and the zone of path 0's marker."""
  recipe, n = board.recipe, board.recipe.contour_length
  gap, size, length = recipe.seed_distance, recipe.resolution, recipe.paddle_length
  while len(rows):
    count = len(rows)
    low, span = min(2 * gap, size / 2), max(size - 4 * gap, 0)
    starts0 = (low + span * rng.random((count, 2))).astype(np.float32)
    starts1 = starts0 + gap * _unit(rng.uniform(0, 2 * np.pi, count))
    ends0 = starts0 + length * _unit(rng.uniform(-np.pi, np.pi, count))
    ends1 = starts1 + length * _unit(rng.uniform(-np.pi, np.pi, count))
    ends = np.stack([starts0, ends0, starts1, ends1], 1)
    keep, along1 = board.keep_out[rows], board.points(starts1, ends1)
    ok = ((ends >= recipe.padding) & (ends <= size - recipe.padding)).all((1, 2))
    ok &= board.far(along1, starts0, ends0, keep)
    ok &= board.far(along1, starts0, starts0, keep + recipe.marker_radius)   # path 0's marker
    placed = rows[ok]
    board.place(placed, 0, starts0[ok], ends0[ok])
    board.place(placed, n, starts1[ok], ends1[ok])
    board.mark(placed, starts0[ok], starts0[ok], 0, recipe.marker_radius, 1)
    rows = rows[~ok]


def _draw_targets(recipe: Recipe, labels: np.ndarray, margins: np.ndarray,
                  rng: np.random.Generator) -> tuple[_Board, np.ndarray]:
  """A board holding both target paths (slots 0 .. n-1 and n .. 2n-1) of every image, and the
  markers [B, 2, 2]: the start of path 0, and the far end of path 0 (label 1) or of path 1.

  An attempt fails when a path finds no room to go on or the far marker comes too close to
  the other path; the original then draws the image again from the start. Long paths seldom
  fit the frame (about 1 attempt in 30 succeeds at 32 x 32 hard, 1 in 300 at 128 x 128 hard,
  1 in 1700 at 64 x 64 hard, whose 14 paddles of 7 px barely turn), so attempts are drawn
  many at once on a scratch board, each for the label and margin of a pending image, and the
  k-th success for a (label, margin) goes to the k-th pending image with them: each image
  gets the first success of its own sequence of independent attempts, as in the original.
  """
  n = recipe.contour_length
  board = _Board(recipe, len(labels))
  board.reset(margins)
  trial = _Board(recipe, max(len(labels), min(TRIAL_ROWS, TRIAL_BYTES // board.grid[0].nbytes)))
  markers = np.zeros((len(labels), 2, 2), np.float32)
  kinds = labels * (max(recipe.paddle_margins) + 1) + margins      # (label, margin) of images
  pending = np.arange(len(labels))
  attempts, successes = 0, 0
  for _ in range(100_000):
    if not len(pending):
      return board, markers
    rate = (successes + 1) / (attempts + 2)
    count = min(len(trial.grid), math.ceil(1.2 * len(pending) / rate))
    serves = pending[np.arange(count) % len(pending)]            # whose kind each attempt has
    trial.reset(margins[serves])
    _seed_targets(trial, np.arange(count), rng)
    alive = np.arange(count)
    for k in range(1, n):
      alive = alive[_extend(trial, alive, k, rng)]
      alive = alive[_extend(trial, alive, n + k, rng)]
    positive = labels[serves[alive]] == 1
    origin = trial.tails[alive, 0]
    end = trial.heads[alive, np.where(positive, n - 1, 2 * n - 1)]
    other = np.where(positive, n, 0)[:, None] + np.arange(n)            # the unmarked path
    keep = trial.keep_out[alive] + recipe.marker_radius
    clear = _distance(end[:, None], trial.tails[alive[:, None], other],
                      trial.heads[alive[:, None], other]).min(-1) >= keep
    clear &= positive | (np.linalg.norm(end - origin, axis=-1) >= keep + recipe.marker_radius)
    attempts, successes = attempts + count, successes + clear.sum()
    won, origin, end = alive[clear], origin[clear], end[clear]
    done, chosen = [], []
    for kind in np.unique(kinds[pending]):
      waiting, wins = pending[kinds[pending] == kind], np.flatnonzero(kinds[serves[won]] == kind)
      done.append(waiting[:len(wins)])
      chosen.append(wins[:len(waiting)])
    done, chosen = np.concatenate(done), np.concatenate(chosen)
    rows = won[chosen]
    board.grid[done], board.drawn[done] = trial.grid[rows], trial.drawn[rows]
    board.tails[done], board.heads[done] = trial.tails[rows], trial.heads[rows]
    markers[done] = np.stack([origin[chosen], end[chosen]], 1)
    board.mark(done, end[chosen], end[chosen], 0, recipe.marker_radius, -1)
    pending = np.setdiff1d(pending, done)
  raise RuntimeError(f"Pathfinder: no room for two target paths in {recipe}")


def _seed_path(board: _Board, rows: np.ndarray, slot: int, rng: np.random.Generator
               ) -> np.ndarray:
  """A distractor's first paddle in `slot`, at the first of CANDIDATES random places that is
  free; returns which rows found one."""
  recipe = board.recipe
  low, high = recipe.padding, recipe.resolution - recipe.padding
  tails = (low + (high - low) * rng.random((len(rows), CANDIDATES, 2))).astype(np.float32)
  heads = tails + recipe.paddle_length * _unit(rng.uniform(-np.pi, np.pi, tails.shape[:2]))
  free = board.free(rows, board.points(tails, heads), np.zeros(len(rows)))
  ok = free.any(-1)
  pick = free.argmax(-1)[ok]
  board.place(rows[ok], slot, tails[ok, pick], heads[ok, pick], marked=False)
  return ok


def _draw_distractors(board: _Board, rng: np.random.Generator) -> None:
  """Distractor paths in the slots after the targets, each tried off the grid and marked on
  it once whole; one that finds no room in DISTRACTOR_TRIES starts is left out."""
  recipe, length = board.recipe, board.recipe.distractor_length
  for first in range(2 * recipe.contour_length, board.drawn.shape[1], length):
    rows = np.arange(len(board.grid))
    for _ in range(DISTRACTOR_TRIES):
      alive = rows[_seed_path(board, rows, first, rng)]
      for slot in range(first + 1, first + length):
        alive = alive[_extend(board, alive, slot, rng, trying=first)]
      for slot in range(first, first + length):
        board.mark(alive, board.tails[alive, slot], board.heads[alive, slot],
                   recipe.paddle_length, 0.0, slot + 1)
      rows = rows[np.isin(rows, alive, invert=True)]
      board.drawn[rows, first:first + length] = False
      if not len(rows):
        break


def _render(recipe: Recipe, tails: np.ndarray, heads: np.ndarray, drawn: np.ndarray,
            markers: np.ndarray, zoom: int) -> np.ndarray:
  """uint8 [B, R zoom, R zoom]: the paddles (tails -> heads [B, P, 2] where drawn [B, P]) and
  markers [B, 2, 2], as the original draws them: each drawn antialias_scale times finer,
  averaged down on its own and scaled to a peak of 1 (times paddle_contrast for paddles),
  combined by their maximum, and each image scaled so its brightest pixel is 255."""
  fine = recipe.antialias_scale
  scale = fine * zoom                                         # fine pixels per pixel
  width = math.ceil(max(recipe.paddle_length + recipe.paddle_thickness,
                        2 * recipe.marker_radius) * zoom) + 3      # a stroke's window, pixels
  side = recipe.resolution * zoom
  canvas = np.zeros((len(markers), side + 2 * width, side + 2 * width), np.float32)

  def paint(rows, low, coverage_of, peak):
    corner = np.floor(low / fine).astype(np.int64) - 1                 # output pixels
    y = (corner[:, 0, None, None] * fine + np.arange(width * fine)[None, :, None])
    x = (corner[:, 1, None, None] * fine + np.arange(width * fine)[None, None, :])
    centres = np.stack(np.broadcast_arrays(y, x), -1) + np.float32(0.5)   # of fine pixels
    stroke = coverage_of(centres).reshape(len(rows), width, fine, width, fine).mean((2, 4))
    stroke *= peak / np.maximum(stroke.max((1, 2), keepdims=True), 1e-9)
    y, x = corner[:, 0, None, None] + np.arange(width)[:, None], corner[:, 1, None, None] + \
        np.arange(width)
    index = rows[:, None, None], y + width, x + width
    canvas[index] = np.maximum(canvas[index], stroke)

  half = recipe.paddle_thickness * scale / 2
  for slot in range(drawn.shape[1]):
    rows = np.flatnonzero(drawn[:, slot])
    start, end = tails[rows, slot] * scale, heads[rows, slot] * scale
    length = np.linalg.norm(end - start, axis=-1)[:, None, None]
    along_unit = ((end - start) / length[:, :, 0])[:, None, None]

    def paddle(centres, start=start, length=length, along_unit=along_unit):
      offset = centres - start[:, None, None]
      along = (offset * along_unit).sum(-1)
      across = np.abs(offset[..., 0] * along_unit[..., 1] - offset[..., 1] * along_unit[..., 0])
      return (np.clip(half + 0.5 - across, 0, 1)
              * np.clip(np.minimum(along, length - along) + 0.5, 0, 1))
    paint(rows, np.minimum(start, end) - half, paddle, recipe.paddle_contrast)
  radius = recipe.marker_radius * scale
  for centre in np.moveaxis(markers * scale, 1, 0):
    def disc(centres, centre=centre):
      return np.clip(radius + 0.5 - np.linalg.norm(centres - centre[:, None, None], axis=-1), 0, 1)
    paint(np.arange(len(markers)), centre - radius, disc, 1.0)
  image = canvas[:, width:width + side, width:width + side]
  return np.rint(image * (255 / image.max((1, 2), keepdims=True))).astype(np.uint8)


def _draw_block(rng: np.random.Generator, start: int, count: int, recipe: Recipe, keep: slice,
                zoom: int) -> tuple[np.ndarray, ...]:
  """(images, labels, markers, margins) of images start + keep.start .. start + keep.stop - 1,
  out of the block of `count` images from `start` that `rng` draws."""
  labels = (np.arange(start, start + count) % 2).astype(np.int32)
  margins = rng.choice(np.asarray(recipe.paddle_margins, np.int32), count)
  board, markers = _draw_targets(recipe, labels, margins, rng)
  _draw_distractors(board, rng)
  images = _render(recipe, board.tails[keep], board.heads[keep], board.drawn[keep],
                   markers[keep], zoom)
  return images, labels[keep], markers[keep], margins[keep]
