"""A linear recurrence (LRU, S5, linear attention as a cell) or a selective one (Mamba,
Mamba-2, GLA, DeltaNet) in the place of a TransformerBlock's self-attention.

The block around it (LayerNorm, residual, MLP) is the transformer's, so a model of these
blocks has the transformer's widths and depth, as in the LRU and S5 papers' LRA models;
`block_mixer(kind, ...)` is the constructor a TransformerBlock calls with name="attention".
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax

from research.recurrent import GLA, LRU, S5, DeltaNet, LinearAttention, Mamba, Mamba2
from research.recurrent.selective import SelectiveLayer

Array = jax.Array
LINEAR_RECURRENT = {"lru": LRU, "s5": S5, "linear_cell": LinearAttention, "mamba": Mamba,
                    "mamba2": Mamba2, "gla": GLA, "deltanet": DeltaNet}
# the selective ones (their transition depends on the input): heads that divide the width
SELECTIVE = tuple(kind for kind, layer in LINEAR_RECURRENT.items()
                  if issubclass(layer, SelectiveLayer))
# A model's `recurrence` sets the layer's other fields per kind, e.g.
# {"lru": {"r_min": 0.9, "r_max": 0.999}, "s5": {"dt_min": 1e-4}}: OPTIONS lists those a
# model may set (the rest, the state size, the direction and the dtype, it sets itself), and
# `recurrence_defaults()` gives their defaults, the layers' own.
OPTIONS = {   # per kind: the layer's fields a model's `recurrence` may set
    "lru": ("r_min", "r_max", "max_phase", "mode", "chunk_size"),
    "s5": ("blocks", "conj_sym", "dt_min", "dt_max", "mode", "chunk_size"),
    "linear_cell": ("decay", "feature_map", "normalize", "mode", "chunk_size"),
    "mamba": ("expand", "conv_size", "dt_min", "dt_max", "mode", "chunk_size"),
    "mamba2": ("expand", "head_dim", "conv_size", "dt_min", "dt_max", "mode", "chunk_size"),
    "gla": ("expand_k", "gate_rank", "gate_temperature", "mode", "chunk_size"),
    "deltanet": ("conv_size", "use_gate", "allow_neg_eigval", "mode", "chunk_size"),
}


def recurrence_defaults() -> dict[str, dict[str, Any]]:
  """{kind: {option: the layer's default}} for every kind of LINEAR_RECURRENT."""
  return {kind: {field.name: field.default for field in dataclasses.fields(LINEAR_RECURRENT[kind])
                 if field.name in OPTIONS[kind]} for kind in LINEAR_RECURRENT}


def check_recurrence(recurrence: Mapping[str, Mapping[str, Any]] | None,
                     state_size: int = 64, kind: str | None = None) -> None:
  """ValueError naming the first unknown kind or option, or value a layer refuses: with
  `state_size` states every kind's layer, or, given the model's `kind`, that one's alone
  (another kind's options are checked as options, whatever the state size: S5's even
  state sizes are no LRU's concern)."""
  for name, options in (recurrence or {}).items():
    if name not in LINEAR_RECURRENT:
      raise ValueError(f"{name!r} is not a linear recurrence; the kinds are "
                       f"{', '.join(LINEAR_RECURRENT)}")
    for option in options:
      if option not in OPTIONS[name]:
        raise ValueError(f"{name}.{option} is not an option of {name}; its options are "
                         f"{', '.join(OPTIONS[name])}")
    try:
      layer = linear_recurrence(name, state_size, recurrence)
      if kind in (None, name):
        layer.check_config()
      else:
        layer.check_options()
    except (TypeError, ValueError) as error:
      raise ValueError(f"{name}: {error}") from None


def linear_recurrence(kind: str, state_size: int,
                      recurrence: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
  """The layer of `kind` (one of LINEAR_RECURRENT) with `state_size` states and recurrence[kind]'s options,
  unbound: for its checks and sizes."""
  return LINEAR_RECURRENT[kind](state_size=state_size, **dict((recurrence or {}).get(kind, {})))


def recurrence_parameters(kind: str, state_size: int, features: int,
                          recurrence: Mapping[str, Mapping[str, Any]] | None = None) -> int:
  """How many parameters a bidirectional recurrence of `kind` has for `features` (the
  layer's `parameter_count`)."""
  layer = linear_recurrence(kind, state_size, recurrence)
  return layer.clone(bidirectional=True).parameter_count(features)


class RecurrentMixer(nn.Module):
  """x [B, L, F], key lengths [B] or None -> [B, L, F]:

    y = LRU(x) or S5(x) with N = `state_size` complex states, or LinearAttention(x) (kind
    "linear_cell"): F / state_size heads of causal linear attention run as a recurrence,
    each with a state of state_size × (state_size + 1); or a selective recurrence: Mamba(x)
    (N = state_size states per channel), Mamba2(x) (N per head), GLA(x) and DeltaNet(x)
    (F / state_size heads of that size).

  Not causal (an encoder, a classifier): bidirectional, a forward and a backward state, so
  every position reads the whole sequence as self-attention does; causal (a decoder): the
  forward state alone. Padded steps (t ≥ length) give zeros and leave the state as it was.
  """
  layer: Callable[..., nn.Module]   # one of LINEAR_RECURRENT's layers
  state_size: int = 64              # N
  options: Mapping[str, Any] | None = None   # the layer's other fields (OPTIONS)
  dtype: Any = None                 # dtype of the matrix products

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train  # no dropout inside the recurrence
    y, _ = self.layer(state_size=self.state_size, bidirectional=not is_causal, dtype=self.dtype,
                      **dict(self.options or {}), name="recurrence")(
        x, seq_lengths=key_value_seq_lengths)
    return y.astype(x.dtype)


def block_mixer(kind: str, self_attention: Callable[[], Callable[..., nn.Module]], *,
                state_size: int, dtype: Any,
                recurrence: Mapping[str, Mapping[str, Any]] | None = None
                ) -> Callable[..., nn.Module]:
  """The mixer of a block of a model of `kind`: `self_attention()` (a constructor, see
  self_attention.py) for "transformer", RecurrentMixer for the LINEAR_RECURRENT kinds with
  the options recurrence[kind] (the layer's defaults where absent)."""
  if kind in LINEAR_RECURRENT:
    check_recurrence(recurrence, state_size, kind)
    options = dict((recurrence or {}).get(kind, {}))
    return functools.partial(RecurrentMixer, LINEAR_RECURRENT[kind], state_size,
                             options=options, dtype=dtype)
  return self_attention()
