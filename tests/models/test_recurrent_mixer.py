"""The linear recurrences' checks and sizes as a model's blocks take them: the options of
the model's own kind checked with its state size, and the parameter count that the
experiments check against the host's memory equal to flax's own."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.recurrent_mixer import (
  LINEAR_RECURRENT,
  check_recurrence,
  recurrence_defaults,
  recurrence_parameters,
)


def test_only_the_models_kind_is_checked_with_its_state_size():
  """An odd state size suits an LRU; S5's conjugate pairs need an even one, which matters
  to an S5 model only (an LRU model with 63 states was refused for S5's sake)."""
  defaults = recurrence_defaults()
  check_recurrence(defaults, 63, "lru")
  with pytest.raises(ValueError, match=r"s5: state_size must be a multiple of 2 × blocks"):
    check_recurrence(defaults, 63, "s5")
  with pytest.raises(ValueError, match=r"s5: state_size must be a multiple of 2 × blocks"):
    check_recurrence(defaults, 63)                 # no kind: every layer
  with pytest.raises(ValueError, match=r"s5\.r_min is not an option of s5"):
    check_recurrence({**defaults, "s5": {"r_min": 0.5}}, 63, "lru")   # every kind's options
  with pytest.raises(ValueError, match=r"s5: need 0 < dt_min <= dt_max"):
    check_recurrence({**defaults, "s5": {"dt_min": 0.5}}, 63, "lru")


HEADED = ("linear_cell", "gla", "deltanet")   # F / state_size heads of state_size


@pytest.mark.parametrize("kind, options", [
    ("lru", {}), ("s5", {}), ("s5", {"conj_sym": False}), ("s5", {"blocks": 2}),
    ("linear_cell", {}), ("mamba", {}), ("mamba", {"expand": 3, "conv_size": 2}),
    ("mamba2", {"head_dim": 2}), ("gla", {}), ("gla", {"gate_rank": 3}), ("deltanet", {}),
    ("deltanet", {"conv_size": 0, "use_gate": True})])
def test_parameter_count_is_flaxs(kind, options):
  """recurrence_parameters counts a bidirectional layer's parameters exactly (what the
  experiments weigh against the host's memory before building)."""
  features, state_size = (4, 2) if kind in HEADED else (3, 8)
  layer = LINEAR_RECURRENT[kind](state_size=state_size, bidirectional=True, **options)
  shapes = jax.eval_shape(layer.init, jax.random.key(0), jnp.zeros((1, 2, features)))
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
  assert recurrence_parameters(kind, state_size, features, {kind: options}) == count


@pytest.mark.parametrize("kind, option, value", [("lru", "max_phase", math.inf),
                                                 ("lru", "r_max", math.nan),
                                                 ("s5", "dt_max", math.inf),
                                                 ("s5", "dt_min", -math.inf)])
def test_an_infinite_or_nan_option_is_refused(kind, option, value):
  recurrence = recurrence_defaults()
  recurrence[kind][option] = value
  with pytest.raises(ValueError, match=rf"{kind}: {option} must be a finite number, "
                                       rf"got {np.format_float_positional(value)}"):
    check_recurrence(recurrence, 64, kind)


def test_the_linear_cells_options_are_checked_by_name():
  recurrence = recurrence_defaults()
  recurrence["linear_cell"]["decay"] = "exponential"
  with pytest.raises(ValueError, match=r"linear_cell: decay must be one of \('none', 'retnet'\)"):
    check_recurrence(recurrence, 16, "linear_cell")
