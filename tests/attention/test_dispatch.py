"""`implementation="auto"`: the table of what it picks on each platform (platforms mocked),
that the choice is made when the call is traced and never changes the mathematics, and
the cuDNN wrapper's translation of our pattern (run through jax.nn's XLA path on a CPU)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention import (
  MultiHeadAttention,
  Visibility,
  dot_product_attention,
  registry,
)
from research.attention.kernels import cudnn

pytestmark = pytest.mark.usefixtures("highest_precision")

Request = registry.Request
LONG = dict(q_len=2048, kv_len=2048)
SHORT = dict(q_len=128, kv_len=128)


@pytest.mark.parametrize("platform,request_,chosen", [
    # GPU: cuDNN where it can, our Pallas kernel for what it cannot
    ("gpu", Request(causal=True, dtype="bfloat16", **LONG), "cudnn"),
    ("gpu", Request(causal=True, window=(256, 0), dtype="bfloat16", key_value_seq_lengths=True,
                    gqa=True, head_dim=128, **LONG), "cudnn"),
    # a window at head dims up to 64: our kernel, faster there on an H200 (auto_rank)
    ("gpu", Request(causal=True, window=(256, 0), dtype="bfloat16", **LONG), "pallas_gpu"),
    ("gpu", Request(bias=True, mask=True, dtype="float16", **SHORT), "cudnn"),
    ("gpu", Request(causal=True, dtype="float32", **LONG), "pallas_gpu"),
    ("gpu", Request(causal=True, window=(256, 0), global_tokens=True, dtype="bfloat16", **LONG),
     "pallas_gpu"),
    ("gpu", Request(causal=True, window=(256, 0), bias=True, dtype="bfloat16", **LONG),
     "pallas_gpu"),
    ("gpu", Request(window=(64, 64), dtype="bfloat16", **LONG), "pallas_gpu"),
    ("gpu", Request(causal=True, dtype="bfloat16", head_dim=72 + 4, **LONG), "pallas_gpu"),
    ("gpu", Request(causal=True, dtype="bfloat16", return_weights=True, **LONG), "dense"),
    # TPU: splash for the static patterns; a bias or mask goes to the portable strategies
    ("tpu", Request(causal=True, dtype="bfloat16", **LONG), "pallas_tpu"),
    ("tpu", Request(causal=True, window=(256, 0), global_tokens=True, key_value_seq_lengths=True,
                    dtype="bfloat16", **LONG), "pallas_tpu"),
    ("tpu", Request(causal=True, window=(256, 0), bias=True, dtype="bfloat16", **LONG), "banded"),
    ("tpu", Request(causal=True, mask=True, dtype="bfloat16", **LONG), "chunked"),
    # CPU: dense up to one chunked key block, banded for a window, chunked otherwise
    ("cpu", Request(causal=True, **SHORT), "dense"),
    ("cpu", Request(causal=True, window=(256, 0), **LONG), "banded"),
    ("cpu", Request(causal=True, window=(256, 0), global_tokens=True, **LONG), "banded"),
    ("cpu", Request(causal=True, bias=True, **LONG), "chunked"),
    ("cpu", Request(causal=True, return_weights=True, **LONG), "dense"),
])
def test_auto_picks_by_the_table(platform, request_, chosen, monkeypatch):
  # the pick is the table's on any machine: as if every library were installed here
  for name, implementation in registry._REGISTRY.items():
    monkeypatch.setitem(registry._REGISTRY, name,
                        dataclasses.replace(implementation, missing_here=None))
  assert registry.choose(request_._replace(platform=platform)).name == chosen


@pytest.mark.parametrize("installed", [True, False])
def test_a_pick_whose_library_is_missing_here_is_refused_not_swapped(installed, monkeypatch):
  """Without cuDNN's library on this machine, "auto" still picks cuDNN for a GPU (and says
  what to install when lowered for one); the other platforms' picks do not change."""
  reason = None if installed else "the cuDNN library is not installed here (pip install …)"
  monkeypatch.setitem(registry._REGISTRY, "cudnn", dataclasses.replace(
      registry.get("cudnn"), missing_here=lambda: reason))
  gpu = Request(causal=True, dtype="bfloat16", platform="gpu", **LONG)
  if installed:
    assert registry.choose(gpu).name == "cudnn"
  else:
    with pytest.raises(registry.ImplementationError,
                       match=r"runs 'cudnn' for this on 'gpu'.*not installed here"):
      registry.choose(gpu)
  choices = registry.plan("auto", gpu, host="cpu")        # traced here: fails only for a GPU
  assert (choices["gpu"].implementation is None) != installed
  for platform in ("cpu", "tpu"):
    assert choices[platform].implementation is registry.choose(gpu._replace(platform=platform))
  # a request cuDNN cannot do goes to its kernel whether or not cuDNN is installed
  window = gpu._replace(window=(256, 0), global_tokens=True)
  assert registry.choose(window).name == "pallas_gpu"


