"""launch.py's --compilation_cache: where JAX's persistent cache goes, or off, and a directory
that cannot hold it refused in one line. (A resumed run loading its steps from the cache:
tests/training/test_faults.py; launch.py's refusals: test_refusals_leave_no_trace.py.)"""

import os

import jax
import pytest
import tiny

from research.errors import ConfigError
from research.training import compile as compilation


@pytest.fixture
def jax_cache_settings():
  """JAX's cache settings, put back after the test."""
  keys = ("jax_compilation_cache_dir", "jax_enable_compilation_cache")
  saved = {key: getattr(jax.config, key) for key in keys}
  yield
  for key, value in saved.items():
    jax.config.update(key, value)


def test_a_directory_moves_the_cache_and_an_empty_one_switches_it_off(tmp_path,
                                                                      jax_cache_settings):
  compilation.enable_cache(str(tmp_path))
  assert jax.config.jax_compilation_cache_dir == str(tmp_path)
  assert jax.config.jax_enable_compilation_cache
  compilation.enable_cache("")
  assert not jax.config.jax_enable_compilation_cache


def test_the_default_leaves_jax_own_variable_in_charge(tmp_path, monkeypatch, jax_cache_settings):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "from-the-variable"))
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "from-the-variable"))
  compilation.enable_cache(compilation.CACHE_DIRECTORY, given=False)
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "from-the-variable")
  compilation.enable_cache(str(tmp_path / "from-the-flag"), given=True)
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "from-the-flag")


def _settings() -> tuple:
  return jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize("case", ["a file", "under a file", "unwritable"])
def test_a_cache_directory_given_that_cannot_hold_the_cache_is_refused_naming_flag_and_path(
    tmp_path, case, jax_cache_settings):
  (tmp_path / "file").write_text("not a directory")
  (tmp_path / "locked").mkdir()
  path, reason = {"a file": (tmp_path / "file", "not a directory"),
                  "under a file": (tmp_path / "file" / "cache", r"cannot be written \(Not a "
                                   r"directory\)"),
                  "unwritable": (tmp_path / "locked", r"cannot be written \(.+\)")}[case]
  before, settings = tiny.files_under(str(tmp_path)), _settings()
  with tiny.unwritable(str(tmp_path / "locked")):
    with pytest.raises(ConfigError, match=rf"^--compilation_cache={path}: {reason}; give a "
                       "directory you can write to, or --compilation_cache= to run without "
                       "the cache$"):
      compilation.enable_cache(str(path))
  assert _settings() == settings                                  # JAX's settings untouched
  assert tiny.files_under(str(tmp_path)) == before               # no probe left


def test_a_missing_cache_directory_is_made(tmp_path, jax_cache_settings):
  compilation.enable_cache(str(tmp_path / "new" / "cache"))
  assert os.listdir(tmp_path / "new" / "cache") == []
  assert _settings() == (str(tmp_path / "new" / "cache"), True)


def test_jax_own_variable_naming_a_file_is_refused_naming_it(tmp_path, monkeypatch,
                                                             jax_cache_settings):
  (tmp_path / "file").write_text("x")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "file"))
  with pytest.raises(ConfigError, match=rf"^JAX_COMPILATION_CACHE_DIR={tmp_path}/file: not a "
                     "directory;"):
    compilation.enable_cache(compilation.CACHE_DIRECTORY, given=False)
  compilation.enable_cache("", given=True)                       # the flag switches it off
  assert not jax.config.jax_enable_compilation_cache


def test_a_default_that_cannot_hold_the_cache_switches_it_off(tmp_path, monkeypatch,
                                                             jax_cache_settings):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  (tmp_path / "file").write_text("x")
  compilation.enable_cache(str(tmp_path / "file"), given=False)
  assert not jax.config.jax_enable_compilation_cache
