"""Config overrides: unknown keys and wrong types name the key and what is allowed."""

import math

import ml_collections
import pytest

from research.training.config import (
  ConfigError,
  apply_overrides,
  base_config,
  check_base_keys,
  check_host_memory,
  check_shared,
  parse_value,
  parse_variants,
)


def test_unknown_key_lists_the_neighbouring_keys():
  with pytest.raises(ConfigError, match=r"config\.train\.num_step;.*num_steps"):
    parse_value(base_config(), "train.num_step", "3")
  with pytest.raises(ConfigError, match=r"keys at the top level: .*train"):
    parse_value(base_config(), "trian.num_steps", "3")


def test_values_parse_to_the_default_type():
  config = base_config()
  assert parse_value(config, "train.num_steps", "12") == 12
  assert parse_value(config, "train.learning_rate", "3e-4") == pytest.approx(3e-4)
  assert parse_value(config, "distributed.num_processes", "2") == 2
  for key, text in [("train.num_steps", "ten"), ("train.num_steps", "1.5"),
                    ("distributed.process_id", "first")]:
    with pytest.raises(ConfigError, match=rf"config\.{key}=.*must be of type"):
      parse_value(config, key, text)


def test_apply_overrides_copies_and_checks_types():
  config = base_config()
  changed = apply_overrides(config, {"train.batch_size": 8, "train.learning_rate": 1})
  assert (changed.train.batch_size, changed.train.learning_rate) == (8, 1)
  assert config.train.batch_size == 64
  with pytest.raises(ConfigError, match="must be of type int"):
    apply_overrides(config, {"train.batch_size": "eight"})
  with pytest.raises(ConfigError, match="is a group"):
    apply_overrides(config, {"train": 1})


@pytest.mark.parametrize("key, value, message", [
    ("train.num_steps", 0, r"train\.num_steps=0 must be a number > 0"),
    ("train.batch_size", -4, r"train\.batch_size=-4 must be a number > 0"),
    ("train.warmup_steps", -1, r"train\.warmup_steps=-1 must be a number >= 0"),
    ("train.parallelism", "vmap", r"parallelism='vmap' is not allowed; choose one of: 'jit', 'pmap'"),
    ("train.checkpoint_every", 75, r"train\.log_every=50 must divide config\.train\.checkpoint_every=75"),
    ("distributed.coordinator_address", "localhost",
     r"coordinator_address='localhost' must be HOST:PORT"),
    ("train.learning_rate", float("nan"), r"learning_rate=nan must be a finite number > 0"),
    ("train.weight_decay", float("inf"), r"weight_decay=inf must be a finite number >= 0"),
    ("train.adam_b2", float("nan"), r"adam_b2=nan must be in \[0, 1\)"),
    ("train.num_steps", 2**31, r"num_steps=2147483648 must be at most 2147483647 \(an int32\)"),
    ("seed", -1, r"seed=-1 must be in 0 … 9223372036854775807"),
    ("seed", 2**63, r"seed=9223372036854775808 must be in 0 …"),
    ("train.profile_steps", "5-7", r"profile_steps must be 'FIRST,LAST' or 'STEP' .*got '5-7'"),
    ("train.profile_steps", "1,2,3", r"profile_steps must be 'FIRST,LAST'"),
    ("train.profile_steps", "7,5", r"profile_steps='7,5' must be steps FIRST <= LAST within "
                                   r"1 … config\.train\.num_steps=1000"),
    ("train.profile_steps", "0,2", r"profile_steps='0,2' must be steps FIRST <= LAST"),
    ("train.profile_steps", "999,1001", r"profile_steps='999,1001' must be steps"),
])
def test_shared_checks(key, value, message):
  with pytest.raises(ConfigError, match=message):
    check_shared(apply_overrides(base_config(), {key: value}))


