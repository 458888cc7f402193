"""The standard-library corpus: which files, the hash split, streams, manifest and windows.

The split is checked against sha256 computed here; the file list against a walk with
pathlib written here; sizes against os.path.getsize.
"""

import hashlib
import os
import pathlib
import sysconfig

import numpy as np
import pytest

from research.data import python_corpus
from research.errors import InputError

LAYOUT = {
    "os.py": b"import abc\n",
    "abc.py": b"class ABC: pass\n",
    "json/__init__.py": b"from .decoder import *\n",
    "json/decoder.py": b"def decode(s):\n  return s\n",
    "json/README": b"not python\n",
    "email/mime/text.py": b"# mime\n",
    "latin1.py": "# coding: latin-1\nx = 'é'\n".encode("latin-1"),
    "test/test_os.py": b"import unittest\n",
    "unittest/test/test_case.py": b"pass\n",
    "lib2to3/tests/data/py2.py": b"print 'hi'\n",
    "idlelib/idle_test/test_x.py": b"pass\n",
    "idlelib/editor.py": b"# editor\n",
    "site-packages/numpy/core.py": b"# third party\n",
    "dist-packages/six.py": b"# third party\n",
    "__pycache__/os.py": b"# cache\n",
    "config-3.11-x86_64-linux-gnu/python-config.py": b"# generated\n",
    "_sysconfigdata__linux_x86_64-linux-gnu.py": b"build_time_vars = {}\n",
}
KEPT = ["abc.py", "email/mime/text.py", "idlelib/editor.py", "json/__init__.py",
        "json/decoder.py", "latin1.py", "os.py"]
TESTS = ["idlelib/idle_test/test_x.py", "lib2to3/tests/data/py2.py", "test/test_os.py",
         "unittest/test/test_case.py"]


@pytest.fixture
def library(tmp_path) -> str:
  for path, data in LAYOUT.items():
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_bytes(data)
  return str(tmp_path)


def test_the_library_is_the_running_interpreters():
  assert python_corpus.stdlib_directory() == sysconfig.get_paths()["stdlib"]


def test_files_leave_out_third_party_generated_and_optionally_test_packages(library):
  assert python_corpus.list_files(library) == sorted(KEPT + TESTS)
  assert python_corpus.list_files(library, include_tests=False) == KEPT


@pytest.mark.parametrize("path", ["os.py", "json/decoder.py", "test/test_os.py", "é/ü.py"])
def test_the_split_follows_sha256_of_the_path(path):
  u = int(hashlib.sha256(path.encode()).hexdigest()[:16], 16) / 2**64
  assert python_corpus.hash_fraction(path) == u
  assert python_corpus.split_of(path) == ("train" if u < 0.9 else
                                          "validation" if u < 0.95 else "test")


def test_splits_are_disjoint_stable_and_ordered_by_hash(library):
  corpus = python_corpus.load(library)
  again = python_corpus.load(library, include_tests=True)
  assert corpus.files == again.files and corpus.contents == again.contents
  listed = [p for paths in corpus.files.values() for p in paths]
  assert sorted(listed) == sorted(KEPT + TESTS)                    # each file once
  for split, paths in corpus.files.items():
    assert all(python_corpus.split_of(p) == split for p in paths)
    assert paths == sorted(paths, key=python_corpus.hash_fraction)
    for path, data in zip(paths, corpus.contents[split], strict=True):
      assert data == LAYOUT[path]                                  # bytes as they are
  # A file's split does not depend on the others.
  fewer = python_corpus.load(library, include_tests=False)
  for split, paths in fewer.files.items():
    assert set(paths) <= set(corpus.files[split])


def test_streams_put_the_file_start_byte_before_every_file(library):
  corpus = python_corpus.load(library)
  for split, data in corpus.contents.items():
    expected = b"".join(b"\0" + d for d in data)
    assert corpus.stream(split).dtype == np.uint8
    assert corpus.stream(split).tobytes() == expected


