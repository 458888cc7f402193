"""Pathfinder as the Long Range Arena uses it (Tay et al., ICLR 2021; the task of Linsley et al.,
NeurIPS 2018): generated here with LRA's parameters, or read from LRA's release, in LRA's file
layout either way. An image shows two markers and several dashed paths; label 1 when the
markers sit at the two ends of one path, 0 when they sit on two different paths
(research.data.pathfinder_drawing draws them). LRA's results are pathfinder32 hard (1024
pixels); Path-X is pathfinder128 hard (16 384 pixels).
"""

import contextlib
import io
import math
import os
import shutil
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from research.data.pathfinder_drawing import Recipe, draw_samples
from research.errors import ConfigError, InputError, excerpt
from research.files import UnreadableFile, locked, read_json, write_json, write_text

# name -> (LRA's folder, contour length)
DIFFICULTIES = {"easy": ("curv_baseline", 6), "intermediate": ("curv_contour_length_9", 9),
                "hard": ("curv_contour_length_14", 14)}
# resolution -> (paddle_length, paddle_thickness, paddle_margins, continuity, marker_radius,
#                seed_distance, padding, paddle_contrast, distractor paddles): generate's table
LRA_PARAMETERS = {32: (2, 0.5, (1,), 1.0, 1.5, 7, 1, 1.5, 20),
                  64: (5, 1.0, (1,), 1.8, 2.5, 12, 1, 0.8, 22),
                  128: (5, 1.5, (2, 3), 1.8, 3.0, 20, 1, 0.9, 35),
                  256: (5, 2.0, (3,), 1.8, 5.0, 27, 22, 1.0, 30)}
RESOLUTIONS = tuple(LRA_PARAMETERS)
SPLITS = (("train", 0.8), ("val", 0.9), ("test", 1.0))   # each split ends at this fraction
FOLDER_SIZE = 1000            # images per imgs/<k> folder and metadata/<k>.npy
RECORD = "generated.json"     # ensure_generated's record in the difficulty's folder
VERSION = 1                   # of the generator's images: a change to them bumps it
NUM_CLASSES = 2               # 1: the markers are on one path
VOCAB_SIZE = 256              # grey levels 0–255
TOKENS = "the image's grey levels 0–255, row by row from the top left"
SOURCE = ("the folder holding LRA's pathfinder32/, pathfinder64/, pathfinder128/ … "
          "(lra_release/ of LRA's lra_release.gz), or '' to generate the images")
METADATA_LINE = "'imgs/<k> sample_<i>.png <i> <label 0|1> …' (LRA's Pathfinder metadata)"


def difficulty_name(difficulty: str | int) -> str:
  """"easy" | "intermediate" | "hard", from a name, LRA's folder name or a contour length."""
  for name, (folder, length) in DIFFICULTIES.items():
    if difficulty in (name, folder, length):
      return name
  allowed = ", ".join(f"{name} ({folder}, contour length {length})"
                      for name, (folder, length) in DIFFICULTIES.items())
  raise ConfigError(f"Pathfinder difficulty {difficulty!r}: expected one of {allowed}")


def lra_recipe(resolution: int = 32, difficulty: str | int = "hard") -> Recipe:
  """LRA's parameters for pathfinder<resolution> at a difficulty (`generate`'s table)."""
  if resolution not in LRA_PARAMETERS:
    raise ConfigError(f"Pathfinder resolution {resolution!r}: expected one of "
                      f"{', '.join(map(str, RESOLUTIONS))}")
  length = DIFFICULTIES[difficulty_name(difficulty)][1]
  (paddle_length, thickness, margins, continuity, marker_radius, seed_distance, padding,
   contrast, distractor_paddles) = LRA_PARAMETERS[resolution]
  return Recipe(resolution, length, length // 3, distractor_paddles // (length // 3),
                paddle_length, thickness, margins, continuity, marker_radius, seed_distance,
                padding, contrast)


