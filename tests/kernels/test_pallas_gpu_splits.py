"""`pallas_gpu`'s long visit-list rows split over several programs (`split_visits`) and its
d = 128 tiling: the slices' tables against the rows they cut; outputs and gradients of
window + global tokens and BigBird, split and not, against jax.nn.dot_product_attention
with a mask built here in NumPy, or our dense implementation (BigBird's random blocks),
float32 and bfloat16, in Pallas' interpreter on the CPU (tiles of 16, lengths below 200);
the tilings against each other; their lowering and compiling for an NVIDIA GPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiers import long_cases

from research.attention import dot_product_attention
from research.attention.block_sparse import BigBird
from research.attention.kernels import pallas_gpu, split_visits
from research.attention.kernels.gpu_tiles import Tiles, Tiling, tiles_for
from research.attention.masks import Visibility, visit_lists
from research.errors import ConfigError

# A window (3 back) with global tokens in the first tile, and BigBird on blocks of one tile
# (a window of one block, one global and one random block): a global row's tile visits every
# key tile, the others 2 to 3, so the global rows and columns are long (> 3 × the median).
WINDOW, GLOBAL = (3, 0), (0, 5)
BIGBIRD = BigBird(block=16, window=1, global_blocks=1, random_blocks=1, seed=3)


def _pattern(kind: str, causal: bool, length: int) -> tuple[Visibility, dict]:
  """(the Visibility pallas_gpu takes, the same as dot_product_attention's options)."""
  if kind == "global":
    return (Visibility.make(causal, WINDOW, None, GLOBAL),
            dict(is_causal=causal, window=WINDOW, global_tokens=GLOBAL))
  return (Visibility.make(causal, None, None, (), BIGBIRD.bind(length, length, causal)),
          dict(is_causal=causal, sparsity=BIGBIRD))


def _numpy_mask(length: int, causal: bool) -> np.ndarray:
  """bool [1, 1, L, L] of the window + global tokens rule, written here:
  (−3 ≤ j − i ≤ 0 or i ∈ G or j ∈ G) and (not causal or j ≤ i)."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  seen = (j - i >= -WINDOW[0]) & (j - i <= WINDOW[1]) | np.isin(i, GLOBAL) | np.isin(j, GLOBAL)
  return (seen & (j <= i) if causal else seen)[None, None]


def _inputs(seed, length, heads, kv_heads, dim, dtype):
  """q, k, v, an output cotangent and a bias [1, H, L, L], standard normal."""
  rng = np.random.default_rng(seed)
  shapes = [(1, length, heads, dim), (1, length, kv_heads, dim), (1, length, kv_heads, dim),
            (1, length, heads, dim), (1, heads, length, length)]
  return tuple(jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes)


def _value_and_grads(attention, do, *args):
  out, vjp = jax.vjp(attention, *args)
  return (out, *vjp(do.astype(out.dtype)))


def _ours(visibility, splits, scale, **kwargs):
  return lambda q, k, v, bias: pallas_gpu.pallas_gpu_attention(
      q, k, v, scale=scale, bias=bias, mask=None, visibility=visibility, block_size=16,
      return_weights=False, interpret=True, splits=splits, **kwargs)


def _reference(kind, causal, length, scale):
  """In float32: jax.nn with the NumPy mask (window + global), our dense implementation
  (BigBird: its random blocks come from the pattern's seed)."""
  def attention(q, k, v, bias):
    q, k, v, bias = (x.astype(jnp.float32) for x in (q, k, v, bias))
    if kind == "global":
      return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=_numpy_mask(length, causal),
                                          scale=scale, implementation="xla")
    return dot_product_attention(q, k, v, bias=bias, scale=scale, implementation="dense",
                                 **_pattern(kind, causal, length)[1])
  return attention


def _kernels(function, *args) -> set[str]:
  """The names of the Pallas calls in function's jaxpr."""
  return set(re.findall(r"pallas_gpu_\w+", str(jax.make_jaxpr(function)(*args))))


def test_slices_cut_the_long_rows():
  """The slices of each long row are its visits in order, cut into `parts` runs of
  ⌊c / parts⌋ or ⌈c / parts⌉ tiles, the partially visible ones first in each; the long rows
  are emptied; dense causal and a window have no long row."""
  pattern = Visibility.make(False, WINDOW, None, GLOBAL)
  visits, counts = visit_lists(pattern, (150, 150), (160, 160), (16, 16), False)
  short, slices = split_visits.split(visits, counts, 3)
  assert list(slices.rows) == [0] and slices.parts == 3      # the tile holding the global rows
  assert (short[0] == 0).all() and (short[1:] == counts[1:]).all()
  every = counts[0, 1]
  sizes = slices.counts[:, 1]
  assert sizes.sum() == every and set(sizes) <= {every // 3, -(-every // 3)} and every % 3
  joined = np.concatenate([row[:n] for row, n in zip(slices.visits, sizes)])
  assert list(joined) == list(visits[0, :every])
  partial = set(visits[0, :counts[0, 0]])
  for row, (n_partial, n) in zip(slices.visits, slices.counts):
    assert [j in partial for j in row[:n]] == [True] * n_partial + [False] * (n - n_partial)
  assert list(slices.owners) == [0, 0, 0]
  for plain in (Visibility.make(True, None), Visibility.make(False, 64)):
    _, plain_counts = visit_lists(plain, (4096, 4096), (4096, 4096), (64, 64), False)
    assert split_visits.split(visits, plain_counts, None)[1] is None
  assert split_visits.split(visits, counts, 1)[1] is None        # one slice: not split
  assert split_visits.split(visits, counts, 99)[1].parts == every  # at most one tile each
  assert split_visits.split(visits, counts, None)[1].parts == 4    # ⌈√10⌉


# (kind, causal, splits, length): the split kernels that run (causal: the global rows see
# only earlier keys, so only dK / dV has a long row, the key tile holding global tokens).
CASES = {
    "global-3-splits": ("global", False, 3, 150),
    "global-causal-default": ("global", True, None, 150),
    "bigbird-default": ("bigbird", False, None, 170),
    "bigbird-causal-4-splits": ("bigbird", True, 4, 170),
}


@pytest.mark.slow
@pytest.mark.usefixtures("highest_precision")   # against jax.nn within 2e-5: no TF32 passes
@pytest.mark.parametrize("kind, causal, splits, length",
                         long_cases(list(CASES.values()), {CASES["bigbird-default"]}),
                         ids=CASES.keys())
def test_split_matches_reference_float32(kind, causal, splits, length):
  """Output and gradients (q, k, v, bias) with the long rows split, within 2e-5 of the
  reference (float32 sums in another order: a few float32 ulps of values of order 1);
  GQA (two query heads per kv head); the kernels that ran include the slices'."""
  q, k, v, do, bias = _inputs(0, length, 2, 1, 16, jnp.float32)
  visibility, _ = _pattern(kind, causal, length)
  scale = 0.25
  ours = jax.jit(lambda *a: _value_and_grads(_ours(visibility, splits, scale), do, *a))
  got = ours(q, k, v, bias)
  want = jax.jit(lambda *a: _value_and_grads(_reference(kind, causal, length, scale), do, *a))(
      q, k, v, bias)
  for name, g, w in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=name)
  sliced = {"pallas_gpu_dkv_slices"} | (set() if causal else {"pallas_gpu_forward_slices",
                                                              "pallas_gpu_dq_slices"})
  assert {name for name in _kernels(ours, q, k, v, bias) if name.endswith("slices")} == sliced


@pytest.mark.slow
def test_split_bfloat16():
  """bfloat16 in (products in bfloat16, float32 accumulation), the long rows split: within
  bfloat16 rounding of the float32 reference on the same rounded inputs (2⁻⁸ relative, taken
  of the largest value: 2e-2 · max |reference|); the slices only add float32 partials in
  another order before the one rounding to bfloat16."""
  length = 150
  q, k, v, do, bias = _inputs(1, length, 1, 1, 16, jnp.bfloat16)
  visibility, _ = _pattern("global", False, length)
  got = jax.jit(lambda *a: _value_and_grads(_ours(visibility, 3, 0.25), do, *a))(q, k, v, bias)
  want = jax.jit(lambda *a: _value_and_grads(_reference("global", False, length, 0.25), do, *a))(
      q, k, v, bias)
  for name, g, w in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
    assert g.dtype == jnp.bfloat16, name
    np.testing.assert_allclose(np.asarray(g, np.float32), w, rtol=0,
                               atol=2e-2 * float(jnp.abs(w).max()), err_msg=name)


@pytest.mark.slow
def test_d128_tiling_matches_compact_and_reference():
  """Head dim 128 in bfloat16 (the default there is "d128": 128-row held tiles, walked
  tiles of 64 / 32) and "compact" give the reference's outputs and gradients within
  bfloat16 rounding (2e-2 · max |reference|), causal, an odd length (padded tiles)."""
  length = 150
  q, k, v, do, _ = _inputs(2, length, 1, 1, 128, jnp.bfloat16)
  visibility = Visibility.make(True, None)
  run = lambda tiling: jax.jit(lambda q, k, v: _value_and_grads(
      lambda q, k, v: pallas_gpu.pallas_gpu_attention(
          q, k, v, scale=128**-0.5, bias=None, mask=None, visibility=visibility,
          block_size=None, return_weights=False, interpret=True, tiling=tiling),
      do, q, k, v))(q, k, v)
  f32 = lambda x: x.astype(jnp.float32)
  want = jax.jit(lambda q, k, v: _value_and_grads(
      lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), do, q, k, v))(
      f32(q), f32(k), f32(v))
  for tiling in (None, "compact"):
    for name, g, w in zip(("out", "dq", "dk", "dv"), run(tiling), want):
      np.testing.assert_allclose(f32(g), w, rtol=0, atol=2e-2 * float(jnp.abs(w).max()),
                                 err_msg=f"{tiling}: {name}")


