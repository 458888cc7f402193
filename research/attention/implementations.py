"""The registry of attention implementations: what each one can do, and the function doing it.

`dot_product_attention(..., implementation=name)` describes its call as a `Request`, asks
the registered `Implementation` of that name what it cannot do (`unsupported`), and
either calls its `function` or raises an error naming what is missing and the
implementations that can. Registered, in this order (the last three by `research.kernels`):

  name        mask  bias  window    global  lengths  H_kv<H  dtypes        platforms  weights
  dense       yes   yes   optional  yes     yes      yes     f32 bf16 f16  all        yes
  chunked     yes   yes   optional  yes     yes      yes     f32 bf16 f16  all        no
  banded      yes   yes   required  yes     yes      yes     f32 bf16 f16  all        no
  cudnn       yes   yes   optional  no      yes      yes     bf16 f16      gpu        no
  pallas_gpu  yes   yes   optional  yes     yes      yes     f32 bf16 f16  gpu cpu*   no
  pallas_tpu  no    no    optional  yes     yes      yes     f32 bf16      tpu cpu*   no

"global" is `global_tokens=`, "lengths" `key_value_seq_lengths`, "weights"
`return_weights=True`; cpu* is Pallas interpret mode (slow: for tests, taken by name only).
Causal attention is no capability: every implementation does it. cuDNN also refuses a
two-sided window, a window with a mask or bias, head dims it cannot take and odd lengths
with a bias (`research/kernels/cudnn.py`).

`implementation="auto"` (the default) picks, when the call is traced, the first of these
that can do the request on the current backend (`candidates`, `choose`):

  backend  tried in order
  gpu      cudnn, pallas_gpu, then as on cpu
  tpu      pallas_tpu, then as on cpu
  cpu      dense if kv_len <= 256, banded, chunked, dense

so a fused kernel runs wherever one can do the pattern; otherwise a sliding window goes to
`banded` (O(n·w)), anything else to `chunked` (O(n) memory), and the weights
(`return_weights=True`) to `dense`. Up to kv_len = 256 (one key block of `chunked`) dense
is the same memory in one step. "auto" never changes the mathematics: a request no
candidate can do raises the error of an explicit name.

A kernel plugs in with `register(Implementation(name, fn, ..., platforms=frozenset({"gpu"})))`.
Its function has the signature of the ones here:

  fn(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights)

with q [batch, q_len, H, d], k / v [batch, kv_len, H_kv, d], bias and mask None or
[batch|1, H|1, q_len|1, kv_len|1] (mask boolean, True = may attend), `visibility` a
`masks.Visibility` (causal, window, static global-token positions, key lengths),
`block_size` an int or None (the implementation's default); it returns out
[batch, q_len, H, d_v] in q's dtype, or (out, weights float32 [batch, H, q_len, kv_len])
when `return_weights`. It is only called with requests its capabilities allow.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.attention.banded import banded_attention
from research.attention.chunked import chunked_attention
from research.attention.dense import dense_attention
from research.attention.masks import Visibility, normalize_window

Array = jax.Array
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})
WINDOW_SUPPORT = ("unsupported", "optional", "required")
AUTO = "auto"
# "auto": the fused kernels of a platform first, then the portable strategies.
FUSED = {"gpu": ("cudnn", "pallas_gpu"), "tpu": ("pallas_tpu",)}
# Up to one key block of `chunked` (256), dense attention is the same memory in one step.
DENSE_MAX_KV_LEN = 256


class Request(NamedTuple):
  """One call of `dot_product_attention`, as far as choosing an implementation goes."""
  mask: bool = False                        # an arbitrary boolean mask is given
  bias: bool = False                        # a bias is added to the logits
  window: tuple[int, int] | None = None     # (left, right), right = 0 when causal; or None
  causal: bool = False                      # query i sees keys j <= i
  global_tokens: bool = False               # Longformer global tokens are given
  key_value_seq_lengths: bool = False       # key padding given as lengths
  gqa: bool = False                         # fewer key/value heads than query heads
  dtype: str = "float32"                    # the dtype q, k, v promote to
  platform: str = "cpu"                     # jax.default_backend() when the call is traced
  return_weights: bool = False              # the weights are asked for
  head_dim: int = 64                        # d of q and k
  q_len: int = 1
  kv_len: int = 1

  @classmethod
  def of(cls, q: Array, k: Array, v: Array, *, mask=None, bias=None, is_causal: bool = False,
         window=None, global_tokens=None, key_value_seq_lengths=None,
         return_weights: bool = False) -> "Request":
    """The request of `dot_product_attention(q, k, v, ...)` on the current default backend."""
    return cls(mask=mask is not None, bias=bias is not None,
               window=normalize_window(window, is_causal), causal=bool(is_causal),
               global_tokens=global_tokens is not None and np.size(global_tokens) > 0,
               key_value_seq_lengths=key_value_seq_lengths is not None,
               gqa=k.shape[2] < q.shape[2],
               dtype=jnp.result_type(q.dtype, k.dtype, v.dtype).name,
               platform=jax.default_backend(), return_weights=bool(return_weights),
               head_dim=q.shape[-1], q_len=q.shape[1], kv_len=k.shape[1])


@dataclasses.dataclass(frozen=True)
class Implementation:
  """An attention implementation: its name, its function and what it supports.

  Capabilities left out are not claimed (a new kernel declares what it can do), except
  `platforms`, which defaults to every backend as a pure-JAX function runs anywhere.
  """
  name: str                                 # the `implementation=` argument
  function: Callable[..., Any]              # fn(q, k, v, *, scale, bias, mask, visibility, ...)
  mask: bool = False                        # an arbitrary boolean mask
  bias: bool = False                        # a bias added to the logits
  window: str = "unsupported"               # "unsupported", "optional" or "required"
  global_tokens: bool = False               # Longformer global tokens (`global_tokens=`)
  key_value_seq_lengths: bool = False       # key padding given as lengths
  gqa: bool = False                         # grouped / multi-query heads, H_kv < H
  dtypes: frozenset[str] = frozenset({"float32"})  # dtype names of q, k, v
  platforms: frozenset[str] | None = None   # backends it runs on ("cpu", "gpu", "tpu"); None: all
  interpreted: frozenset[str] = frozenset()  # backends where it runs in Pallas interpret mode
                                            # (slow, for tests): taken by name, never by "auto"
  returns_weights: bool = False             # can return the weights (return_weights=True)
  refuses: Callable[[Request], list[str]] | None = None  # further limits, in words (head dims,
                                            # combinations such as a bias with a window)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"an implementation's name must be a non-empty string, got {self.name!r}")
    if not callable(self.function):
      raise ValueError(f"implementation {self.name!r}: function must be callable, got "
                       f"{self.function!r}")
    if self.window not in WINDOW_SUPPORT:
      raise ValueError(f"implementation {self.name!r}: window must be one of {WINDOW_SUPPORT}, "
                       f"got {self.window!r}")
    for field in ("dtypes", "platforms", "interpreted"):
      value = getattr(self, field)
      if value is None and field == "platforms":
        continue
      if isinstance(value, str) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"implementation {self.name!r}: {field} must be a collection of names "
                         f"like {{'float32'}} or {{'gpu'}}, got {value!r}")
      object.__setattr__(self, field, frozenset(value))

  def unsupported(self, request: Request) -> list[str]:
    """What of `request` this implementation cannot do, in words (empty: it can do it all)."""
    missing = []
    if request.mask and not self.mask:
      missing.append("a mask")
    if request.bias and not self.bias:
      missing.append("a bias")
    if request.window is not None and self.window == "unsupported":
      missing.append(f"a window {request.window}")
    if request.window is None and self.window == "required":
      missing.append(f"no window ({self.name} needs a window: pass window=w or (left, right))")
    if request.global_tokens and not self.global_tokens:
      missing.append("global tokens")
    if request.key_value_seq_lengths and not self.key_value_seq_lengths:
      missing.append("key_value_seq_lengths")
    if request.gqa and not self.gqa:
      missing.append("fewer key/value heads than query heads")
    if request.dtype not in self.dtypes:
      missing.append(f"dtype {request.dtype} (it takes {', '.join(sorted(self.dtypes))})")
    if (self.platforms is not None and request.platform not in self.platforms
        and request.platform not in self.interpreted):
      missing.append(f"platform {request.platform!r} (it runs on "
                     f"{', '.join(map(repr, sorted(self.platforms)))})")
    if request.return_weights and not self.returns_weights:
      missing.append("return_weights=True needs the weights, which it does not return")
    if self.refuses is not None:
      missing.extend(self.refuses(request))
    return missing


_REGISTRY: dict[str, Implementation] = {}


def register(implementation: Implementation, *, replace: bool = False) -> Implementation:
  """Adds an implementation under its name; an existing name raises unless `replace`."""
  if not isinstance(implementation, Implementation):
    raise TypeError(f"register takes an Implementation, got {type(implementation).__name__}")
  if implementation.name == AUTO:
    raise ValueError(f"{AUTO!r} is the dispatcher's name; register under another name")
  if implementation.name in _REGISTRY and not replace:
    raise ValueError(f"implementation {implementation.name!r} is already registered; pass "
                     "replace=True to replace it")
  _REGISTRY[implementation.name] = implementation
  return implementation


def names() -> tuple[str, ...]:
  """The names `implementation=` takes: "auto", then the registered ones in order."""
  return (AUTO, *registered())


def get(name: str) -> Implementation:
  """The implementation registered as `name`; ValueError listing the names otherwise."""
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(f"implementation must be one of {names()}, got {name!r}")
  return _REGISTRY[name]


def check_name(name: str) -> str:
  """`name` if `implementation=` takes it ("auto" or registered); else the ValueError of `get`."""
  if name != AUTO:
    get(name)
  return name


def registered() -> tuple[str, ...]:
  """The registered implementation names, in registration order."""
  return tuple(_REGISTRY)


def supporting(request: Request) -> list[str]:
  """The implementations that can do `request` natively (not interpreted), in registration
  order: the alternatives an error suggests."""
  return [name for name, impl in _REGISTRY.items()
          if not impl.unsupported(request) and request.platform not in impl.interpreted]


def candidates(request: Request) -> tuple[str, ...]:
  """The order in which "auto" tries implementations for `request` (see the module table)."""
  small = ("dense",) if request.kv_len <= DENSE_MAX_KV_LEN else ()
  return (*FUSED.get(request.platform, ()), *small, "banded", "chunked", "dense")


def choose(request: Request) -> Implementation:
  """What `implementation="auto"` runs: the first of `candidates(request)` that can do it."""
  for name in candidates(request):
    if name in _REGISTRY and not _REGISTRY[name].unsupported(request):
      return _REGISTRY[name]
  raise ValueError(f"implementation='auto': no implementation can do this; dense cannot: "
                   f"{'; '.join(get('dense').unsupported(request))}")


def check(name: str, request: Request) -> Implementation:
  """The implementation `name` (or the one "auto" chooses) if it can do `request`; else a
  ValueError saying what it cannot do and which implementations can."""
  if check_name(name) == AUTO:
    return choose(request)
  implementation = get(name)
  missing = implementation.unsupported(request)
  if missing:
    able = supporting(request)
    alternatives = (f"implementations that can: {', '.join(map(repr, able))}" if able
                    else "no registered implementation can")
    raise ValueError(f"implementation={name!r} cannot do this: {'; '.join(missing)}; "
                     f"{alternatives}")
  return implementation


# The three strategies of this package, behind the uniform signature.

def _dense(q, k, v, *, scale, bias, mask, visibility: Visibility, block_size, return_weights):
  del block_size  # no blocks: the weights are materialised whole
  visible = None
  if not visibility.sees_everything:
    visible = visibility.dense(q.shape[1], k.shape[1])[:, None]
  if mask is not None:
    visible = mask if visible is None else visible & mask
  out, weights = dense_attention(q, k, v, scale=scale, bias=bias, visible=visible)
  return (out, weights) if return_weights else out


def _chunked(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
  del return_weights  # never asked for: returns_weights=False
  blocks = {} if block_size is None else dict(q_block=block_size, k_block=block_size)
  return chunked_attention(q, k, v, scale=scale, bias=bias, mask=mask, visibility=visibility,
                           **blocks)


def _banded(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
  del return_weights  # never asked for: returns_weights=False
  blocks = {} if block_size is None else dict(block=block_size)
  return banded_attention(q, k, v, scale=scale, bias=bias, mask=mask, visibility=visibility,
                          **blocks)


_EXACT = dict(mask=True, bias=True, key_value_seq_lengths=True, gqa=True, dtypes=FLOAT_DTYPES)
register(Implementation("dense", _dense, window="optional", global_tokens=True,
                        returns_weights=True, **_EXACT))
register(Implementation("chunked", _chunked, window="optional", global_tokens=True, **_EXACT))
register(Implementation("banded", _banded, window="required", global_tokens=True, **_EXACT))
