"""`pallas_tpu` (splash attention) against jax.nn.dot_product_attention with a mask built here in
NumPy from the rule of `masks.Visibility`: outputs and gradients, float32 and bfloat16, in
Pallas' interpreter on a CPU or GPU (tiles of 128, so lengths of a few hundred); its block
information against its own mask function; its lowering for a TPU (Mosaic kernels, not an
interpreted loop); and a native run on a TPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiers import long_cases

from research.attention import dot_product_attention, registry
from research.attention.kernels import pallas_tpu
from research.attention.masks import Visibility

# Compared with jax.nn within 1e-5: full float32 products, not TF32 / bf16 passes.
# Interpret mode is slow: marked slow, so the suite starts these first.
pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.slow]


def _visible(q_len, kv_len, *, causal=False, window=None, global_tokens=(), lengths=None,
             batch=1):
  """bool [batch, q_len, kv_len]: j < length and (not causal or j ≤ i) and
  (−left ≤ j − i ≤ right or i ∈ G or j ∈ G), window = (left, right) with None unbounded."""
  left, right = (None, None) if window is None else window
  i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  seen = np.ones((q_len, kv_len), bool)
  if left is not None:
    seen &= j - i >= -left
  if right is not None and not causal:
    seen &= j - i <= right
  seen |= np.isin(i, global_tokens) | np.isin(j, global_tokens)
  if causal:
    seen &= j <= i
  lengths = np.full(batch, kv_len) if lengths is None else np.asarray(lengths)
  return seen[None] & (j[None] < lengths[:, None, None])


def _pair(window):
  """dot_product_attention's window argument as (left, right), or None."""
  return (window, window) if isinstance(window, int) else window


def _inputs(seed, batch, q_len, kv_len, heads, kv_heads, dim, dtype):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((batch, q_len, heads, dim))
  k, v = rng.standard_normal((2, batch, kv_len, kv_heads, dim))
  do = rng.standard_normal((batch, q_len, heads, dim))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v, do))


def _value_and_grads(attention, q, k, v, do):
  """attention(q, k, v) and the gradients of ⟨attention(q, k, v), do⟩ w.r.t. q, k, v."""
  out, vjp = jax.vjp(attention, q, k, v)
  return (out, *vjp(do.astype(out.dtype)))


def _reference(q, k, v, visible, scale):
  """jax.nn in float32 with our mask; a query seeing no key returns zeros."""
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  out = jax.nn.dot_product_attention(q, k, v, mask=visible[:, None], scale=scale,
                                     implementation="xla")
  return jnp.where(visible.any(-1)[:, :, None, None], out, 0)


# q_len, kv_len, heads, kv_heads, pattern (dot_product_attention's arguments), block_size.
# "queries beyond the keys": a tile of queries that sees no tile of keys (NaN in splash) and
# a sequence of no keys at all.
CASES = {
    "odd lengths, GQA": (200, 137, 4, 2, dict(), None),
    "causal window": (300, 300, 2, 2, dict(is_causal=True, window=40), 128),
    "window, global tokens, lengths": (
        260, 260, 2, 1, dict(window=(24, 8), global_tokens=(0, 5, 6, 7, 200),
                             key_value_seq_lengths=(260, 150)), 128),
    "queries beyond the keys": (
        384, 100, 2, 2, dict(is_causal=True, window=20, key_value_seq_lengths=(100, 0)), 128),
}


# Every case in float32; the richest in bfloat16 (the interpreted kernels are slow to compile).
PARAMS = [(case, jnp.float32) for case in CASES] + [
    ("window, global tokens, lengths", jnp.bfloat16)]
LONG = {(case, jnp.float32) for case in (   # the long tier's: the suite keeps the other two
    "odd lengths, GQA", "window, global tokens, lengths", "queries beyond the keys")}


@pytest.mark.parametrize("case, dtype", long_cases(PARAMS, LONG),
                         ids=[f"{c}-{jnp.dtype(d).name}" for c, d in PARAMS])
def test_matches_jax_nn(case, dtype):
  q_len, kv_len, heads, kv_heads, pattern, block_size = CASES[case]
  lengths = pattern.get("key_value_seq_lengths")
  batch = 1 if lengths is None else len(lengths)
  q, k, v, do = _inputs(0, batch, q_len, kv_len, heads, kv_heads, 64, dtype)
  pattern = dict(pattern, key_value_seq_lengths=None if lengths is None else jnp.array(lengths))
  visible = _visible(q_len, kv_len, causal=pattern.get("is_causal", False),
                     window=_pair(pattern.get("window")),
                     global_tokens=pattern.get("global_tokens", ()), lengths=lengths,
                     batch=batch)
  scale = 0.3
  got = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v: dot_product_attention(q, k, v, implementation="pallas_tpu", scale=scale,
                                            block_size=block_size, **pattern), *a))(q, k, v, do)
  want = _value_and_grads(lambda q, k, v: _reference(q, k, v, jnp.asarray(visible), scale),
                          q, k, v, do)
  assert got[0].dtype == dtype
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    assert np.isfinite(np.asarray(g, np.float32)).all(), name
    np.testing.assert_allclose(np.asarray(g, np.float32), w, err_msg=name,
                               atol=tolerance * float(jnp.abs(w).max()), rtol=0)
  if lengths is not None and 0 in lengths:  # a sequence of no keys: zeros, no gradient
    b = lengths.index(0)
    for g in got:
      assert not np.asarray(g[b], np.float32).any()


