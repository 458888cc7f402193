"""The registry of attention implementations: requests, capabilities, and what "auto" picks.

This module imports no implementation: the portable strategies (`implementations.py`) and
the accelerator kernels (`kernels/`) register themselves here, and `functional.py`
dispatches through it, describing each call as a platform-free `Request` and asking, for
each platform it may be lowered for, which registered `Implementation` runs it (`plan`).
"""

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from research.attention.masks import normalize_window

Array = jax.Array
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})
WINDOW_SUPPORT = ("unsupported", "optional", "required")
PLATFORMS = ("cpu", "gpu", "tpu")      # capability names of the platforms "auto" chooses for
                                       # ("gpu": NVIDIA, the "cuda" lowering platform)
AUTO = "auto"


_COMPILING_FOR = contextvars.ContextVar("compiling_for", default=None)
_CHOICES = contextvars.ContextVar("choices", default=None)


@contextlib.contextmanager
def recording_choices():
  """Yields a list that collects, for every call planned within, {platform: implementation
  name or None (refused)}: what a compiled program runs where (`research.aot`)."""
  choices = []
  token = _CHOICES.set(choices)
  try:
    yield choices
  finally:
    _CHOICES.reset(token)


class CompileTarget(NamedTuple):
  """What a deviceless compile traces for (`research.aot`)."""
  platform: str                                  # "cpu", "gpu" or "tpu"
  gpu_capability: tuple[int, int] | None = None  # a GPU's compute capability, e.g. (7, 5)
  device: str = ""                               # in words, for messages: "t4 (Tesla T4)"


@contextlib.contextmanager
def compiling_for(platform: str, gpu_capability: tuple[int, int] | None = None,
                  device: str = ""):
  """Within it, calls are traced for `platform` (hardware this machine may not have): a
  request no platform can do is refused in that platform's words (`platforms.host`), and
  "gpu" means a GPU of `gpu_capability`, called `device` in messages."""
  token = _COMPILING_FOR.set(CompileTarget(
      platform, None if gpu_capability is None else tuple(gpu_capability), device))
  try:
    yield
  finally:
    _COMPILING_FOR.reset(token)


def compile_target() -> CompileTarget | None:
  """What `compiling_for` set, or None outside it."""
  return _COMPILING_FOR.get()


def gpu_capability() -> tuple[int, int] | None:
  """The compute capability "gpu" stands for: the one `compiling_for` sets, else this
  machine's GPU's, else None (unknown: any)."""
  if _COMPILING_FOR.get() is not None:
    return _COMPILING_FOR.get().gpu_capability
  if jax.default_backend() == "gpu":
    major, _, minor = str(jax.devices()[0].compute_capability).partition(".")
    return int(major), int(minor or 0)
  return None


def below_capability(request: "Request", minimum: tuple[int, int], what: str) -> list[str]:
  """[the refusal] when `request` is for a GPU older than `minimum` (`gpu_capability`);
  `what` names the kernel that needs it."""
  capability = gpu_capability()
  if request.platform != "gpu" or capability is None or capability >= minimum:
    return []
  device = (_COMPILING_FOR.get() or CompileTarget("gpu")).device
  return [f"{device + ', ' if device else ''}a GPU of compute capability "
          f"{capability[0]}.{capability[1]} ({what} needs {minimum[0]}.{minimum[1]} or newer)"]


class ImplementationError(ValueError):
  """An implementation cannot do a request (on a platform): raised when the call is traced,
  or when it is lowered for a platform that cannot run it."""


class Request(NamedTuple):
  """One call of `dot_product_attention`, as far as choosing an implementation goes."""
  mask: bool = False                        # an arbitrary boolean mask is given
  bias: bool = False                        # a bias is added to the logits
  window: tuple[int, int] | None = None     # (left, right), right = 0 when causal; or None
  causal: bool = False                      # query i sees keys j <= i
  global_tokens: bool = False               # Longformer global tokens are given
  sparsity: Any = None                      # a block-sparse pattern (`block_sparse`), or None
  key_value_seq_lengths: bool = False       # key padding given as lengths
  gqa: bool = False                         # fewer key/value heads than query heads
  dtype: str = "float32"                    # the dtype q, k, v promote to
  platform: str = "cpu"                     # the platform it is lowered for (see PLATFORMS)
  return_weights: bool = False              # the weights are asked for
  head_dim: int = 64                        # d of q and k
  q_len: int = 1
  kv_len: int = 1

  @classmethod
  def of(cls, q: Array, k: Array, v: Array, *, mask=None, bias=None, is_causal: bool = False,
         window=None, global_tokens=None, sparsity=None, key_value_seq_lengths=None,
         return_weights: bool = False) -> "Request":
    """The request of `dot_product_attention(q, k, v, ...)` (platform: set by `plan`)."""
    return cls(mask=mask is not None, bias=bias is not None,
               window=normalize_window(window, is_causal), causal=bool(is_causal),
               global_tokens=global_tokens is not None and np.size(global_tokens) > 0,
               sparsity=sparsity,
               key_value_seq_lengths=key_value_seq_lengths is not None,
               gqa=k.shape[2] < q.shape[2],
               dtype=jnp.result_type(q.dtype, k.dtype, v.dtype).name,
               return_weights=bool(return_weights),
               head_dim=q.shape[-1], q_len=q.shape[1], kv_len=k.shape[1])