def generate(seed: int, count: int, resolution: int = 32, difficulty: str | int = "hard"
             ) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [count, R, R], labels int32 [count]) drawn with LRA's parameters; labels
  alternate 0, 1, 0, ... (half each for an even count). The same seed gives the same images,
  and the first n of a larger count are those of count n.

  LRA's parameters (the arguments lra_benchmarks/data/pathfinder.py's docstrings list; the
  others are the defaults of Linsley's snakes2_wrapper.py), lengths in pixels:

    resolution     paddle  thick-  margin  contin-  marker  seed      padding  paddle    distractor
                   length  ness            uity     radius  distance           contrast  paddles
    32             2       0.5     1       1.0      1.5     7         1        2 x 0.75  20
    64             5       1       1       1.8      2.5     12        1        0.8       22
    128 (Path-X)   5       1.5     2 or 3  1.8      3       20        1        0.9       35
    256            5       2       3       1.8      5       27        22       1.0       30

  antialias_scale 2 throughout; the paddle contrast is snake_contrast x paddle_contrast,
  relative to the markers. The difficulties (LRA's folders; snakes2_wrapper.py's loop):

    easy           curv_baseline            6 paddles per path, distractors of 2
    intermediate   curv_contour_length_9    9 paddles per path, distractors of 3
    hard           curv_contour_length_14   14 paddles per path, distractors of 4

  (distractor length = contour length // 3, number of distractors = distractor paddles //
  distractor length: 10, 6 and 5 at 32 x 32). Ours beyond them: 1 px of clearance between
  paths (research.data.pathfinder_drawing).
  """
  samples = draw_samples(seed, count, lra_recipe(resolution, difficulty))
  return samples.images, samples.labels


def release_folder(root: str | os.PathLike, resolution: int, difficulty: str | int) -> str:
  """<root>/pathfinder<resolution>/<LRA's folder of the difficulty>."""
  return os.path.join(root, f"pathfinder{resolution}", DIFFICULTIES[difficulty_name(difficulty)][0])


def write_release(root: str | os.PathLike, resolution: int, difficulty: str | int,
                  images: np.ndarray, labels: np.ndarray, margins: np.ndarray | None = None,
                  start: int = 0) -> None:
  """Writes images uint8 [N, R, R] and labels [N] as images start .. start + N - 1 of LRA's
  layout under release_folder(root, ...): imgs/<k>/sample_<i>.png and metadata/<k>.npy (text,
  LRA's fields, each folder's metadata written whole after its images), FOLDER_SIZE images
  per folder k (LRA's release: 200); `start` must begin a folder. `margins` [N] fills the
  paddle-margin field (default: the recipe's margin, where it has one)."""
  _write_folder(release_folder(root, resolution, difficulty), resolution, difficulty, images,
                labels, margins, start)


def _write_folder(folder: str, resolution: int, difficulty: str | int, images: np.ndarray,
                  labels: np.ndarray, margins: np.ndarray | None, start: int) -> None:
  """write_release into `folder` (a difficulty's folder, or ensure_generated's temporary one)."""
  recipe = lra_recipe(resolution, difficulty)
  images, labels = np.asarray(images), np.asarray(labels)
  if images.dtype != np.uint8 or images.shape[1:] != (resolution, resolution):
    raise ValueError(f"images: expected uint8 [N, {resolution}, {resolution}], got "
                     f"{images.dtype} {list(images.shape)}")
  if labels.shape != images.shape[:1] or not np.isin(labels, (0, 1)).all():
    raise ValueError(f"labels: expected {len(images)} labels 0 or 1")
  if start % FOLDER_SIZE:
    raise ValueError(f"start {start}: expected a multiple of {FOLDER_SIZE}")
  if margins is None:
    if len(recipe.paddle_margins) > 1:
      raise ValueError(f"margins: pathfinder{resolution} draws them per image; pass them")
    margins = np.full(len(images), recipe.paddle_margins[0])
  fields = (f"{recipe.continuity} {recipe.contour_length} {recipe.distractor_length} "
            f"{recipe.paddle_length} {recipe.paddle_thickness}")
  os.makedirs(os.path.join(folder, "metadata"), exist_ok=True)
  for first in range(0, len(images), FOLDER_SIZE):
    k = (start + first) // FOLDER_SIZE
    os.makedirs(os.path.join(folder, "imgs", str(k)), exist_ok=True)
    lines = []
    for i in range(min(FOLDER_SIZE, len(images) - first)):
      Image.fromarray(images[first + i]).save(
          os.path.join(folder, "imgs", str(k), f"sample_{i}.png"), compress_level=1)
      lines.append(f"imgs/{k} sample_{i}.png {i} {labels[first + i]} {fields} "
                   f"{margins[first + i]} 1\n")
    write_text(os.path.join(folder, "metadata", f"{k}.npy"), "".join(lines))