def test_texts_cut_the_split_to_its_first_bytes(library):
  corpus = python_corpus.load(library)
  whole = b"".join(corpus.contents["train"])
  assert corpus.texts("train") == corpus.contents["train"]
  for limit in (1, 5, 20, len(whole), len(whole) + 10):
    texts = corpus.texts("train", limit)
    assert b"".join(texts) == whole[:limit]
    assert texts[:-1] == corpus.contents["train"][:len(texts) - 1]   # whole files, then a cut


def test_the_manifest_of_the_real_library_lists_every_file_once():
  """On this interpreter's library: the manifest against a pathlib walk and file sizes."""
  corpus = python_corpus.load()
  manifest = corpus.manifest()
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  excluded = {"site-packages", "dist-packages", "__pycache__"}
  expected = sorted(
      p.relative_to(root).as_posix() for p in root.rglob("*.py")
      if not excluded & set(p.relative_to(root).parts[:-1])
      and not p.relative_to(root).parts[0].startswith("config-")
      and not p.name.startswith("_sysconfigdata_"))
  listed = [p for s in manifest["splits"].values() for p in s["paths"]]
  assert len(listed) == len(set(listed)) and sorted(listed) == expected
  assert "os.py" in listed and "json/decoder.py" in listed
  for split, entry in manifest["splits"].items():
    assert entry["files"] == len(entry["paths"])
    assert entry["bytes"] == sum(os.path.getsize(root / p) for p in entry["paths"])
    assert entry["stream_sha256"] == hashlib.sha256(corpus.stream(split)).hexdigest()
  counts = {split: entry["files"] / len(listed) for split, entry in manifest["splits"].items()}
  assert counts["train"] == pytest.approx(0.9, abs=0.03)           # ~1800 files
  assert counts["validation"] == pytest.approx(0.05, abs=0.02)
  assert counts["test"] == pytest.approx(0.05, abs=0.02)
  assert manifest["python_version"] == ".".join(map(str, os.sys.version_info[:3]))
  assert manifest["stdlib"] == str(root) and manifest["include_tests"] is True
  assert len(manifest["sha256"]) == 64
  assert "corpus: " in python_corpus.describe(manifest)


def test_the_digest_changes_with_a_file(library):
  before = python_corpus.load(library).manifest()["sha256"]
  pathlib.Path(library, "os.py").write_bytes(b"import abc  \n")
  assert python_corpus.load(library).manifest()["sha256"] != before


def test_random_windows_are_seeded_slices_of_the_stream():
  stream = np.arange(1000)
  windows = python_corpus.random_windows(stream, np.random.default_rng([0, 3]), 16, 32)
  assert windows.shape == (16, 33) and windows.dtype == np.int32
  np.testing.assert_array_equal(np.diff(windows, axis=1), 1)       # contiguous slices
  assert windows.min() >= 0 and windows.max() <= 999
  np.testing.assert_array_equal(
      windows, python_corpus.random_windows(stream, np.random.default_rng([0, 3]), 16, 32))
  edge = python_corpus.random_windows(np.arange(33), np.random.default_rng(0), 4, 32)
  np.testing.assert_array_equal(edge, np.tile(np.arange(33), (4, 1)))
  with pytest.raises(ValueError, match="no window of 33"):
    python_corpus.random_windows(np.arange(32), np.random.default_rng(0), 4, 32)


@pytest.mark.parametrize("make, fault", [
    (lambda path: os.symlink(path + ".gone", path), r"a symlink to '.*\.gone', which does not exist"),
    (os.mkfifo, "not a regular file"),                # reading one would wait forever
    (lambda path: os.symlink("/proc/self/mem", path), r"cannot be read \(Input/output error\)"),
])
def test_a_py_file_that_cannot_be_read_is_named(library, make, fault):
  make(os.path.join(library, "json", "broken.py"))
  with pytest.raises(InputError, match=rf"{library}/json/broken\.py: {fault}; the corpus reads "
                                       rf"every \.py file under {library}"):
    python_corpus.load(library)