@dataclasses.dataclass(frozen=True)
class Implementation:
  """An attention implementation: its name, its function and what it supports.

  Capabilities left out are not claimed (a new kernel declares what it can do), except
  `platforms`, which defaults to every platform as a pure-JAX function runs anywhere. A
  kernel plugs in with `register(Implementation(name, fn, ..., platforms={"gpu"},
  auto_rank=0))`. Its function has the uniform signature

    fn(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights[, interpret])

  with q [batch, q_len, H, d], k / v [batch, kv_len, H_kv, d], bias and mask None or
  [batch|1, H|1, q_len|1, kv_len|1] (mask boolean, True = may attend), `visibility` a
  `masks.Visibility` (causal, window, static global-token positions, a block-sparse pattern,
  key lengths), `block_size` an int or None (the implementation's default), and `interpret`
  (only for implementations with `interpreted` platforms) True where it runs in Pallas'
  interpreter; it returns out [batch, q_len, H, d_v] in q's dtype, or (out, weights float32
  [batch, H, q_len, kv_len]) when `return_weights`. It is only called with requests its
  capabilities allow. `capability_table` renders the registered ones (docs/attention.md
  shows it).
  """
  name: str                                 # the `implementation=` argument
  function: Callable[..., Any]              # fn(q, k, v, *, scale, bias, mask, visibility, ...)
  mask: bool = False                        # an arbitrary boolean mask
  bias: bool = False                        # a bias added to the logits
  window: str = "unsupported"               # "unsupported", "optional" or "required"
  global_tokens: bool = False               # Longformer global tokens (`global_tokens=`)
  block_sparse: bool = False                # a block-sparse pattern (`sparsity=`); with
                                            # window="required", it stands for the window
  key_value_seq_lengths: bool = False       # key padding given as lengths
  gqa: bool = False                         # grouped / multi-query heads, H_kv < H
  dtypes: frozenset[str] = frozenset({"float32"})  # dtype names of q, k, v
  platforms: frozenset[str] | None = None   # where it runs natively ("cpu", "gpu", "tpu");
                                            # None: everywhere (a pure-JAX function)
  interpreted: frozenset[str] = frozenset()  # platforms where it runs in Pallas interpret mode
                                            # (slow, for tests): taken by name, never by "auto"
  returns_weights: bool = False             # can return the weights (return_weights=True)
  refuses: Callable[[Request], list[str]] | None = None  # further limits, in words (head dims,
                                            # combinations such as a bias with a window)
  auto_rank: int | Callable[[Request], int] | None = None  # "auto" tries lower ranks first
                                            # (ties: registration order); None: never
  missing_here: Callable[[], str | None] | None = None  # why it cannot be traced on this
                                            # machine (a library not installed), or None

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
    if request.window is None and self.window == "required" and (
        request.sparsity is None or not self.block_sparse):
      missing.append(f"no window ({self.name} needs a window: pass window=w or (left, right)"
                     f"{' or a block-sparse pattern' if self.block_sparse else ''})")
    if request.global_tokens and not self.global_tokens:
      missing.append("global tokens")
    if request.sparsity is not None and not self.block_sparse:
      missing.append(f"a block-sparse pattern ({type(request.sparsity).__name__})")
    if request.key_value_seq_lengths and not self.key_value_seq_lengths:
      missing.append("key_value_seq_lengths")
    if request.gqa and not self.gqa:
      missing.append("fewer key/value heads than query heads")
    if request.dtype not in self.dtypes:
      missing.append(f"dtype {request.dtype} (it takes {', '.join(sorted(self.dtypes))})")
    if not self.runs_on(request.platform):
      missing.append(f"platform {request.platform!r} (it runs on "
                     f"{', '.join(map(repr, sorted(self.platforms)))})")
    if request.return_weights and not self.returns_weights:
      missing.append("return_weights=True needs the weights, which it does not return")
    if self.refuses is not None:
      missing.extend(self.refuses(request))
    return missing

  def runs_on(self, platform: str) -> bool:
    """It runs on `platform`, natively or interpreted."""
    return self.platforms is None or platform in self.platforms or platform in self.interpreted

  def rank(self, request: Request) -> int | None:
    """Its place in "auto"'s order for `request` (None: "auto" never takes it)."""
    return self.auto_rank(request) if callable(self.auto_rank) else self.auto_rank


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


def gives_weights(name: str) -> bool:
  """Whether `implementation=name` computes the attention weights (never "auto", whose
  choice depends on the platform)."""
  return name != AUTO and get(name).returns_weights


def check_name(name: str) -> str:
  """`name` if `implementation=` takes it ("auto" or registered); else the ValueError of `get`."""
  if name != AUTO:
    get(name)
  return name


def registered() -> tuple[str, ...]:
  """The registered implementation names, in registration order."""
  return tuple(_REGISTRY)


