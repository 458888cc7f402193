"""`pallas_gpu` (our Triton flash attention) against jax.nn.dot_product_attention with a mask
built here in NumPy from the rule of `masks.Visibility`, and against our dense
implementation through the dispatcher: outputs and gradients (q, k, v, bias), float32 and
bfloat16, in Pallas' interpreter on the CPU (tiles of 16, lengths below 50); its visit
lists; its lowering for an NVIDIA GPU (Triton kernels, not an interpreted loop); and a
native run on a GPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention import dot_product_attention, registry
from research.attention.kernels import pallas_gpu
from research.attention.masks import Visibility

# Compared with jax.nn within 1e-5: full float32 products, not TF32 passes.
# Interpret mode is slow: marked slow, so the suite starts these first.
pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.slow]


def _visible(q_len, kv_len, *, causal=False, window=None, global_tokens=(), lengths=None,
             batch=1):
  """bool [batch, 1, q_len, kv_len]: j < length and (not causal or j ≤ i) and
  (−left ≤ j − i ≤ right or i ∈ G or j ∈ G), window = (left, right)."""
  i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  seen = np.ones((q_len, kv_len), bool)
  if window is not None:
    seen &= (j - i >= -window[0]) & (j - i <= window[1])
  seen |= np.isin(i, global_tokens) | np.isin(j, global_tokens)
  if causal:
    seen &= j <= i
  lengths = np.full(batch, kv_len) if lengths is None else np.asarray(lengths)
  return (seen[None] & (j[None] < lengths[:, None, None]))[:, None]


def _inputs(seed, batch, q_len, kv_len, heads, kv_heads, dim, dtype=jnp.float32, dim_v=None):
  """q, k, v and an output cotangent do, standard normal (v's head dim: dim_v or dim)."""
  rng = np.random.default_rng(seed)
  dim_v = dim if dim_v is None else dim_v
  shapes = [(batch, q_len, heads, dim), (batch, kv_len, kv_heads, dim),
            (batch, kv_len, kv_heads, dim_v), (batch, q_len, heads, dim_v)]
  return tuple(jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes)


def _value_and_grads(attention, do, *args):
  """attention(*args) and the gradients of ⟨attention(*args), do⟩ w.r.t. every arg."""
  out, vjp = jax.vjp(attention, *args)
  return (out, *vjp(do.astype(out.dtype)))


def _reference(q, k, v, bias, visible, scale):
  """In float32: jax.nn with the mask built here, a query seeing no key returning zeros; our
  dense implementation when v's head dim is not q's (jax.nn does not take that)."""
  q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
  bias = None if bias is None else jnp.asarray(bias, jnp.float32)
  if v.shape[-1] != q.shape[-1]:
    return dot_product_attention(q, k, v, bias=bias, mask=visible, scale=scale,
                                 implementation="dense")
  out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=visible, scale=scale,
                                     implementation="xla")
  seeing = jnp.moveaxis(jnp.asarray(visible).any(-1), 1, 2)[..., None]  # [b, q_len, H|1, 1]
  return jnp.where(seeing, out, 0.0)


def _ours(visibility, mask=None, block_size=16, interpret=True, **kwargs):
  """pallas_gpu_attention(q, k, v, bias) with the rest fixed (interpreted on the CPU)."""
  return lambda q, k, v, bias: pallas_gpu.pallas_gpu_attention(
      q, k, v, bias=bias, mask=mask, visibility=visibility, block_size=block_size,
      return_weights=False, interpret=interpret, **kwargs)