@pytest.mark.parametrize("key, value, message", [
    ("recurrence.lru.max_phase", math.inf, r"config\.model\.recurrence\.lru\.max_phase=inf "
                                           r"must be a finite number \(not inf or nan\)"),
    ("recurrence.s5.dt_max", -math.inf, r"config\.model\.recurrence\.s5\.dt_max=-inf must be"),
    ("recurrence.s5.dt_min", math.nan, r"config\.model\.recurrence\.s5\.dt_min=nan must be"),
    ("widths", [1.0, math.inf], r"config\.model\.widths\[1\]=inf must be a finite number"),
    ("state_size", 2**31, r"config\.model\.state_size=2147483648 must be at most 2147483647 "
                          r"\(an int32\)"),
    ("recurrence.s5.blocks", -(2**31) - 1, r"config\.model\.recurrence\.s5\.blocks="
                                           r"-2147483649 must be at least -2147483648"),
])
def test_every_number_at_any_depth_is_finite_and_an_int32(key, value, message):
  """The rule holds for keys no experiment lists (an LRU's max_phase=inf passed before and
  its run ended in a NaN loss); the seed alone is an int64."""
  config = base_config()
  config.model = ml_collections.ConfigDict({"recurrence": {"lru": {"max_phase": 1.0},
                                                           "s5": {"dt_min": 1e-3, "dt_max": 0.1,
                                                                  "blocks": 1}},
                                            "widths": [1.0, 2.0], "state_size": 64})
  config.seed = 2**40
  check_shared(config)
  parent, _, leaf = f"model.{key}".rpartition(".")
  node = config
  for part in parent.split("."):
    node = node[part]
  node[leaf] = value
  with pytest.raises(ConfigError, match=message):
    check_shared(config)


@pytest.mark.parametrize("key, value", [
    ("seed", -1), ("seed", 2**63), ("data.seed", -1), ("data.seed", 2**63),
    ("data.split.seed", -5), ("data.seed", 1.5), ("data.seed", True), ("data.seed", "0")])
def test_every_key_named_seed_is_an_int64_at_least_0(key, value):
  """config.seed and any other seed (listops' data.seed made a data set named seed-1)."""
  config, data = base_config(), {"seed": 2**63 - 1, "split": {"seed": 0}}
  config.data = ml_collections.ConfigDict(data)
  check_shared(config)
  if key == "seed":
    config.seed = value
  else:
    node = data
    for part in key.split(".")[1:-1]:
      node = node[part]
    node["seed"] = value
    config.data = ml_collections.ConfigDict(data)
  with pytest.raises(ConfigError) as refused:
    check_shared(config)
  assert str(refused.value) == f"config.{key}={value!r} must be in 0 … 9223372036854775807 (an int64)"


@pytest.mark.parametrize("address, num_processes, process_id, message", [
    ("localhost:1234", 0, 0, r"num_processes=0 must be an int >= 1"),
    ("localhost:1234", 2, 2, r"process_id=2 must be in 0 … 1"),
    ("localhost:1234", 2, -1, r"process_id=-1 must be in 0 … 1"),
    ("", 0, 0, r"num_processes=0 must be an int >= 1"),       # without an address, as with one
    ("", -5, 0, r"num_processes=-5 must be an int >= 1"),
    ("", 1, -1, r"process_id=-1 must be in 0 … 0"),
    ("", 2, 1, r"num_processes=2 and process_id=1 are used only with "
               r"config\.distributed\.coordinator_address=HOST:PORT"),
])
def test_distributed_process_numbers(address, num_processes, process_id, message):
  config = apply_overrides(base_config(), {"distributed.coordinator_address": address,
                                           "distributed.num_processes": num_processes,
                                           "distributed.process_id": process_id})
  with pytest.raises(ConfigError, match=message):
    check_shared(config)


def test_a_size_that_would_not_fit_says_what_it_would_need():
  config = apply_overrides(base_config(), {"train.batch_size": 2**30})
  check_host_memory(config, ("train.batch_size",), 1024, "a kilobyte")
  with pytest.raises(ConfigError, match=r"config\.train\.batch_size=1073741824 would need "
                                        r"4294967296\.00 GiB of host memory for its batches, but "
                                        r"this machine has .* available"):
    check_host_memory(config, ("train.batch_size",), 2**62, "its batches")


def test_a_config_file_without_the_base_keys_is_named():
  config = base_config()
  del config.train["schedule"]
  with pytest.raises(ConfigError, match=r"x\.py: get_config\(\) has no config\.train\.schedule; "
                                        r"start it from research\.training\.base_config\(\)"):
    check_base_keys(config, "x.py: get_config()")
  with pytest.raises(ConfigError, match=r"returned 5 \(a int\), not an ml_collections"):
    check_base_keys(5, "get_config()")


def test_a_config_without_variants_refuses_any_and_a_variant_needs_a_value():
  assert parse_variants(None, {}) == {}
  with pytest.raises(ConfigError, match="this config takes no variant arguments, got 'a=1'"):
    parse_variants("a=1", {})
  with pytest.raises(ConfigError, match=r"variant 'a' in --config \.\.\.:a has no value"):
    parse_variants("a", {"a": "x"})