def can_do(name: str, request: Request) -> bool:
  """The implementation `name` can do `request` on some platform (of PLATFORMS)."""
  return any(not get(name).unsupported(request._replace(platform=p)) for p in PLATFORMS)


def supporting(request: Request) -> list[str]:
  """The implementations that can do `request` natively (not interpreted) on its platform,
  in registration order: the alternatives an error suggests."""
  return [name for name, impl in _REGISTRY.items()
          if not impl.unsupported(request) and request.platform not in impl.interpreted]


def candidates(request: Request) -> tuple[str, ...]:
  """The order in which "auto" tries implementations on `request.platform`: those running
  natively there with a rank, lowest rank first (ties in registration order)."""
  ranked = [(impl.rank(request), i, name) for i, (name, impl) in enumerate(_REGISTRY.items())
            if impl.rank(request) is not None and request.platform not in impl.interpreted
            and impl.runs_on(request.platform)]
  return tuple(name for *_, name in sorted(ranked))


def choose(request: Request) -> Implementation:
  """What `implementation="auto"` runs on `request.platform`: the first of
  `candidates(request)` that can do it. The pick depends on the request and its platform
  alone, never on what this machine has installed: a pick that cannot be traced here (a
  library missing, `missing_here`) is refused naming what to install, rather than replaced
  by another kernel on this machine only."""
  for name in candidates(request):
    impl = _REGISTRY[name]
    if impl.unsupported(request):
      continue
    if impl.missing_here is not None and (missing := impl.missing_here()):
      raise ImplementationError(f"implementation='auto' runs {name!r} for this on "
                                f"{request.platform!r}, which cannot be traced here: {missing}")
    return impl
  raise ImplementationError(f"implementation='auto': no implementation can do this on "
                   f"{request.platform!r}; dense cannot: "
                   f"{'; '.join(get('dense').unsupported(request))}")


def check(name: str, request: Request) -> Implementation:
  """The implementation `name` (or the one "auto" chooses) if it can do `request` on
  `request.platform`; else a ValueError saying what it cannot do and which can."""
  if check_name(name) == AUTO:
    return choose(request)
  implementation = get(name)
  missing = implementation.unsupported(request)
  if not missing and implementation.missing_here is not None:
    missing = [m for m in [implementation.missing_here()] if m]
  if missing:
    able = supporting(request)
    alternatives = (f"implementations that can: {', '.join(map(repr, able))}" if able
                    else "no registered implementation can")
    raise ImplementationError(f"implementation={name!r} cannot do this: {'; '.join(missing)}; "
                     f"{alternatives}")
  return implementation


class Choice(NamedTuple):
  """What runs a request on one platform: an implementation (interpreted or not), or the
  error that lowering for that platform raises."""
  implementation: Implementation | None
  interpret: bool = False
  refusal: str | None = None


def plan(name: str, request: Request, host: str) -> dict[str, Choice]:
  """platform -> Choice for each of PLATFORMS:

    named         the implementation itself where it can do the request, natively or (Pallas
                  kernels on a CPU) interpreted; a refusal on the other platforms.
    "auto"        per platform, the first of the implementations that run natively there
                  and can do the request, by `auto_rank` (then registration order); the
                  same on every machine (a pick whose library is not installed here is
                  refused when lowered for its platform, not swapped for another).

  A request that no platform can run raises the ValueError of `check` on `host` (the
  platform the call is traced on), so an impossible call fails when traced, naming what is
  missing and the implementations that can; one that some platform can run fails only when
  lowered for a platform that cannot."""
  choices, errors = {}, {}
  for platform in PLATFORMS:
    try:
      impl = check(name, request._replace(platform=platform))
    except ImplementationError as error:
      errors[platform] = str(error)
      choices[platform] = Choice(None, refusal=str(error))
    else:
      choices[platform] = Choice(impl, interpret=platform in impl.interpreted)
  if len(errors) == len(PLATFORMS):
    raise ImplementationError(errors.get(host, errors["cpu"]))
  if _CHOICES.get() is not None:
    _CHOICES.get().append({p: c.implementation and c.implementation.name
                           for p, c in choices.items()})
  return choices


def capability_table() -> str:
  """The registry as the table in docs/attention.md."""
  rows = [("name", "mask", "bias", "window", "global", "sparse", "lengths", "H_kv<H", "dtypes",
           "platforms", "weights", "auto rank")]
  yes = lambda flag: "yes" if flag else "no"
  for name, impl in _REGISTRY.items():
    where = "all" if impl.platforms is None else " ".join(sorted(impl.platforms))
    where = " ".join([where, *sorted(p + "*" for p in impl.interpreted)])
    rank = ("-" if impl.auto_rank is None else "varies" if callable(impl.auto_rank)
            else str(impl.auto_rank))
    rows.append((name, yes(impl.mask), yes(impl.bias), impl.window, yes(impl.global_tokens),
                 yes(impl.block_sparse), yes(impl.key_value_seq_lengths), yes(impl.gqa),
                 " ".join(d.replace("float", "f") for d in sorted(impl.dtypes, key=["float32", "bfloat16",
                                                            "float16"].index)),
                 where, yes(impl.returns_weights), rank))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                   for row in rows)
