"""launch.py's config handling in process: the one load of a config file, --config parsing."""

import sys

import pytest
import tiny

from research.errors import ConfigError

sys.path.insert(0, tiny.ROOT)
import launch  # noqa: E402


@pytest.mark.parametrize("source, message", [
    ("def get_config(:\n", r"bad\.py does not parse: .* at line 1"),
    ("import no_such_module\n", r"bad\.py fails to load: ModuleNotFoundError: No module named"),
    ("CONFIG = 1\n", r"bad\.py defines no get_config\(\)"),
    ("def get_config():\n  return 1 / 0\n",
     r"bad\.py: get_config\(\) failed: ZeroDivisionError: division by zero"),
])
def test_a_broken_config_file_is_a_config_error_naming_it(tmp_path, source, message):
  (tmp_path / "bad.py").write_text(source)
  with pytest.raises(ConfigError, match=message):
    launch.load_config(str(tmp_path / "bad.py"))


def test_a_missing_config_file_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"--config: no config file '.*missing\.py'"):
    launch.load_config(str(tmp_path / "missing.py"))


def test_variant_arguments_reach_get_config_and_its_errors_pass_through():
  config, module = launch.load_config(tiny.CONFIG.replace("model=lstm", "model=gru"))
  assert config.model.kind == "gru" and hasattr(module, "get_sweep")
  with pytest.raises(ConfigError, match="variant model='hyena' is not allowed"):
    launch.load_config(tiny.CONFIG.replace("model=lstm", "model=hyena"))


@pytest.mark.parametrize("argv, spec, rest", [
    (["launch.py", "--config=a.py:x=1", "--config.seed=3"], "a.py:x=1",
     ["launch.py", "--config.seed=3"]),
    (["launch.py", "--config", "a.py", "--config.seed", "3"], "a.py",
     ["launch.py", "--config.seed", "3"]),
    (["launch.py", "--config.seed=3", "--sweep"], launch.DEFAULT_CONFIG,
     ["launch.py", "--config.seed=3", "--sweep"]),
])
def test_the_config_flag_is_taken_out_and_overrides_stay(argv, spec, rest):
  assert launch.split_config_flag(argv) == (spec, rest)


def test_overrides_are_checked_against_the_loaded_config():
  config, _ = launch.load_config(tiny.CONFIG)
  launch.check_overrides(config, ["launch.py", "--config.model.hidden_size=8"])
  with pytest.raises(ConfigError, match="config.model.hidden_size='eight' must be of type int"):
    launch.check_overrides(config, ["launch.py", "--config.model.hidden_size", "eight"])