def test_auto_never_picks_an_interpreted_kernel():
  for name in registry.registered():
    implementation = registry.get(name)
    for platform in implementation.interpreted:
      request = Request(causal=True, platform=platform, **LONG)
      assert name not in registry.candidates(request)
      assert registry.choose(request).name != name


@pytest.fixture
def spies(monkeypatch):
  """Every registered implementation wrapped to record its calls, in a registry copy."""
  calls = []
  copy = {}
  for name, implementation in registry._REGISTRY.items():
    def spy(*args, _name=name, _function=implementation.function, **kwargs):
      calls.append(_name)
      return _function(*args, **kwargs)
    copy[name] = dataclasses.replace(implementation, function=spy)
  monkeypatch.setattr(registry, "_REGISTRY", copy)
  return calls


def _inputs(seed, length=300, heads=2, d=8, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal((1, length, heads, d)), dtype) for _ in range(3))


def _custom_calls(text: str) -> set[str]:
  return set(re.findall(r'custom_call @([\w$.]+)', text))


@pytest.mark.slow
def test_the_choice_follows_the_lowering_platform(spies):
  """One trace on this CPU: every platform's choice is staged and each lowering keeps its
  own. A bias with a window leaves splash (no bias) and cuDNN (no window with a bias)."""
  q, k, v = _inputs(0)
  bias = jnp.asarray(np.random.default_rng(1).standard_normal((300, 300)), jnp.float32)
  biased = jax.jit(lambda q: dot_product_attention(q, k, v, bias=bias, is_causal=True,
                                                   window=16)).trace(q)
  assert spies == ["banded", "pallas_gpu"]      # cpu and tpu share banded's branch
  assert "tpu_custom_call" not in _custom_calls(biased.lower(lowering_platforms=("tpu",)).as_text())
  assert "__gpu$xla.gpu.triton" in _custom_calls(
      biased.lower(lowering_platforms=("cuda",)).as_text())
  expected = dot_product_attention(q, k, v, bias=bias, is_causal=True, window=16,
                                   implementation="dense")
  np.testing.assert_allclose(biased.lower().compile()(q), expected, atol=2e-5)

  q, k, v = _inputs(0, d=64)                                # splash takes multiples of 64
  plain = jax.jit(lambda q: dot_product_attention(q, k, v, is_causal=True, window=16)).trace(q)
  assert "tpu_custom_call" in _custom_calls(plain.lower(lowering_platforms=("tpu",)).as_text())
  assert not _custom_calls(plain.lower(lowering_platforms=("cpu",)).as_text())


def test_auto_is_the_default_everywhere(spies):
  q, k, v = _inputs(2)
  dot_product_attention(q, k, v, is_causal=True)
  assert spies == ["chunked"]          # kv_len 300 > 256; run eagerly, only the CPU's branch
  jax.jit(lambda q: dot_product_attention(q, k, v, is_causal=True)).trace(q)
  # traced, every platform's choice: cpu and tpu (splash takes head dims of 64k) chunked
  assert spies[1:] == ["chunked", "pallas_gpu"]
  assert MultiHeadAttention(num_heads=2).implementation == "auto"