def test_tiling_choice_and_refusals():
  """d128 is the default at a padded head dim of 128 in 2-byte dtypes only; a Tiling given
  whole is fitted to short lengths; unknown names, tiles that are no power of two, d128 for
  float32 at d = 128 and splits < 1 are refused in one line."""
  tiles = lambda *a, **k: tiles_for(None, *a, **k)
  assert tiles(None, 128, 2, 4096, 4096).dkv == Tiles(32, 128, 8, 2)
  assert tiles(None, 128, 4, 4096, 4096) == tiles("compact", 128, 4, 4096, 4096)
  assert tiles(None, 64, 2, 4096, 4096) == tiles("compact", 64, 2, 4096, 4096)
  given = Tiling(Tiles(64, 64, 4, 2), Tiles(64, 32, 4, 2), Tiles(32, 64, 4, 2))
  assert tiles(given, 64, 2, 40, 4096).forward == Tiles(64, 64, 4, 2)
  assert tiles(given, 64, 2, 20, 4096).forward == Tiles(32, 64, 4, 2)   # 20 → 32 rows
  with pytest.raises(ConfigError, match="unknown tiling 'd256'; choose one of compact, d128"):
    tiles("d256", 128, 2, 64, 64)
  with pytest.raises(ConfigError, match="power of two"):
    tiles(given._replace(dq=Tiles(48, 32, 4, 2)), 64, 2, 64, 64)
  with pytest.raises(ConfigError, match="at most 256 bytes"):
    tiles("d128", 128, 4, 64, 64)
  q = jnp.zeros((1, 32, 1, 16))
  with pytest.raises(ConfigError, match="splits must be None"):
    pallas_gpu.pallas_gpu_attention(q, q, q, scale=1.0, bias=None, mask=None,
                                    visibility=Visibility.make(False, None), block_size=None,
                                    return_weights=False, interpret=True, splits=0)