@pytest.mark.parametrize("pattern", [
    Visibility.make(True, 100, None, (0, 1, 2, 300, 301, 555)),
    Visibility.make(False, (64, 200), None, (7, 450)),
    Visibility(left=None, right=30),
    Visibility.make(True, None, None, (3,)),
], ids=["causal window, globals", "two-sided window, globals", "right only", "causal"])
def test_tiles_agree_with_mask_function(pattern):
  """The shortcut for whole tiles (splash's block information) against the elementwise rule
  the kernel evaluates, on every tile of a padded grid with padded keys."""
  mask = pallas_tpu.splash_mask(pattern, (640, 768), kv_len=700)
  rows, cols = np.arange(640)[:, None], np.arange(768)[None, :]
  whole = np.broadcast_to(mask.visible(rows, cols), (640, 768))
  assert not whole[:, 700:].any()  # padded keys
  reference = _visible(640, 700, causal=pattern.causal, window=(pattern.left, pattern.right),
                       global_tokens=pattern.global_tokens)[0]
  np.testing.assert_array_equal(whole[:, :700], reference)
  for q0 in range(0, 640, 128):
    for k0 in range(0, 768, 128):
      tile = mask[q0:q0 + 128, k0:k0 + 128]
      np.testing.assert_array_equal(tile, whole[q0:q0 + 128, k0:k0 + 128], f"tile {q0, k0}")


def test_refusals_and_block_size():
  request = registry.Request(head_dim=48, platform="cpu", window=(8, 0), causal=True)
  assert any("head dim 48" in r for r in registry.get("pallas_tpu").unsupported(request))
  assert not registry.get("pallas_tpu").unsupported(request._replace(head_dim=128))
  assert registry.get("pallas_tpu").unsupported(request._replace(head_dim=128, bias=True))
  q = jnp.zeros((1, 128, 1, 64))
  with pytest.raises(ValueError, match="multiple of 128"):
    dot_product_attention(q, q, q, implementation="pallas_tpu", block_size=96)


def test_lowers_to_mosaic_kernels_for_tpu():
  """On this machine, lowered for a TPU with the interpreter off: the forward and its
  gradient are splash's Mosaic kernels (tpu_custom_call), not an interpreted loop."""
  q, k, v, do = _inputs(1, 2, 256, 256, 4, 2, 128, jnp.bfloat16)
  visibility = Visibility.make(True, 64, jnp.array([256, 200]), (0, 1))

  def attention(q, k, v):
    return pallas_tpu.pallas_tpu_attention(q, k, v, scale=0.1, bias=None, mask=None,
                                           visibility=visibility, block_size=128,
                                           return_weights=False, interpret=False)

  forward = jax.jit(attention).trace(q, k, v)
  gradient = jax.jit(lambda *a: _value_and_grads(attention, *a)).trace(q, k, v, do)
  for traced, kernels in [(forward, {"fwd"}), (gradient, {"fwd", "dq", "dkv"})]:
    text = traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text
    assert set(re.findall(r"splash_mha_(fwd|dq|dkv)_segmented", text)) == kernels
    assert "stablehlo.while" not in text


@pytest.mark.tpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_native_tpu(dtype):
  """Mosaic-compiled on a TPU at a moderate size: GQA, a causal window with global tokens
  and key lengths, default tiles (512), an odd length."""
  q_len, lengths, tokens = 2000, (2000, 1234), (0, 1, 2, 3, 999)
  q, k, v, do = _inputs(2, 2, q_len, q_len, 8, 2, 128, dtype)
  visible = _visible(q_len, q_len, causal=True, window=(256, 0), global_tokens=tokens,
                     lengths=lengths, batch=2)
  got = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v: dot_product_attention(
          q, k, v, implementation="pallas_tpu", is_causal=True, window=256,
          global_tokens=tokens, key_value_seq_lengths=jnp.array(lengths)), *a))(q, k, v, do)
  want = jax.jit(lambda *a: _value_and_grads(
      lambda q, k, v: _reference(q, k, v, jnp.asarray(visible), 128 ** -0.5), *a))(q, k, v, do)
  # Mosaic's float32 products may take bfloat16 passes: splash's own TPU tests allow 3e-3 on
  # the output and 5e-2 on dq, dk.
  tolerance = 2e-2
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), w, err_msg=name,
                               atol=tolerance * float(jnp.abs(w).max()), rtol=0)
