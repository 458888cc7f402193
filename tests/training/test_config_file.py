"""launch.py's config handling in process: the one load of a config file, --config parsing."""

import os
import sys

import pytest
import tiny
from ml_collections.config_flags import tuple_parser

from research.errors import ConfigError
from research.training import command
from research.training.config import load_config

sys.path.insert(0, tiny.ROOT)
import launch  # noqa: E402, F401 - defines launch.py's flags, which command.parse reads


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
    load_config(str(tmp_path / "bad.py"))


def test_a_missing_config_file_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"--config: no config file '.*missing\.py'"):
    load_config(str(tmp_path / "missing.py"))


def test_variant_arguments_reach_get_config_and_its_errors_pass_through():
  config, module = load_config(tiny.CONFIG.replace("model=lstm", "model=gru"))
  assert config.model.kind == "gru" and hasattr(module, "get_sweep")
  with pytest.raises(ConfigError, match="variant model='hyena' is not allowed"):
    load_config(tiny.CONFIG.replace("model=lstm", "model=hyena"))


@pytest.mark.parametrize("argv, experiment, kind", [
    ([f"--config={tiny.CONFIG.replace('lstm', 'gru')}", "--config.seed=3"], "sequence_tasks",
     "gru"),
    (["--config", tiny.CONFIG, "--config.seed", "3"], "sequence_tasks", "lstm"),
    (["--config.seed=3", "--sweep"], "nmt_dates", "lstm"),      # the default experiment
])
def test_the_config_file_is_loaded_and_its_overrides_applied(argv, experiment, kind):
  parsed = command.parse(["launch.py", *argv])
  assert (parsed.config.experiment, parsed.config.model.kind, parsed.config.seed) == (
      experiment, kind, 3)


def test_overrides_are_checked_against_the_loaded_config():
  config, _ = load_config(tiny.CONFIG)
  overridden, _ = command.read_overrides(config, ["launch.py", "--config.model.hidden_size=8"])
  assert overridden.model.hidden_size == 8 and config.model.hidden_size != 8
  with pytest.raises(ConfigError, match="config.model.hidden_size='eight' must be of type int"):
    command.read_overrides(config, ["launch.py", "--config.model.hidden_size", "eight"])


@pytest.mark.parametrize("text", ["(64,)", "64", "('mamba2',)", "mamba2", "((64, 16, 64, 1500),)",
                                  "[1, 2]", "a,b"])
def test_a_tuple_key_is_read_as_ml_collections_config_flags_reads_it(text):
  """mqar's config.sweep.* narrow its sweep from the command line (refused as a bool's
  --noconfig before); the value is config_flags' TupleParser's."""
  config, _ = load_config(os.path.join(tiny.ROOT, "experiments", "mqar.py") + ":preset=cpu")
  overridden, _ = command.read_overrides(config, ["launch.py", f"--config.sweep.models={text}"])
  assert overridden.sweep.models == tuple_parser.TupleParser().parse(text)