@pytest.mark.slow
def test_multi_head_attention_sows_when_it_computes_the_weights(spies):
  """Named "dense", or "auto" with dropout on the weights (dense on every platform)."""
  x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 12, 16)), jnp.float32)
  module = MultiHeadAttention(num_heads=2, dropout_rate=0.5)
  params = module.init(jax.random.key(0), x)["params"]
  out, state = module.apply({"params": params}, x, mutable=["intermediates"])
  assert "intermediates" not in state                        # auto: chosen per platform
  dense = module.clone(implementation="dense")
  _, state = dense.apply({"params": params}, x, mutable=["intermediates"])
  assert state["intermediates"]["attention_weights"][0].shape == (2, 2, 12, 12)
  del spies[:]
  dropped, state = module.apply({"params": params}, x, train=True, mutable=["intermediates"],
                                rngs={"dropout": jax.random.key(1)})
  assert state["intermediates"]["attention_weights"][0].shape == (2, 2, 12, 12)
  assert not np.allclose(dropped, out)
  assert set(spies) == {"dense"}


def _through_xla(monkeypatch):
  """jax.nn's cuDNN path needs a GPU: run the wrapper's call through jax.nn's XLA path."""
  nn_attention = jax.nn.dot_product_attention
  def xla(*args, implementation, **kwargs):
    assert implementation == "cudnn"
    return nn_attention(*args, implementation="xla", **kwargs)
  monkeypatch.setattr(jax.nn, "dot_product_attention", xla)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", [
    dict(is_causal=True),
    dict(is_causal=True, window=5, key_value_seq_lengths=[40, 9]),
    dict(key_value_seq_lengths=[40, 0]),
    dict(is_causal=True, mask=True),
], ids=["causal", "window_lengths", "empty_sequence", "mask"])
def test_the_cudnn_wrapper_translates_our_pattern(pattern, monkeypatch):
  """Rows that see no key (window past the lengths, an empty sequence) are zeros."""
  _through_xla(monkeypatch)
  rng = np.random.default_rng(4)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 40, 4, 8)), jnp.float32) for _ in range(3))
  pattern = dict(pattern)
  if pattern.pop("mask", False):
    pattern["mask"] = jnp.asarray(rng.random((2, 1, 40, 40)) > 0.9)
  if "key_value_seq_lengths" in pattern:
    pattern["key_value_seq_lengths"] = jnp.array(pattern["key_value_seq_lengths"])
  request = Request.of(q, k, v, **pattern)._replace(dtype="bfloat16", platform="gpu")
  assert cudnn.refusals(request) == []
  visibility = Visibility.make(
      pattern.get("is_causal", False), pattern.get("window"), pattern.get("key_value_seq_lengths"))
  out = cudnn.cudnn_attention(q, k, v, scale=8 ** -0.5, bias=None, mask=pattern.get("mask"),
                              visibility=visibility, block_size=None, return_weights=False)
  expected = dot_product_attention(q, k, v, implementation="dense", **pattern)
  np.testing.assert_allclose(out, expected, atol=2e-5)


@pytest.mark.parametrize("request_,reason", [
    (Request(dtype="bfloat16", head_dim=12), "head dim 12"),
    (Request(dtype="bfloat16", head_dim=256), "head dim 256"),
    (Request(dtype="bfloat16", window=(4, 4)), "a two-sided window (4, 4)"),
    (Request(dtype="bfloat16", window=(4, 0), causal=True, bias=True, q_len=8, kv_len=8),
     "a window together with a mask or bias"),
    (Request(dtype="bfloat16", causal=True, q_len=4, kv_len=8), "q_len 4 != kv_len 8"),
    (Request(dtype="bfloat16", bias=True, q_len=7, kv_len=8), "odd lengths (7, 8)"),
    # jax.nn's cuDNN path refuses this one when differentiated, compiled for an H100
    (Request(dtype="bfloat16", q_len=417, kv_len=417), "odd lengths (417, 417)"),
])
def test_cudnn_refuses_what_it_cannot_do_in_words(request_, reason):
  (refusal,) = cudnn.refusals(request_)
  assert reason in refusal
  with pytest.raises(ValueError, match="implementation='cudnn' cannot do this: .*" + reason[:8]):
    registry.check("cudnn", request_._replace(platform="gpu"))
