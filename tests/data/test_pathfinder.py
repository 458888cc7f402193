"""Pathfinder: the generated images checked from outside with scipy.ndimage (which dashes the
markers join, how many), and LRA's release format written here by hand from its documented
layout (not by research.data.pathfinder's writer) and read back."""

import io
import json
import os
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile
from scipy import ndimage

from research.data import pathfinder
from research.data.pathfinder_drawing import draw_samples
from research.errors import ConfigError, InputError

ZOOM = 4   # the drawings checked: 32 x 32 images drawn 4 times larger (the same paths)


def marker_components(image: np.ndarray, markers: np.ndarray, reach: float):
  """(labels of the ink once gaps up to `reach` pixels are bridged, the two markers' labels):
  each ink pixel grown by a disc of radius reach / 2, then 8-connected components."""
  radius = reach / 2
  offsets = np.mgrid[-int(radius):int(radius) + 1, -int(radius):int(radius) + 1]
  disc = np.hypot(*offsets) <= radius
  bridged, _ = ndimage.label(ndimage.binary_dilation(image > 0, disc), np.ones((3, 3)))
  ends = [bridged[int(row), int(column)] for row, column in markers]
  return bridged, ends


@pytest.mark.parametrize("difficulty", ["easy", "intermediate", "hard"])
def test_the_markers_are_joined_by_one_path_of_contour_length_dashes_in_positives_only(difficulty):
  recipe = pathfinder.lra_recipe(32, difficulty)
  samples = draw_samples(7, 40, recipe, zoom=ZOOM)
  # The recipe's dashes of one path are at most 2 margin apart; two paths' ink at least
  # 2 margin + clearance: bridge gaps up to the middle, in pixels of the drawing.
  reach = (2 * recipe.paddle_margins[0] + recipe.clearance / 2) * ZOOM
  for image, label, markers in zip(samples.images, samples.labels, samples.markers * ZOOM,
                                   strict=True):
    bridged, ends = marker_components(image, markers, reach)
    assert all(ends), "each marker lies on ink"
    assert (ends[0] == ends[1]) == (label == 1)
    dashes, _ = ndimage.label(image > 0, np.ones((3, 3)))
    for end in set(ends):   # a marker's path: contour_length dashes (the markers on the ends)
      assert len(np.unique(dashes[(bridged == end) & (dashes > 0)])) == recipe.contour_length


def test_images_are_a_function_of_the_seed_with_balanced_alternating_labels():
  images, labels = pathfinder.generate(5, 40, 32, "easy")
  again, labels_again = pathfinder.generate(5, 40, 32, "easy")
  assert images.dtype == np.uint8 and images.shape == (40, 32, 32)
  assert labels.dtype == np.int32 and labels.tolist() == [0, 1] * 20
  np.testing.assert_array_equal(images, again)
  np.testing.assert_array_equal(labels, labels_again)
  assert images.max() == 255
  later = draw_samples(5, 8, pathfinder.lra_recipe(32, "easy"), start=30).images
  np.testing.assert_array_equal(later, images[30:38])     # image i depends on neither count
  assert not np.array_equal(pathfinder.generate(6, 40, 32, "easy")[0], images)


def test_written_release_reads_back_split_80_10_10(tmp_path, monkeypatch):
  monkeypatch.setattr(pathfinder, "FOLDER_SIZE", 2)   # 15 folders: 10 comes after 9
  images, labels = pathfinder.generate(3, 30, 32, "easy")
  pathfinder.write_release(tmp_path, 32, "easy", images, labels)
  folder = tmp_path / "pathfinder32" / "curv_baseline"
  assert (folder / "imgs" / "14" / "sample_1.png").is_file()
  first = (folder / "metadata" / "0.npy").read_text().splitlines()
  assert first == [f"imgs/0 sample_{i}.png {i} {labels[i]} 1.0 6 2 2 0.5 1 1" for i in (0, 1)]
  splits = pathfinder.read_release(tmp_path, 32, "easy")
  assert [len(splits[name]["labels"]) for name in ("train", "val", "test")] == [24, 3, 3]
  tokens = np.concatenate([splits[name]["tokens"] for name in ("train", "val", "test")])
  assert tokens.dtype == np.uint8 and tokens.shape == (30, 1024)
  np.testing.assert_array_equal(tokens, images.reshape(30, 1024))
  np.testing.assert_array_equal(
      np.concatenate([splits[name]["labels"] for name in ("train", "val", "test")]), labels)