def read_release(root: str | os.PathLike, resolution: int, difficulty: str | int
                 ) -> dict[str, dict[str, np.ndarray]]:
  """LRA's released (or our written) pathfinder<resolution> folder of a difficulty:
  {"train" | "val" | "test": {"tokens": uint8 [N, R * R] (grey levels, row by row),
  "labels": int32 [N]}}.

  root is the folder holding pathfinder32/ etc. (lra_release/ once unpacked). LRA's release
  (lra_release/pathfinder32/curv_baseline/...) holds `imgs/<k>/sample_<i>.png` (8-bit grey)
  and `metadata/<k>.npy`, which despite the name hold text, one line per image:

    imgs/0 sample_0.png 0 1 1.0 6 2 2 0.5 1 1

  (folder, file, index in the folder, label, continuity, contour_length, distractor_length,
  paddle_length, paddle_thickness, paddle_margin, number of paddle contrasts; Linsley's
  snakes2.py wrote them as numpy arrays of these strings, which are read too). LRA's reader
  (lra_benchmarks/data/pathfinder.py) takes fields 0 and 1 (the image) and 3 (the label), and
  its input pipeline (lra_benchmarks/image/input_pipeline.py) feeds the grey levels 0..255 as
  integer tokens, row by row. Images are taken in the order of metadata/<k>.npy by k, then
  line by line; empty image files are dropped (as LRA does; the release holds one,
  pathfinder32/curv_baseline/imgs/0/sample_172.png); then the first 80% are train, the next
  10% val, the last 10% test (LRA's proportions; LRA's TFDS builder stores the examples in an
  order of its own, by a hash of their keys, before it splits them, so its three splits hold
  other images).

  Raises InputError naming the folder, the metadata file and line, or the image, and what was
  expected: a missing folder, no metadata, a malformed line, a missing or unreadable image,
  or one of another size (the size its header declares, refused before it is decoded; a file
  larger than max_image_bytes(R), unread).
  """
  folder = release_folder(root, resolution, difficulty)
  examples = [(path, label) for metadata in _metadata_files(folder)
              for path, label in _metadata_entries(folder, metadata)]
  if not examples:
    raise InputError(f"{os.path.join(folder, 'metadata')}: its files list no images; expected "
                     f"lines {METADATA_LINE}")
  tokens, labels = [], []
  for (path, where), label in examples:
    image = _read_image(path, where, resolution)
    if image is not None:
      tokens.append(image.reshape(-1))
      labels.append(label)
  tokens = np.stack(tokens) if tokens else np.zeros((0, resolution * resolution), np.uint8)
  labels = np.asarray(labels, np.int32)
  splits, low = {}, 0
  for name, fraction in SPLITS:
    high = math.floor(len(labels) * fraction + 1e-9)
    splits[name] = {"tokens": tokens[low:high], "labels": labels[low:high]}
    low = high
  return splits


def _metadata_files(folder: str) -> list[str]:
  """metadata/<k>.npy of a difficulty's folder, by k."""
  directory = os.path.join(folder, "metadata")
  layout = ("expected LRA's Pathfinder layout <root>/pathfinder<R>/<difficulty>/"
            "{metadata/<k>.npy, imgs/<k>/sample_<i>.png}, root being the folder that holds "
            "pathfinder32/ (lra_release/ once unpacked)")
  if not os.path.isdir(directory):
    raise InputError(f"{directory}: no such folder; {layout}")
  names = sorted(name for name in os.listdir(directory) if name.endswith(".npy"))
  for name in names:
    if not name[:-len(".npy")].isdigit():
      raise InputError(f"{os.path.join(directory, name)}: expected metadata/<k>.npy with a "
                       "whole number k")
  if not names:
    raise InputError(f"{directory}: no metadata/<k>.npy files; {layout}")
  return [os.path.join(directory, name) for name in sorted(names, key=lambda n: int(n[:-4]))]


def _metadata_entries(folder: str, metadata: str) -> list[tuple[tuple[str, str], int]]:
  """((image path, "metadata:line"), label) of each line of a metadata file (text, or a numpy
  array of the fields as snakes2.py saved it)."""
  try:
    with open(metadata, "rb") as f:
      data = f.read()
  except OSError as error:
    raise InputError(f"{metadata}: cannot be read ({error.strerror or error})") from None
  if data.startswith(b"\x93NUMPY"):
    try:
      rows = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:
      raise InputError(f"{metadata}: not a readable numpy array of strings ({error})") from None
    lines = [" ".join(map(str, row)) for row in np.atleast_2d(rows)]
  else:
    try:
      lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
      raise InputError(f"{metadata}: neither text nor a numpy array ({error.reason} at byte "
                       f"{error.start}); expected lines {METADATA_LINE}") from None
  entries = []
  for number, line in enumerate(lines, start=1):
    fields = line.split()
    if not fields:
      continue
    where = f"{metadata}:{number}"
    parts = fields[0].replace("\\", "/").split("/")
    if (len(fields) < 4 or not fields[1].endswith(".png") or fields[3] not in ("0", "1")
        or os.path.isabs(fields[0]) or ".." in parts or "/" in fields[1]):
      raise InputError(f"{where}: expected {METADATA_LINE}, got {excerpt(line)}")
    entries.append(((os.path.join(folder, *parts, fields[1]), where), int(fields[3])))
  return entries


