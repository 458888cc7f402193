"""A renamed config key (research/training/workdir.py's RENAMED_KEYS) is refused naming its new name:
on the command line (launch.py parses each --config.KEY=VALUE with `parse_value`), in a
sweep point, and in the config.json of a workdir written before the rename, whose files
stay as they were."""

import json
import os
import sys

import pytest
import tiny

from research.errors import ConfigError
from research.training.config import apply_overrides, parse_value
from research.training.loop import train

sys.path.insert(0, os.path.join(tiny.ROOT, "experiments"))
import char_lm  # noqa: E402
import kernel_regression  # noqa: E402


@pytest.mark.parametrize("old, new", [
    ("model.dropout", "config.model.dropout_rate: set that key instead"),
    ("model.mlp_ratio", "config.model.mlp_size (the MLP's width itself, mlp_ratio × "
                        "hidden_size): set that key instead")])
def test_an_old_key_on_the_command_line_names_the_new_one(old, new):
  config = char_lm.get_config()
  with pytest.raises(ConfigError) as error:
    parse_value(config, old, "4")
  assert str(error.value) == f"config key config.{old}, now called {new}"
  with pytest.raises(ConfigError, match=f"config key config.{old}, now called"):
    apply_overrides(config, {old: 4})                      # a sweep point's value


def test_an_unknown_key_without_its_new_name_in_the_config_lists_the_keys():
  """kernel_regression has no dropout: model.dropout is an unknown key there, as before."""
  with pytest.raises(ConfigError, match="unknown config key config.model.dropout; keys under "
                                        "config.model: bandwidth"):
    parse_value(kernel_regression.get_config(), "model.dropout", "0.1")


def test_a_workdir_written_under_an_old_key_is_refused_naming_the_new_one(tmp_path):
  config = tiny.config()
  old = config.to_dict()
  old["model"]["dropout"] = old["model"].pop("dropout_rate")     # as written before the rename
  path = tmp_path / "config.json"
  path.write_text(json.dumps(old))
  before = sorted(os.listdir(tmp_path)), path.read_bytes()
  with pytest.raises(ConfigError) as error:
    train(config, str(tmp_path), tiny.task())
  assert str(error.value) == (
      f"workdir {tmp_path} was written with config.model.dropout, now called "
      "config.model.dropout_rate: this version cannot resume it (its parameters have other "
      "names too); use a new --workdir, or resume it with the version of the project that "
      "wrote it")
  assert (sorted(os.listdir(tmp_path)), path.read_bytes()) == before
