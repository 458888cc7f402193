"""The tiles of `pallas_gpu`'s three kernels (forward, dQ, dK / dV) and their Triton settings.

Named tilings (TILINGS) by the bytes of one padded head row; `tiles_for` picks one, or takes
a Tiling given whole, and fits it to the lengths and a block-sparse pattern's blocks.
Shared memory and registers of a tiling compiled for an H100 or A100, without the GPU:
`python benchmarks/kernel_resources.py`.
"""

from typing import NamedTuple

from research.errors import ConfigError

MIN_TILE = 16           # Triton's dot needs every side of a tile to be at least 16


class Tiles(NamedTuple):
  """One kernel's tile, block_q × block_k, and its Triton settings."""
  block_q: int
  block_k: int
  num_warps: int
  num_stages: int


class Tiling(NamedTuple):
  """The three kernels' tiles. The forward and dQ kernels hold block_q query rows and walk
  key tiles of block_k; the dK / dV kernel holds block_k key rows and walks query tiles of
  block_q."""
  forward: Tiles
  dq: Tiles
  dkv: Tiles


def power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


# "compact": (forward, backward) tiles by the bytes of one padded head row (d · itemsize):
# the tiles of q, k, v and their pipeline stages must fit in shared memory (163 KiB on an
# A100; checked by compiling for sm_80 and sm_90):
#   row bytes   e.g.                      forward    backward (dQ and dK / dV)
#   ≤ 256       bf16 d ≤ 128, f32 d ≤ 64  128 × 64   64 × 64
#   ≤ 512       bf16 d 256, f32 d 128     64 × 32    32 × 32
#   1024        f32 d 256                 32 × 32    16 × 32
# Triton: 4 warps up to head dim 64, else 8; 3 pipeline stages up to 64 in the forward,
# else 2.
TILES_BY_ROW_BYTES = ((256, (128, 64), (64, 64)), (512, (64, 32), (32, 32)),
                      (1024, (32, 32), (16, 32)))


def _compact(head_dim: int, itemsize: int) -> Tiling:
  """The first tiling (TILES_BY_ROW_BYTES), the default but at d = 128 in bf16 / f16."""
  forward, backward = next((f, b) for row_bytes, f, b in TILES_BY_ROW_BYTES
                           if head_dim * itemsize <= row_bytes)
  warps = 4 if head_dim <= 64 else 8
  return Tiling(Tiles(*forward, warps, 3 if head_dim <= 64 else 2),
                Tiles(*backward, warps, 2), Tiles(*backward, warps, 2))


def _d128(head_dim: int, itemsize: int) -> Tiling:
  """Head rows of 256 bytes (bf16 / f16 at d = 128) on an H100 / H200: each kernel holds
  128 rows and walks small tiles, the backward's asymmetric as in Triton's fused-attention
  tutorial and tokamax's Triton backward: a held tile of 128 rows reads the walked arrays
  half as often as compact's 64. 8 warps (two warpgroups of Hopper's wgmma) throughout.

  Compiled for an H100 (sm_90a; bf16 (1, 4096, 8, 128) causal, `kernel_resources.py`):
  forward 128 × 64, 3 stages: 158 registers, 128 KiB shared; dQ 128 × 32: 127, 96 KiB;
  dK / dV 32 × 128: 212, 96 KiB; no spills, wgmma in all three (compact: 158 / 155 / 200
  registers). Left aside: 4 warps at d = 128 spill (the tutorial's 4 warps and 5 stages:
  1.9 KB of spill stores in dK / dV), and backward tiles of 32 × 32 (jax's own Pallas
  kernel) compile to mma.sync, not wgmma."""
  if head_dim * itemsize > 256:
    raise ConfigError(f"pallas_gpu: tiling 'd128' takes head rows of at most 256 bytes (bf16 / "
                      f"f16 up to d = 128, float32 up to 64), got d = {head_dim} at "
                      f"{itemsize} bytes: use tiling='compact'")
  return Tiling(Tiles(128, 64, 8, 3), Tiles(128, 32, 8, 2), Tiles(32, 128, 8, 2))


TILINGS = {"compact": _compact, "d128": _d128}


def default_tiling(head_dim: int, itemsize: int) -> str:
  """"d128" for a padded head dim of 128 in a 2-byte dtype, else "compact"."""
  return "d128" if head_dim == 128 and itemsize == 2 else "compact"


def _largest_power_of_two_dividing(n: int) -> int:
  return n & -n


def _is_tile_side(n) -> bool:
  return isinstance(n, int) and n >= MIN_TILE and n == power_of_two(n)


def tiles_for(block_size: int | None, tiling, head_dim: int, itemsize: int, q_len: int,
              kv_len: int, nest: int | None = None) -> Tiling:
  """The kernels' tiles for a padded head dim: `tiling` (a name in TILINGS, None:
  `default_tiling`, or a Tiling), every side block_size (a power of two ≥ 16) when given;
  each side clipped to the lengths rounded up to a power of two and, for a block-sparse
  pattern (BigBird), to the largest power of two dividing `nest`, its block B (so B must be
  a multiple of 16: refused otherwise)."""
  if block_size is not None and not _is_tile_side(block_size):
    raise ValueError(f"pallas_gpu: block_size must be a power of two >= {MIN_TILE}, "
                     f"got {block_size}")
  if isinstance(tiling, Tiling):
    if not all(_is_tile_side(t.block_q) and _is_tile_side(t.block_k) for t in tiling):
      raise ConfigError(f"pallas_gpu: every tile side must be a power of two >= {MIN_TILE}, "
                        f"got {tiling}")
    chosen = tiling
  elif tiling is None or tiling in TILINGS:
    chosen = TILINGS[tiling or default_tiling(head_dim, itemsize)](head_dim, itemsize)
  else:
    raise ConfigError(f"pallas_gpu: unknown tiling {tiling!r}; choose one of "
                      f"{', '.join(TILINGS)}, a Tiling, or None (by the head dim)")
  most = _largest_power_of_two_dividing(nest) if nest else None
  fit = lambda block, length: min(block_size or block, max(MIN_TILE, power_of_two(length)),
                                  most or block_size or block)
  return Tiling(*(t._replace(block_q=fit(t.block_q, q_len), block_k=fit(t.block_k, kv_len))
                  for t in chosen))