def _read_image(path: str, where: str, resolution: int) -> np.ndarray | None:
  """uint8 [R, R] grey levels of the image at `path` (listed at `where`); None for an empty
  file (LRA drops them).

  Nothing larger than an R x R image is read or decoded: a file of more than
  max_image_bytes(R) bytes is refused unread, and an image whose header declares another size
  is refused before its pixels are decoded (PIL opens lazily), as are PIL's decompression
  bombs. Each refusal, and a MemoryError while decoding, is one InputError naming the file.
  """
  limit = max_image_bytes(resolution)
  try:
    with open(path, "rb") as f:
      data = f.read(limit + 1)
  except FileNotFoundError:
    raise InputError(f"{path}: no such image (listed at {where})") from None
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error}; listed at {where})"
                     ) from None
  expected = f"a {resolution}x{resolution} grey image"
  if len(data) > limit:
    raise InputError(f"{path}: more than {limit} bytes, more than {expected} takes (listed at "
                     f"{where})")
  if not data:
    return None
  with _image_errors(path, where, expected):
    image = Image.open(io.BytesIO(data))        # the header alone: nothing decoded yet
  with image:
    if image.size != (resolution, resolution):
      raise InputError(f"{path}: expected {expected}, got {image.size[0]}x{image.size[1]} "
                       f"(listed at {where})")
    with _image_errors(path, where, expected):
      return np.asarray(image if image.mode == "L" else image.convert("L"))


def max_image_bytes(resolution: int) -> int:
  """The largest image file read at a resolution: an R x R RGBA image stored uncompressed, and
  1 MiB for PNG chunks beside it (LRA's 8-bit grey PNGs take a few KiB)."""
  return 4 * resolution * resolution + (1 << 20)


@contextlib.contextmanager
def _image_errors(path: str, where: str, expected: str):
  """PIL's errors for an unreadable image, its decompression bombs (the warning too) and a
  MemoryError -> one InputError naming the file."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error", Image.DecompressionBombWarning)
      yield
  except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
    raise InputError(f"{path}: declares an image too large to decode ({error}; listed at "
                     f"{where}); expected {expected}") from None
  except (UnidentifiedImageError, OSError, ValueError, SyntaxError, MemoryError) as error:
    raise InputError(f"{path}: not a readable image ({type(error).__name__}: {error}; listed "
                     f"at {where}); expected {expected}") from None


def _record(resolution: int, difficulty: str | int, count: int, seed: int) -> dict:
  """What ensure_generated's record says of the images it writes (less "complete")."""
  return {"generator": VERSION, "resolution": resolution,
          "difficulty": difficulty_name(difficulty), "count": count, "seed": seed}


def is_generated(root: str | os.PathLike, resolution: int, difficulty: str | int, count: int,
                 seed: int) -> bool:
  """Whether release_folder(root, ...) holds ensure_generated's images of these arguments,
  complete (so ensure_generated would write nothing)."""
  try:
    record = read_json(os.path.join(release_folder(root, resolution, difficulty), RECORD))
  except (FileNotFoundError, UnreadableFile):
    return False
  return record == {**_record(resolution, difficulty, count, seed), "complete": True}


def generation_lock(root: str | os.PathLike, resolution: int, difficulty: str | int) -> str:
  """The lock file beside release_folder(root, ...), <difficulty folder>.lock, that
  ensure_generated and read_generated hold."""
  return release_folder(root, resolution, difficulty) + ".lock"


def _locked(root: str | os.PathLike, resolution: int, difficulty: str | int,
            shared: bool = False):
  """The generation lock of release_folder(root, ...), held (research.files.locked)."""
  folder = release_folder(root, resolution, difficulty)
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  what = "another process generating" if shared else "another process reading or generating"
  return locked(generation_lock(root, resolution, difficulty), f"{what} {folder}", shared)