# Each case: shapes (batch, q_len, kv_len, H, H_kv, d) (and v's d_v), the pattern, the shape
# of a random mask / bias ((batch | 1, H | 1) followed by q_len, kv_len, or all four axes).
# All but one have a length that is not a multiple of the tile (16): padded tiles.
CASES = {
    "full-gqa": dict(shape=(2, 37, 45, 4, 2, 12)),
    "causal-mqa-lengths": dict(shape=(2, 40, 40, 4, 1, 8), causal=True, lengths=(40, 23)),
    "causal-window-global": dict(shape=(1, 48, 48, 2, 2, 16), causal=True, window=(8, 0),
                                 global_tokens=(0, 17), lengths=(41,)),
    "two-sided-window-empty-rows": dict(shape=(2, 33, 47, 2, 2, 8), window=(5, 5),
                                        lengths=(47, 10)),
    "mask-and-bias": dict(shape=(2, 35, 29, 4, 2, 8), causal=True, mask=(2, 1), bias=(2, 4)),
    "broadcast-bias-window": dict(shape=(1, 41, 41, 4, 2, 8), window=(6, 3), global_tokens=(20,),
                                  bias=(1, 4, 1, 41)),
    "decode-empty-length-dv": dict(shape=(2, 1, 30, 2, 1, 12), dim_v=20, lengths=(0, 7)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(case):
  """Output and gradients (q, k, v, bias) in float32 within 2e-5 of `_reference`; queries
  that see no key get zeros and zero gradients."""
  batch, q_len, kv_len, heads, kv_heads, dim = case["shape"]
  q, k, v, do = _inputs(0, batch, q_len, kv_len, heads, kv_heads, dim, dim_v=case.get("dim_v"))
  causal, window = case.get("causal", False), case.get("window")
  tokens = case.get("global_tokens", ())
  lengths = case.get("lengths")
  visible = _visible(q_len, kv_len, causal=causal, window=window, global_tokens=tokens,
                     lengths=lengths, batch=batch)
  rng = np.random.default_rng(1)
  full = lambda shape: shape + (q_len, kv_len) if len(shape) == 2 else shape
  mask = jnp.asarray(rng.random(full(case["mask"])) > 0.3) if "mask" in case else None
  bias = None
  if "bias" in case:
    bias = jnp.asarray(rng.standard_normal(full(case["bias"])), jnp.float32)
  visibility = Visibility.make(causal, window, None if lengths is None else jnp.array(lengths),
                               tokens)
  scale = dim ** -0.5
  got = jax.jit(lambda *a: _value_and_grads(_ours(visibility, mask, scale=scale), do, *a))(
      q, k, v, bias)
  visible = visible if mask is None else visible & np.asarray(mask)
  want = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v, bias: _reference(q, k, v, bias, visible, scale), do, *a))(q, k, v, bias)
  names = ("out", "dq", "dk", "dv", "dbias")
  for name, g, w in zip(names, got, want):
    if w is not None:
      np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=name)
  empty = ~visible.any(-1)  # [b, H|1, q_len]
  if empty.any():  # queries that see nothing: zeros and zero gradients, no NaN
    rows = np.moveaxis(np.broadcast_to(empty, (batch, heads, q_len)), 1, 2)
    assert np.all(np.asarray(got[0])[rows] == 0) and np.all(np.asarray(got[1])[rows] == 0)
    assert all(np.isfinite(np.asarray(g)).all() for g in got if g is not None)


def test_bfloat16_matches_float32():
  """bfloat16 in, products in bfloat16, float32 accumulation: within bfloat16 rounding of
  the float32 reference on the same (rounded) inputs; GQA, a causal window with global
  tokens and key lengths, a bias."""
  batch, q_len, heads, kv_heads, dim = 2, 45, 4, 2, 16
  q, k, v, do = _inputs(2, batch, q_len, q_len, heads, kv_heads, dim, jnp.bfloat16)
  bias = jnp.asarray(np.random.default_rng(3).standard_normal((1, heads, q_len, q_len)),
                     jnp.bfloat16)
  visible = _visible(q_len, q_len, causal=True, window=(12, 0), global_tokens=(1,),
                     lengths=(45, 30), batch=batch)
  visibility = Visibility.make(True, 12, jnp.array([45, 30]), (1,))
  got = jax.jit(lambda *a: _value_and_grads(_ours(visibility, scale=0.25), do, *a))(q, k, v, bias)
  want = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v, bias: _reference(q, k, v, bias, visible, 0.25), do, *a))(q, k, v, bias)
  assert got[0].dtype == jnp.bfloat16
  for name, g, w in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), w, err_msg=name, rtol=0,
                               atol=2e-2 * float(jnp.abs(w).max()))


def test_through_the_dispatcher_matches_dense():
  """dot_product_attention(implementation="pallas_gpu") against "dense": float16, a window
  with global tokens, key lengths, a bias broadcast over the batch, head dim 24 (padded to
  32), the default tiles."""
  batch, q_len, heads, dim = 2, 39, 2, 24
  q, k, v, do = _inputs(4, batch, q_len, q_len, heads, heads, dim, jnp.float16)
  bias = jnp.asarray(np.random.default_rng(5).standard_normal((1, heads, q_len, q_len)),
                     jnp.float16)
  options = dict(window=(4, 9), global_tokens=[30], key_value_seq_lengths=jnp.array([39, 33]))

  def attention(implementation):
    return lambda q, k, v, bias: dot_product_attention(
        q, k, v, bias=bias, implementation=implementation, **options)

  f32 = lambda x: x.astype(jnp.float32)
  got = jax.jit(lambda *a: _value_and_grads(attention("pallas_gpu"), do, *a))(q, k, v, bias)
  want = jax.jit(lambda *a: _value_and_grads(attention("dense"), do, *a))(
      f32(q), f32(k), f32(v), f32(bias))
  for name, g, w in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
    assert g.dtype == jnp.float16, name
    np.testing.assert_allclose(f32(g), w, err_msg=name, rtol=0,
                               atol=5e-3 * float(jnp.abs(w).max()))