def _lowered(visibility, shape, dtype, **kwargs):
  """The gradient of pallas_gpu attention lowered for an NVIDIA GPU (Triton kernels)."""
  q = jax.ShapeDtypeStruct(shape, dtype)
  attention = lambda q, k, v: pallas_gpu.pallas_gpu_attention(
      q, k, v, scale=0.1, bias=None, mask=None, visibility=visibility, block_size=None,
      return_weights=False, interpret=False, **kwargs)
  gradient = jax.jit(jax.grad(lambda q, k, v: attention(q, k, v).astype(jnp.float32).sum(),
                              (0, 1, 2)))
  return gradient.trace(q, q, q).lower(lowering_platforms=("cuda",))


def test_lowers_split_and_d128_for_gpu():
  """Lowered for an NVIDIA GPU: a window (256 back) with 16 global tokens, not causal, at
  (1, 4096, 2, 128) bf16 (tiling d128) has six Triton kernels, the three slices' among
  them; with splits=1, three; the d128 kernels run 8 warps."""
  visibility = Visibility.make(False, (256, 0), None, tuple(range(16)))
  for splits, count in ((None, 6), (1, 3)):
    text = _lowered(visibility, (1, 4096, 2, 128), jnp.bfloat16, splits=splits).as_text()
    assert text.count("__gpu$xla.gpu.triton") == count
    names = set(re.findall(r'name = "(pallas_gpu_\w+)"', text))
    assert {n for n in names if n.endswith("_slices")} == (
        {"pallas_gpu_forward_slices", "pallas_gpu_dq_slices", "pallas_gpu_dkv_slices"}
        if count == 6 else set())
    assert set(re.findall(r"num_warps = (\d+)", text)) == {"8"}


@pytest.mark.aot
@pytest.mark.slow
@pytest.mark.parametrize("target", long_cases(["h100", "a100"], {"a100"}))
def test_d128_compiles_for_gpus(target):
  """The d128 tiling's kernels and their slices compiled by XLA for an H100 and (long tier)
  an A100 without the GPU (research.aot): their tiles and pipeline stages fit each chip's
  shared memory (XLA refuses a kernel that does not)."""
  from research.aot import targets  # noqa: PLC0415 - the aot extra's toolchains
  from research.attention import registry  # noqa: PLC0415

  chosen = targets.get(target)
  device = targets.devices_of(chosen)[0]
  q = jax.ShapeDtypeStruct((1, 4096, 2, 128), jnp.bfloat16,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  visibility = Visibility.make(False, (256, 0), None, tuple(range(16)))
  attention = lambda q, k, v: pallas_gpu.pallas_gpu_attention(
      q, k, v, scale=0.1, bias=None, mask=None, visibility=visibility, block_size=None,
      return_weights=False, interpret=False)
  gradient = jax.jit(jax.grad(lambda q, k, v: attention(q, k, v).astype(jnp.float32).sum(),
                              (0, 1, 2)))
  with registry.compiling_for("gpu", targets.gpu_capability(chosen), chosen.description):
    lowered = gradient.trace(q, q, q).lower(lowering_platforms=("cuda",))
  compiled = lowered.compile(targets.COMPILER_OPTIONS["cuda"])
  assert compiled.as_text().count("pallas_gpu") >= 6