def ensure_generated(root: str | os.PathLike, resolution: int, difficulty: str | int,
                     count: int, seed: int) -> None:
  """Writes `count` generated images (`generate`'s, seed `seed`) in LRA's layout under
  release_folder(root, ...), unless that folder already holds them.

  Under the folder's generation lock (exclusive; another process generating or reading it
  makes this one wait, saying so on stderr): the images are written into a temporary sibling
  folder, .<name>.partial, with the record generated.json last, and the whole renamed into
  place; so the folder holds a complete set or none, and a generation killed midway leaves
  only the temporary folder, which the next holder of the lock removes. A folder of ours of
  another count, seed or generator version (or an older version's interrupted write, recorded
  incomplete) is replaced the same way. A folder that is not empty and has no record is not
  ours (LRA's download, say): InputError, nothing touched. Images are drawn and written
  FOLDER_SIZE at a time (memory stays small for Path-X).
  """
  _ours(release_folder(root, resolution, difficulty))    # refused before the lock file is made
  with _locked(root, resolution, difficulty):
    _generate(root, resolution, difficulty, count, seed)


def read_generated(root: str | os.PathLike, resolution: int, difficulty: str | int,
                   count: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
  """ensure_generated, then read_release, with the generation lock held throughout: shared
  while a complete set is only read (readers do not wait for each other), exclusive while it
  is generated; no other process replaces the set while it is read.

  The set read must hold exactly the `count` images its record names; InputError (naming the
  folder) otherwise: an image emptied since is not dropped as read_release drops LRA's.
  """
  _ours(release_folder(root, resolution, difficulty))    # refused before the lock file is made
  with _locked(root, resolution, difficulty, shared=True):
    if is_generated(root, resolution, difficulty, count, seed):
      return _read_whole(root, resolution, difficulty, count)
  with _locked(root, resolution, difficulty):
    _generate(root, resolution, difficulty, count, seed)
    return _read_whole(root, resolution, difficulty, count)


def _read_whole(root: str | os.PathLike, resolution: int, difficulty: str | int, count: int
                ) -> dict[str, dict[str, np.ndarray]]:
  """read_release of a generated set, which must hold `count` images; InputError saying how to
  generate it again otherwise."""
  folder = release_folder(root, resolution, difficulty)
  again = f"generated images, changed since: delete {folder} to generate them again"
  try:
    splits = read_release(root, resolution, difficulty)
  except InputError as error:
    raise InputError(f"{error} ({again})") from None
  found = sum(len(split["labels"]) for split in splits.values())
  if found != count:
    raise InputError(f"{folder}: {found} readable images, its {RECORD} records {count} ({again})")
  return splits


def _generate(root: str | os.PathLike, resolution: int, difficulty: str | int, count: int,
              seed: int) -> None:
  """ensure_generated's work; the caller holds the generation lock, exclusive."""
  folder = release_folder(root, resolution, difficulty)
  parent, name = os.path.split(folder)
  partial, old = (os.path.join(parent, f".{name}.{part}") for part in ("partial", "old"))
  for leftover in (partial, old):     # a killed generation's: under the lock, none is alive
    shutil.rmtree(leftover, ignore_errors=True)
  wanted = _record(resolution, difficulty, count, seed)
  if _ours(folder) == {**wanted, "complete": True}:
    return
  recipe = lra_recipe(resolution, difficulty)
  os.makedirs(partial)
  for start in range(0, count, FOLDER_SIZE):
    samples = draw_samples(seed, min(FOLDER_SIZE, count - start), recipe, start=start)
    _write_folder(partial, resolution, difficulty, samples.images, samples.labels,
                  samples.margins, start)
  write_json(os.path.join(partial, RECORD), {**wanted, "complete": True})
  if os.path.lexists(folder):
    os.rename(folder, old)
  os.rename(partial, folder)
  shutil.rmtree(old, ignore_errors=True)


def _ours(folder: str) -> dict | None:
  """The record of a difficulty's folder written by ensure_generated ({} when cut short),
  None when there is no folder or an empty one. InputError for a folder with something in it
  and no record, which this generator did not write."""
  try:
    return read_json(os.path.join(folder, RECORD))
  except FileNotFoundError:
    pass
  except UnreadableFile:
    return {}                           # ours, cut short: written again
  if os.path.lexists(folder) and not (os.path.isdir(folder) and not os.listdir(folder)):
    raise InputError(f"{folder}: holds files this generator did not write (no {RECORD}; a "
                     "Pathfinder release, say); generate into another folder, or remove it")
  return None
