"""Block-sparse attention: Sparse Transformer's fixed and strided patterns and BigBird.

The patterns against the papers' definitions, written here as dense boolean masks (Child
et al. 2019, section 4.3: A(1) and A(2) of the fixed and strided patterns; Zaheer et al.
2020: window, global and random blocks, with the draws read from the pattern and checked
here); every implementation with the pattern against softmax attention with that mask
and its gradients written out in NumPy (the Pallas kernels in interpret mode, tiny
shapes); the block maps the kernels visit against the mask; what "auto" picks and what
refuses; the TPU and GPU kernels in the programs lowered for those platforms;
MultiHeadAttention's option and its decoding; memory linear in the length."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention import (
    BigBird,
    MultiHeadAttention,
    SparseFixed,
    SparseStrided,
    block_sparse,
    dot_product_attention,
    registry,
)
from research.attention.masks import Visibility

pytestmark = pytest.mark.usefixtures("highest_precision")


# ------------------------------------------------------------------ the papers' definitions

def fixed_mask(q_len, kv_len, l, c, causal):
  """Child et al.: A(1)_i = {j : ⌊j/l⌋ = ⌊i/l⌋}, A(2)_i = {j : j mod l ∈ {l − c, …, l − 1}}."""
  mask = np.zeros((q_len, kv_len), bool)
  for i in range(q_len):
    for j in range(kv_len):
      mask[i, j] = (j // l == i // l) or (j % l in range(l - c, l))
  return mask & np.tri(q_len, kv_len, dtype=bool) if causal else mask


def strided_mask(q_len, kv_len, l, causal):
  """Child et al.: A(1)_i = {max(0, i − l), …, i} (and i … i + l without causality),
  A(2)_i = {j : (i − j) mod l = 0}."""
  mask = np.zeros((q_len, kv_len), bool)
  for i in range(q_len):
    for j in range(kv_len):
      mask[i, j] = abs(i - j) <= l or (i - j) % l == 0
  return mask & np.tri(q_len, kv_len, dtype=bool) if causal else mask


def bigbird_mask(q_len, kv_len, block, w, g, random_blocks, causal):
  """Zaheer et al.: block a sees block c in its window of w blocks, when either is one of
  the g global blocks, or when c is one of a's random blocks; then every position of a sees
  every position of c (within causality)."""
  mask = np.zeros((q_len, kv_len), bool)
  for i in range(q_len):
    for j in range(kv_len):
      a, c = i // block, j // block
      mask[i, j] = abs(a - c) <= (w - 1) // 2 or a < g or c < g or c in random_blocks[a]
  return mask & np.tri(q_len, kv_len, dtype=bool) if causal else mask


def check_draws(pattern: BigBird, q_blocks, k_blocks, causal):
  """BigBird's random blocks: r distinct blocks per non-global query block, outside its
  window and the global blocks (causal: before it), as many as there are otherwise."""
  draws = pattern.draws()
  assert draws.shape == (q_blocks, pattern.random_blocks)
  reach, g = (pattern.window - 1) // 2, pattern.global_blocks
  for a, row in enumerate(draws):
    chosen = [c for c in row if c >= 0]
    candidates = [c for c in range(g, a if causal else k_blocks) if abs(c - a) > reach]
    assert len(set(chosen)) == len(chosen) == (0 if a < g else min(pattern.random_blocks,
                                                                   len(candidates)))
    assert set(chosen) <= set(candidates)
  return [set(c for c in row if c >= 0) for row in draws]


# (pattern, q_len, kv_len, causal, the mask by the definitions above)
def _bigbird_case(pattern, q_len, kv_len, causal):
  bound = pattern.bind(q_len, kv_len, causal)
  q_blocks, k_blocks = -(-q_len // pattern.block), -(-kv_len // pattern.block)
  draws = check_draws(bound, q_blocks, k_blocks, causal)
  return bigbird_mask(q_len, kv_len, pattern.block, pattern.window, pattern.global_blocks,
                      draws, causal)


PATTERNS = {
    "fixed-causal": (SparseFixed(block=8, summary=2), 45, 45, True,
                     lambda: fixed_mask(45, 45, 8, 2, True)),
    "fixed-bidirectional-rectangular": (SparseFixed(block=6, summary=1), 30, 41, False,
                                        lambda: fixed_mask(30, 41, 6, 1, False)),
    "strided-causal": (SparseStrided(stride=5), 40, 40, True,
                       lambda: strided_mask(40, 40, 5, True)),
    "strided-bidirectional": (SparseStrided(stride=7), 38, 38, False,
                              lambda: strided_mask(38, 38, 7, False)),
    "bigbird-bidirectional": (BigBird(block=8, window=3, global_blocks=1, random_blocks=2, seed=3),
                              52, 52, False, None),
    "bigbird-causal": (BigBird(block=8, window=3, global_blocks=1, random_blocks=2, seed=4),
                       56, 56, True, None),
}


def reference_mask(entry):
  """bool [q_len, kv_len] of an entry of PATTERNS, by the definitions."""
  pattern, q_len, kv_len, causal, mask = entry
  return mask() if mask is not None else _bigbird_case(pattern, q_len, kv_len, causal)


@pytest.mark.parametrize("case", PATTERNS)
def test_the_pattern_is_the_papers(case):
  """The rule on every position pair (NumPy, as splash reads it; the implementations below
  evaluate it in JAX)."""
  pattern, q_len, kv_len, causal, _ = PATTERNS[case]
  visibility = Visibility.make(causal, None, sparsity=pattern.bind(q_len, kv_len, causal))
  rule = visibility.pattern_visible(np.arange(q_len)[:, None], np.arange(kv_len)[None, :])
  assert isinstance(rule, np.ndarray)
  np.testing.assert_array_equal(rule, reference_mask(PATTERNS[case]))


def test_bigbird_draws_once_per_seed():
  """The same seed and shape give the same random blocks; another seed others."""
  draws = lambda seed: BigBird(block=4, window=3, global_blocks=1, random_blocks=3,
                               seed=seed).bind(256, 256, False).draws()
  first = draws(0)
  block_sparse._bigbird_draws.cache_clear()      # drawn again, not read from the cache
  np.testing.assert_array_equal(draws(0), first)
  assert (draws(1) != first).any()


@pytest.mark.parametrize("case", PATTERNS)
@pytest.mark.parametrize("tiles", [(8, 8), (16, 4), (7, 10)], ids=str)
def test_block_map_visits_every_visible_block(case, tiles):
  """0 only where no query of the tile sees a key of it, 2 only where all see all; BigBird's
  tiles within its blocks are exact, so the kernels visit only its visible blocks."""
  pattern, q_len, kv_len, causal, _ = PATTERNS[case]
  mask = reference_mask(PATTERNS[case])
  visibility = Visibility.make(causal, None, sparsity=pattern.bind(q_len, kv_len, causal))
  block_map = visibility.block_map(q_len, kv_len, *tiles)
  for a in range(block_map.shape[0]):
    for c in range(block_map.shape[1]):
      tile = mask[a * tiles[0]:(a + 1) * tiles[0], c * tiles[1]:(c + 1) * tiles[1]]
      assert (block_map[a, c] > 0) >= tile.any(), (a, c)
      assert (block_map[a, c] == 2) <= tile.all(), (a, c)
      if isinstance(pattern, BigBird) and tiles == (8, 8):
        assert (block_map[a, c] > 0) == tile.any(), (a, c)


# ------------------------------------------------------------------ every implementation

def _inputs(seed, batch, q_len, kv_len, heads, kv_heads, dim, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  shapes = [(batch, q_len, heads, dim), (batch, kv_len, kv_heads, dim),
            (batch, kv_len, kv_heads, dim), (batch, q_len, heads, dim)]
  return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)


def _value_and_grads(attention, do, *args):
  out, vjp = jax.vjp(attention, *args)
  return (out, *vjp(do.astype(out.dtype)))


def _reference(q, k, v, do, visible, scale, bias):
  """Softmax attention over the visible keys and its gradients, written out in float64
  NumPy (query head h reads kv head h // (H / H_kv)):

    S = scale · q kᵀ + bias (−∞ where not visible),  P = softmax(S),  out = P v
    dv = Pᵀ dout,  dS = P ∘ (dout vᵀ − rowsum(dout ∘ out)),  dq = scale · dS k,
    dk = scale · dSᵀ q

  visible: bool [b|1, H|1, q_len, kv_len], bias like it; a query seeing no key gets
  out = 0 and no gradient. Returns out, dq, dk, dv in the layouts of q, k, v."""
  q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)        # [b, kv, H, d]
  s = np.where(visible, scale * np.einsum("bqhd,bkhd->bhqk", q, k) + bias, -np.inf)
  top = s.max(-1, keepdims=True)
  p = np.exp(s - np.where(np.isfinite(top), top, 0))
  p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)                    # empty rows stay 0
  out = np.einsum("bhqk,bkhd->bqhd", p, v)
  dv = np.einsum("bhqk,bqhd->bkhd", p, do)
  ds = p * (np.einsum("bqhd,bkhd->bhqk", do, v)
            - np.einsum("bqhd,bqhd->bhq", do, out)[..., None])
  dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, k)
  dk = scale * np.einsum("bhqk,bqhd->bkhd", ds, q)
  fold = lambda x: x.reshape(*x.shape[:2], -1, group, x.shape[-1]).sum(3)  # back to H_kv
  return out, dq, fold(dk), fold(dv)


def _check(names, entry, *, lengths=None, heads=(4, 2), dim=8, block_size=16,
           mask_and_bias=False):
  """Each implementation of `names` with the pattern of `entry` (of PATTERNS), GQA, key
  lengths, a random mask [b, 1, q, k] and bias [1, H, q, k] if asked, against `_reference`:
  outputs and gradients, all in one compiled program."""
  pattern, q_len, kv_len, causal, _ = entry
  batch = 1 if lengths is None else len(lengths)
  q, k, v, do = _inputs(0, batch, q_len, kv_len, *heads, dim)
  visible = reference_mask(entry)[None, None]
  if lengths is not None:
    visible = visible & (np.arange(kv_len) < np.asarray(lengths)[:, None])[:, None, None]
  rng, mask, bias = np.random.default_rng(1), None, np.zeros((1, 1, 1, 1))
  if mask_and_bias:
    mask = rng.random((batch, 1, q_len, kv_len)) < 0.8
    bias = rng.standard_normal((1, heads[0], q_len, kv_len))
    visible = visible & mask
  options = dict(is_causal=causal, sparsity=pattern, scale=0.3, block_size=block_size,
                 key_value_seq_lengths=None if lengths is None else jnp.asarray(lengths),
                 mask=None if mask is None else jnp.asarray(mask),
                 bias=jnp.asarray(bias, jnp.float32) if mask_and_bias else None)
  got = jax.jit(lambda *a: [_value_and_grads(
      lambda *a, name=name: dot_product_attention(*a, implementation=name, **options), do, *a)
      for name in names])(q, k, v)
  want = _reference(q, k, v, do, visible, 0.3, bias)
  for name, values in zip(names, got):
    for what, g, w in zip(("out", "dq", "dk", "dv"), values, want):
      np.testing.assert_allclose(g, w, rtol=0, err_msg=f"{name} {what}",
                                 atol=1e-5 * np.abs(w).max())


@pytest.mark.slow
@pytest.mark.parametrize("case, lengths, names", [
    ("fixed-causal", None, ("chunked", "banded")),
    ("strided-bidirectional", (38, 3), ("dense", "chunked")),   # rows seeing no key: zeros
    ("bigbird-causal", (56, 21), ("chunked", "banded")),        # banded: global rows apart
], ids=lambda x: x if isinstance(x, str) else "")
def test_strategies_equal_softmax_with_the_mask(case, lengths, names):
  """With a mask and bias too where the pattern is BigBird (banded gathers their tiles)."""
  _check(names, PATTERNS[case], lengths=lengths, mask_and_bias=case.startswith("bigbird"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fixed-causal", "bigbird-bidirectional"])
def test_pallas_gpu_interpreted(case):
  """Our Triton kernel in Pallas' interpreter, tiles of 16 (BigBird's tiles lie within its
  blocks, at least 16 long: here 16), key lengths. (The strided rule in the kernel: its
  lowering below.)"""
  entry = PATTERNS[case]
  if case.startswith("bigbird"):
    entry = (BigBird(block=16, window=3, global_blocks=1, random_blocks=1, seed=5), 64, 64,
             False, None)
  _check(("pallas_gpu",), entry, lengths=(entry[2], 30), heads=(2, 1))


@pytest.mark.slow
def test_pallas_tpu_interpreted():
  """Splash in Pallas' interpreter: BigBird with blocks of 64 in tiles of 128 (partial
  tiles read from the distinct blocks splash keeps), causal, key lengths."""
  entry = (BigBird(block=64, window=1, global_blocks=1, random_blocks=1, seed=2), 256, 256,
           True, None)
  _check(("pallas_tpu",), entry, lengths=(256, 100), heads=(2, 1), dim=64, block_size=128)


# ------------------------------------------------------------------ choosing and refusing

def test_who_does_it_and_who_refuses():
  q = jnp.zeros((1, 64, 2, 16))
  pattern = BigBird(block=8, window=3, global_blocks=1, random_blocks=1)
  request = registry.Request.of(q, q, q, sparsity=pattern)
  assert registry.supporting(request) == ["dense", "chunked", "banded"]  # cpu, natively
  assert "block-sparse pattern (BigBird)" in " ".join(
      registry.get("cudnn").unsupported(request._replace(platform="gpu", dtype="bfloat16")))
  refusal = registry.get("pallas_gpu").unsupported(request._replace(platform="gpu"))
  assert any("blocks of 8" in r for r in refusal)
  assert not registry.get("pallas_gpu").unsupported(
      request._replace(platform="gpu", sparsity=SparseFixed(block=8)))
  long = jax.ShapeDtypeStruct((1, 4096, 2, 64), jnp.float32)   # on a CPU, "auto" takes
  choose = lambda pattern: registry.choose(registry.Request.of(       # banded for few blocks
      long, long, long, is_causal=True, sparsity=pattern.bind(4096, 4096, True))).name
  assert choose(BigBird(block=64, window=3, global_blocks=2, random_blocks=3)) == "banded"
  assert choose(SparseFixed(block=64, summary=8)) == "chunked"   # summaries in every block
  with pytest.raises(ValueError, match="cannot do this: a block-sparse pattern"):
    dot_product_attention(q, q, q, sparsity=pattern, implementation="cudnn")
  with pytest.raises(ValueError, match="pass no window and no global_tokens"):
    dot_product_attention(q, q, q, sparsity=pattern, window=4)
  with pytest.raises(ValueError, match="sparsity must be None or a block-sparse pattern"):
    dot_product_attention(q, q, q, sparsity="bigbird")


@pytest.mark.parametrize("make, match", [
    (lambda: SparseFixed(block=4, summary=5), "summary .5. must be at most block"),
    (lambda: SparseStrided(stride=0), "stride must be an int >= 1"),
    (lambda: BigBird(window=2), "window must be an odd number"),
    (lambda: BigBird(random_blocks=-1), "random_blocks must be an int >= 0"),
    (lambda: BigBird().table(), "bind"),
])
def test_bad_patterns_are_named(make, match):
  with pytest.raises(ValueError, match=match):
    make()


# ------------------------------------------------------------------ lowering for accelerators

TPU, TRITON, CUDNN = "tpu_custom_call", "__gpu$xla.gpu.triton", "__cudnn$fmha"


@pytest.mark.parametrize("pattern", [BigBird(block=64, window=3, global_blocks=1, random_blocks=1),
                                     SparseStrided(stride=48)], ids=["bigbird", "strided"])
def test_auto_lowers_to_splash_and_triton(pattern):
  """"auto" lowered from this CPU: splash's Mosaic kernels for a TPU, our Triton kernels for
  an NVIDIA GPU (cuDNN cannot do the pattern), forward and gradient."""
  q, k, v, _ = _inputs(1, 2, 256, 256, 2, 2, 64, jnp.bfloat16)
  attention = lambda q: dot_product_attention(q, k, v, is_causal=True, sparsity=pattern)
  for traced in (jax.jit(attention).trace(q),
                 jax.jit(jax.grad(lambda q: attention(q).astype(jnp.float32).sum())).trace(q)):
    kernels = {p: " ".join(set(re.findall(r"custom_call @([\w$.]+)",
                                          traced.lower(lowering_platforms=(p,)).as_text())))
               for p in ("tpu", "cuda", "cpu")}
    assert TPU in kernels["tpu"] and TRITON in kernels["cuda"], kernels
    assert CUDNN not in kernels["cuda"] and not any(x in kernels["cpu"] for x in (TPU, TRITON))


# ------------------------------------------------------------------ the module, memory

@pytest.mark.slow
def test_multi_head_attention_takes_the_pattern_and_decodes_it():
  """MultiHeadAttention(sparsity=...) equals the same module with the pattern's dense mask,
  and decoding token by token equals its causal pass."""
  pattern = BigBird(block=4, window=3, global_blocks=1, random_blocks=1, seed=7)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 24, 16)), jnp.float32)
  sparse = MultiHeadAttention(num_heads=2, sparsity=pattern)
  params = jax.jit(sparse.init)(jax.random.key(0), x)
  draws = check_draws(pattern.bind(24, 24, True), 6, 6, True)
  mask = bigbird_mask(24, 24, 4, 3, 1, draws, True)
  full = jax.jit(lambda x: sparse.apply(params, x, is_causal=True))(x)
  masked = jax.jit(lambda x: MultiHeadAttention(num_heads=2).apply(params, x, mask=mask))(x)
  np.testing.assert_allclose(full, masked, atol=1e-5)
  decoder = MultiHeadAttention(num_heads=2, sparsity=pattern, decode=True)
  step = jax.jit(lambda cache, x: decoder.apply({**params, "cache": cache}, x, mutable=["cache"]))
  cache, steps = jax.jit(decoder.init)(jax.random.key(0), x)["cache"], []
  for t in range(0, 24, 3):     # three tokens a step: across block boundaries
    out, state = step(cache, x[:, t:t + 3])
    cache = state["cache"]
    steps.append(out)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.slow
def test_memory_grows_linearly():
  """XLA's temporary memory for the gradient of BigBird attention with banded (what "auto"
  runs on a CPU beyond 256 keys): at 4× the length at most 5× (O(n), no [n, n] mask or
  weights), far below one [n, n] float32 array. (chunked is O(n) whatever the pattern: its
  blocks are a loop.)"""
  pattern = BigBird(block=32, window=3, global_blocks=1, random_blocks=1)

  def temp_bytes(length):
    q = jax.ShapeDtypeStruct((1, length, 1, 32), jnp.float32)
    loss = lambda q, k, v: dot_product_attention(q, k, v, sparsity=pattern, block_size=32,
                                                 implementation="banded").sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  short, long = temp_bytes(256), temp_bytes(1024)
  assert long <= 5 * short, (short, long)
  assert long < 1024 * 1024 * 4 / 4, long
