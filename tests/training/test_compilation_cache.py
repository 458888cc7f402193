"""launch.py's --compilation_cache: where JAX's persistent cache goes, or off. (A resumed run
loading its steps from the cache: tests/training/test_faults.py.)"""

import jax
import pytest

from research.training import compilation_cache


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
  compilation_cache.enable(str(tmp_path))
  assert jax.config.jax_compilation_cache_dir == str(tmp_path)
  assert jax.config.jax_enable_compilation_cache
  compilation_cache.enable("")
  assert not jax.config.jax_enable_compilation_cache


def test_the_default_leaves_jax_own_variable_in_charge(tmp_path, monkeypatch, jax_cache_settings):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "from-the-variable"))
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "from-the-variable"))
  compilation_cache.enable(compilation_cache.DEFAULT_DIRECTORY, given=False)
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "from-the-variable")
  compilation_cache.enable(str(tmp_path / "from-the-flag"), given=True)
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "from-the-flag")