def write_lra_folder(root, pixels, labels, empty=(), numpy_metadata=False):
  """LRA's layout by hand: pathfinder32/curv_contour_length_14/imgs/<k>/sample_<i>.png and
  metadata/<k>.npy lines 'imgs/<k> sample_<i>.png <i> <label> 1.0 14 4 2 0.5 1 1', 5 images
  a folder; the images listed in `empty` are empty files. Returns the folder."""
  folder = os.path.join(root, "pathfinder32", "curv_contour_length_14")
  for k in range(0, len(pixels), 5):
    os.makedirs(os.path.join(folder, "imgs", str(k // 5)), exist_ok=True)
    rows = []
    for i in range(min(5, len(pixels) - k)):
      path = os.path.join(folder, "imgs", str(k // 5), f"sample_{i}.png")
      if k + i in empty:
        open(path, "wb").close()
      else:
        Image.fromarray(pixels[k + i], mode="L").save(path)
      rows.append([f"imgs/{k // 5}", f"sample_{i}.png", str(i), str(labels[k + i]), "1.0", "14",
                   "4", "2", "0.5", "1", "1"])
    os.makedirs(os.path.join(folder, "metadata"), exist_ok=True)
    metadata = os.path.join(folder, "metadata", f"{k // 5}.npy")
    if numpy_metadata and k:   # as snakes2.py saved it: np.save of an array of strings
      with open(metadata, "wb") as f:
        np.save(f, np.array(rows))
    else:
      with open(metadata, "w") as f:
        f.write("".join(" ".join(row) + "\n" for row in rows))
  return folder


def test_reads_lra_layout_written_by_hand(tmp_path):
  pixels = np.random.default_rng(0).integers(0, 256, (11, 32, 32), dtype=np.uint8)
  labels = [1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
  write_lra_folder(tmp_path, pixels, labels, empty={3}, numpy_metadata=True)
  splits = pathfinder.read_release(tmp_path, 32, "curv_contour_length_14")
  kept = [i for i in range(11) if i != 3]     # LRA drops the empty image
  assert [len(splits[name]["labels"]) for name in ("train", "val", "test")] == [8, 1, 1]
  tokens = np.concatenate([splits[name]["tokens"] for name in ("train", "val", "test")])
  np.testing.assert_array_equal(tokens, pixels[kept].reshape(10, 1024))
  assert np.concatenate([splits[name]["labels"] for name in ("train", "val", "test")]
                        ).tolist() == [labels[i] for i in kept]


def spoil(folder, fault):
  """Makes one fault in a hand-written folder; returns what the message must name."""
  metadata = os.path.join(folder, "metadata", "0.npy")
  image = os.path.join(folder, "imgs", "0", "sample_2.png")
  if fault == "short line":
    with open(metadata) as f:
      lines = f.read().splitlines()
    lines[1] = "imgs/0 sample_1.png 1"
    with open(metadata, "w") as f:
      f.write("\n".join(lines) + "\n")
    return f"{metadata}:2: expected 'imgs/<k> sample_<i>.png <i> <label 0|1>"
  if fault == "label 2":
    with open(metadata) as f:
      text = f.read()
    with open(metadata, "w") as f:
      f.write(text.replace("sample_0.png 0 1", "sample_0.png 0 2"))
    return f"{metadata}:1: expected"
  if fault == "corrupt image":
    with open(image, "wb") as f:
      f.write(b"\x89PNG\r\n\x1a\nnot really")
    return f"{image}: not a readable image"
  if fault == "missing image":
    os.remove(image)
    return f"{image}: no such image (listed at {metadata}:3)"
  if fault == "wrong size":
    Image.fromarray(np.zeros((16, 32), np.uint8)).save(image)
    return f"{image}: expected a 32x32 grey image, got 32x16"
  raise AssertionError(fault)


@pytest.mark.parametrize("fault", ["short line", "label 2", "corrupt image", "missing image",
                                   "wrong size"])
def test_a_fault_in_the_release_names_the_file(tmp_path, fault):
  pixels = np.zeros((5, 32, 32), np.uint8)
  message = spoil(write_lra_folder(tmp_path, pixels, [1, 0, 1, 0, 1]), fault)
  with pytest.raises(InputError) as error:
    pathfinder.read_release(tmp_path, 32, "hard")
  assert message in str(error.value) and "\n" not in str(error.value)


def test_a_missing_folder_or_bad_choice_says_what_was_expected(tmp_path):
  with pytest.raises(InputError, match="pathfinder64.curv_baseline.metadata: no such folder"):
    pathfinder.read_release(tmp_path, 64, "easy")
  with pytest.raises(ConfigError, match="expected one of 32, 64, 128, 256"):
    pathfinder.generate(0, 2, resolution=48)
  with pytest.raises(ConfigError, match="curv_contour_length_9"):
    pathfinder.generate(0, 2, difficulty="medium")


def png(width: int, height: int, idat: bytes = b"\0", text: bytes = b"") -> bytes:
  """An 8-bit grey PNG whose header declares width x height; its IDAT holds zlib(`idat`)
  (not that many pixels: decoded, it is cut short) and a tEXt chunk `text`, if given."""
  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
  header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)     # 8-bit grey
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
          + (chunk(b"tEXt", b"Comment\0" + text) if text else b"")
          + chunk(b"IDAT", zlib.compress(idat)) + chunk(b"IEND", b""))


def grey_png(width: int, height: int) -> bytes:
  image = io.BytesIO()
  Image.fromarray(np.zeros((height, width), np.uint8)).save(image, format="PNG")
  return image.getvalue()


# image bytes -> what the one-line InputError says after the file's name
OVERSIZED = {
    "20000x20000 declared (PIL's bomb error)": (lambda: png(20_000, 20_000),
                                                 "declares an image too large to decode"),
    "10000x10000 declared (PIL's bomb warning)": (lambda: png(10_000, 10_000),
                                                   "declares an image too large to decode"),
    "5000x5000 declared, not decoded": (lambda: png(5_000, 5_000), "got 5000x5000"),
    "32x33 declared, not decoded": (lambda: png(32, 33), "got 32x33"),
    "a real 64x64 image": (lambda: grey_png(64, 64), "got 64x64"),
    "1x1": (lambda: grey_png(1, 1), "got 1x1"),
    "32x32 declared, pixels cut short": (lambda: png(32, 32), "not a readable image"),
    "32x32 in a file of 2 MB": (lambda: png(32, 32, bytes(32 * 33), text=b"x" * (2 << 20)),
                                "more than 1052672 bytes"),
}


@pytest.mark.parametrize("case", OVERSIZED)
def test_an_image_is_refused_by_its_declared_size_before_it_is_decoded(tmp_path, case):
  """The rule: a file of more than max_image_bytes(R), or an image whose header declares other
  than R x R, is one InputError naming it; nothing larger is decoded, no warning escapes."""
  content, message = OVERSIZED[case]
  folder = write_lra_folder(tmp_path, np.zeros((5, 32, 32), np.uint8), [1, 0, 1, 0, 1])
  image = os.path.join(folder, "imgs", "0", "sample_2.png")
  with open(image, "wb") as f:
    f.write(content())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(InputError) as error:
      pathfinder.read_release(tmp_path, 32, "hard")
  text = str(error.value)
  assert text.startswith(f"{image}: ") and message in text and "\n" not in text
  assert "32x32 grey image" in text and f"listed at {folder}" in text


def test_the_size_expected_is_the_resolution_asked(tmp_path):
  folder = write_lra_folder(tmp_path, np.zeros((5, 32, 32), np.uint8), [1, 0, 1, 0, 1])
  os.rename(os.path.join(tmp_path, "pathfinder32"), os.path.join(tmp_path, "pathfinder64"))
  image = os.path.join(folder.replace("pathfinder32", "pathfinder64"), "imgs", "0", "sample_0.png")
  with pytest.raises(InputError, match=f"^{image}: expected a 64x64 grey image, got 32x32"):
    pathfinder.read_release(tmp_path, 64, "hard")


def test_running_out_of_memory_decoding_is_one_line_naming_the_image(tmp_path, monkeypatch):
  folder = write_lra_folder(tmp_path, np.zeros((5, 32, 32), np.uint8), [1, 0, 1, 0, 1])

  def out_of_memory(self):
    raise MemoryError

  monkeypatch.setattr(ImageFile.ImageFile, "load", out_of_memory)
  with pytest.raises(InputError, match="^" + os.path.join(folder, "imgs", "0", "sample_0.png")
                     + ": not a readable image [(]MemoryError"):
    pathfinder.read_release(tmp_path, 32, "hard")


def test_ensure_generated_writes_once_and_redoes_an_interrupted_write(tmp_path):
  folder = tmp_path / "pathfinder32" / "curv_baseline"
  pathfinder.ensure_generated(tmp_path, 32, "easy", count=20, seed=4)
  images, labels = pathfinder.generate(4, 20, 32, "easy")
  splits = pathfinder.read_release(tmp_path, 32, "easy")
  np.testing.assert_array_equal(splits["train"]["tokens"], images[:16].reshape(16, -1))
  np.testing.assert_array_equal(splits["test"]["labels"], labels[18:])
  written = (folder / "metadata" / "0.npy").stat().st_mtime_ns
  pathfinder.ensure_generated(tmp_path, 32, "easy", count=20, seed=4)
  assert (folder / "metadata" / "0.npy").stat().st_mtime_ns == written     # skipped
  # interrupted: the record still says incomplete and a metadata file is missing
  record = json.loads((folder / "generated.json").read_text())
  (folder / "generated.json").write_text(json.dumps({**record, "complete": False}))
  (folder / "metadata" / "0.npy").unlink()
  pathfinder.ensure_generated(tmp_path, 32, "easy", count=20, seed=4)
  again = pathfinder.read_release(tmp_path, 32, "easy")
  np.testing.assert_array_equal(again["val"]["tokens"], splits["val"]["tokens"])


def test_ensure_generated_leaves_a_folder_it_did_not_write(tmp_path):
  folder = write_lra_folder(tmp_path, np.zeros((5, 32, 32), np.uint8), [1, 0, 1, 0, 1])
  before = sorted(os.listdir(os.path.join(folder, "metadata")))
  with pytest.raises(InputError, match="did not write"):
    pathfinder.ensure_generated(tmp_path, 32, "hard", count=10, seed=0)
  assert sorted(os.listdir(os.path.join(folder, "metadata"))) == before
  assert not os.path.exists(os.path.join(folder, "generated.json"))