def test_visit_lists():
  """The tables the kernels loop over: exactly the visible tile pairs, partial ones first,
  the transposed lists the same pairs; a window's cost grows with w, not L."""
  pattern = Visibility.make(True, 40, None, (70,))
  block_map = pattern.block_map(200, 200, 16, 32)
  visits, counts = pallas_gpu.visit_lists(pattern, (200, 200), (224, 256), (16, 32), False)
  assert visits.shape[0] == counts.shape[0] == 14  # 224 / 16 query tiles, the last all padding
  assert tuple(counts[-1]) == (0, 0)
  pairs = set()
  for i, (row, (partial, every)) in enumerate(zip(visits[:-1], counts)):
    listed = row[:every]
    assert list(block_map[i, listed]) == [1] * partial + [2] * (every - partial)
    pairs |= {(i, j) for j in listed}
  assert pairs == set(zip(*np.nonzero(block_map)))
  visits, counts = pallas_gpu.visit_lists(pattern, (200, 200), (224, 256), (16, 32), True)
  assert counts.shape[0] == 8 and tuple(counts[-1]) == (0, 0)  # 256 / 32 key tiles
  assert {(i, j) for j, row in enumerate(visits) for i in row[:counts[j, 1]]} == pairs
  window = Visibility.make(False, 64)
  _, counts = pallas_gpu.visit_lists(window, (4096, 4096), (4096, 4096), (64, 64), False)
  assert counts[:, 1].max() == 3  # the diagonal tile and one on each side


def test_registration_and_refusals():
  """Registered with its capabilities, interpreted on the CPU; refuses head dims above 256
  and block sizes Triton cannot tile."""
  impl = registry.get("pallas_gpu")
  request = registry.Request(mask=True, bias=True, window=(8, 8), global_tokens=True,
                                    key_value_seq_lengths=True, gqa=True, dtype="float16",
                                    platform="gpu", head_dim=256)
  assert not impl.unsupported(request)
  assert any("head dim 512" in r for r in impl.unsupported(request._replace(head_dim=512)))
  assert "cpu" in impl.interpreted
  q = jnp.zeros((1, 32, 1, 16))
  with pytest.raises(ValueError, match="power of two"):
    dot_product_attention(q, q, q, implementation="pallas_gpu", block_size=24)


def test_lowers_to_triton_kernels_for_gpu():
  """On this machine, lowered for an NVIDIA GPU with the interpreter off: the forward is one
  Triton kernel and the gradient three (forward, dq, dkv), not an interpreted loop."""
  q, k, v, do = _inputs(1, 2, 200, 300, 4, 2, 80, jnp.bfloat16)
  bias = jnp.zeros((1, 4, 200, 300), jnp.bfloat16)
  mask = jnp.ones((2, 1, 200, 300), bool)
  visibility = Visibility.make(True, 64, jnp.array([300, 123]), (0, 5))
  attention = _ours(visibility, mask, block_size=None, scale=0.1, interpret=False)
  forward = jax.jit(attention).trace(q, k, v, bias)
  gradient = jax.jit(lambda *a: _value_and_grads(attention, do, *a)).trace(q, k, v, bias)
  for traced, kernels in [(forward, {"forward"}), (gradient, {"forward", "dq", "dkv"})]:
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == len(kernels)
    assert set(re.findall(r"pallas_gpu_(forward|dq|dkv)", text)) == kernels
    assert "stablehlo.while" not in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_native_gpu(dtype):
  """Triton-compiled on a GPU at a moderate size: GQA, a causal window with global tokens
  and key lengths, a bias, default tiles, an odd length, head dim 64."""
  batch, q_len, heads, kv_heads, dim = 2, 1000, 8, 2, 64
  q, k, v, do = _inputs(6, batch, q_len, q_len, heads, kv_heads, dim, dtype)
  bias = jnp.asarray(np.random.default_rng(7).standard_normal((1, heads, q_len, q_len)), dtype)
  options = dict(is_causal=True, window=200, global_tokens=[0, 1, 500],
                 key_value_seq_lengths=jnp.array([1000, 777]))
  attention = lambda name: lambda q, k, v, bias: dot_product_attention(
      q, k, v, bias=bias, implementation=name, **options)
  got = jax.jit(lambda *a: _value_and_grads(attention("pallas_gpu"), do, *a))(q, k, v, bias)
  f32 = lambda x: x.astype(jnp.float32)
  want = jax.jit(lambda *a: _value_and_grads(attention("dense"), do, *a))(
      f32(q), f32(k), f32(v), f32(bias))
  tolerance = 1e-4 if dtype == jnp.float32 else 2e-2
  for name, g, w in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
    np.testing.assert_allclose(f32(g), w, err_msg=name, rtol=0,
                               atol=tolerance * float(jnp.abs(w).max()))
