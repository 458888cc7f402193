"""`implementation="pallas_gpu"`: our flash attention in Pallas (Triton), forward and backward.

Exact attention out = softmax(S) V over the visible keys, computed tile by tile without the
[q_len, kv_len] weights and visiting only the tiles some query sees. On an NVIDIA GPU the
kernels are compiled by Triton; on any other backend they run through Pallas' interpreter
(`interpret=True`), slowly but exactly, for tests.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from research.attention import registry
from research.attention.masks import Visibility, visit_lists

Array = jax.Array
MIN_CAPABILITY = (8, 0)   # XLA compiles Triton kernels for Ampere and newer only
MAX_HEAD_DIM = 256
MIN_TILE = 16           # Triton's dot needs every side of a tile to be at least 16
LOG2E = math.log2(math.e)


class Tiles(NamedTuple):
  """One kernel family's tiling and Triton settings."""
  block_q: int
  block_k: int
  num_warps: int
  num_stages: int


class Config(NamedTuple):
  """Everything static about one call: the kernels branch on it at trace time."""
  scale: float
  pattern: Visibility               # causal, window, global tokens (no key lengths)
  q_len: int                        # unpadded lengths
  kv_len: int
  forward: Tiles
  backward: Tiles
  interpret: bool


def _power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


# Default (forward, backward) tiles by the bytes of one padded head row (d · itemsize): the
# tiles of q, k, v and their pipeline stages must fit in shared memory (163 KiB on an A100;
# checked by compiling for sm_80 and sm_90):
#   row bytes   e.g.                      forward    backward
#   ≤ 256       bf16 d ≤ 128, f32 d ≤ 64  128 × 64   64 × 64
#   ≤ 512       bf16 d 256, f32 d 128     64 × 32    32 × 32
#   1024        f32 d 256                 32 × 32    16 × 32
TILES_BY_ROW_BYTES = ((256, (128, 64), (64, 64)), (512, (64, 32), (32, 32)),
                      (1024, (32, 32), (16, 32)))


def _largest_power_of_two_dividing(n: int) -> int:
  return n & -n


def _tiles(block_size: int | None, head_dim: int, itemsize: int, q_len: int,
           kv_len: int, nest: int | None = None) -> tuple[Tiles, Tiles]:
  """(forward, backward) tiles block_q × block_k for a padded head dim: block_size (a power
  of two ≥ 16) for every kernel, else by the bytes of a padded head row (TILES_BY_ROW_BYTES);
  each clipped to the lengths rounded up to a power of two and, for a block-sparse pattern
  (BigBird), to the largest power of two dividing `nest`, its block B (so B must be a
  multiple of 16: refused otherwise). Triton: 4 warps up to head dim 64, else 8; 3 pipeline
  stages up to 64 in the forward, else 2."""
  if block_size is not None and (block_size < MIN_TILE or block_size != _power_of_two(block_size)):
    raise ValueError(f"pallas_gpu: block_size must be a power of two >= {MIN_TILE}, "
                     f"got {block_size}")
  forward, backward = next((f, b) for row_bytes, f, b in TILES_BY_ROW_BYTES
                           if head_dim * itemsize <= row_bytes)
  if block_size is not None:
    forward = backward = (block_size, block_size)
  most = _largest_power_of_two_dividing(nest) if nest else None
  fit = lambda block, length: min(block, max(MIN_TILE, _power_of_two(length)), most or block)
  warps = 4 if head_dim <= 64 else 8
  return (Tiles(fit(forward[0], q_len), fit(forward[1], kv_len), warps, 3 if head_dim <= 64 else 2),
          Tiles(fit(backward[0], q_len), fit(backward[1], kv_len), warps, 2))


# ---------------------------------------------------------------- tiles inside the kernels

def _pairwise_tile(ref, head, q_start, k_start, block_q: int, block_k: int) -> Array:
  """[block_q | 1, block_k | 1] of a bias / mask block [heads | 1, q_len | 1, kv_len | 1]."""
  heads, rows, cols = ref.shape
  return ref[head if heads > 1 else 0,
             pl.ds(q_start, block_q) if rows > 1 else pl.ds(0, 1),
             pl.ds(k_start, block_k) if cols > 1 else pl.ds(0, 1)]


def _visible(refs, config: Config, q_start, k_start, block_q: int, block_k: int, batch, head,
             partial: bool) -> Array | None:
  """bool [block_q, block_k] (or broadcastable): query q_start + a sees key k_start + b.
  None when nothing is masked. `partial`: the tile needs the static pattern too."""
  queries = (q_start + jnp.arange(block_q))[:, None]
  keys = (k_start + jnp.arange(block_k))[None, :]
  conditions = []
  if partial:
    flags = {}
    if config.pattern.global_tokens:
      is_global = refs["is_global"]
      flags = dict(global_queries=is_global[pl.ds(q_start, block_q)][:, None],
                   global_keys=is_global[pl.ds(k_start, block_k)][None, :])
    pattern = config.pattern.tile_visible(queries, keys, **flags)
    if pattern is not None:
      conditions.append(pattern)
    if config.kv_len % block_k:
      conditions.append(keys < config.kv_len)  # padding: ragged tiles are partial
  if "lengths" in refs:
    conditions.append(keys < refs["lengths"][batch])
  if "mask" in refs:
    conditions.append(_pairwise_tile(refs["mask"], head, q_start, k_start, block_q, block_k))
  return functools.reduce(jnp.logical_and, conditions) if conditions else None


def _logits(refs, config: Config, q, k, q_start, k_start, batch, head, partial: bool) -> Array:
  """float32 [block_q, block_k]: S · log₂e, S = scale · q kᵀ + bias, −∞ where the query
  does not see the key (base 2: the kernels exponentiate with exp2). q: [block_q, d],
  k: [block_k, d]."""
  block_q, block_k = q.shape[0], k.shape[0]
  qk = jnp.einsum("qd,kd->qk", q, k, preferred_element_type=jnp.float32)
  s = qk * (config.scale * LOG2E)
  if "bias" in refs:
    bias = _pairwise_tile(refs["bias"], head, q_start, k_start, block_q, block_k)
    s = s + bias.astype(jnp.float32) * LOG2E
  visible = _visible(refs, config, q_start, k_start, block_q, block_k, batch, head, partial)
  return s if visible is None else jnp.where(visible, s, -jnp.inf)


def _visit(refs, row, step, carry):
  """Runs step(t, carry, partial) over the visit list `row`: partial tiles, then full ones."""
  partial, every = refs["counts"][row, 0], refs["counts"][row, 1]
  carry = lax.fori_loop(0, partial, functools.partial(step, partial=True), carry)
  return lax.fori_loop(partial, every, functools.partial(step, partial=False), carry)


# ---------------------------------------------------------------- the kernels

def _forward_kernel(refs, config: Config):
  """One query tile of one head: out [block_q, d_v] and lse [block_q] (online softmax, base 2)."""
  i, batch = pl.program_id(0), pl.program_id(1)
  block_q, block_k = config.forward.block_q, config.forward.block_k
  q, q_start = refs["q"][...], i * block_q

  def step(t, carry, partial):
    m, l, acc = carry
    k_start = pl.multiple_of(refs["visits"][i, t] * block_k, block_k)
    k = refs["k"][pl.ds(k_start, block_k), :]
    v = refs["v"][pl.ds(k_start, block_k), :]
    s = _logits(refs, config, q, k, q_start, k_start, batch, 0, partial)
    m_next = jnp.maximum(m, s.max(axis=1))
    shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # no key seen yet: every term is e^−∞
    p = jnp.exp2(s - shift[:, None])
    correction = jnp.exp2(m - shift)
    l = correction * l + p.sum(axis=1)
    pv = jnp.einsum("qk,kd->qd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m_next, l, correction[:, None] * acc + pv

  start = (jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32),
           jnp.zeros((block_q, refs["v"].shape[-1]), jnp.float32))
  m, l, acc = _visit(refs, i, step, start)
  seen = l > 0
  refs["out"][...] = (acc / jnp.where(seen, l, 1.0)[:, None]).astype(refs["out"].dtype)
  refs["lse"][...] = jnp.where(seen, m + jnp.log2(l), jnp.inf)


def _dq_kernel(refs, config: Config):
  """One query tile of one head: dQ [block_q, d], and dS into dbias when there is a bias."""
  i, batch = pl.program_id(0), pl.program_id(1)
  block_q, block_k = config.backward.block_q, config.backward.block_k
  q, do, q_start = refs["q"][...], refs["do"][...], i * block_q
  lse, delta = refs["lse"][...], refs["delta"][...]

  def step(t, dq, partial):
    k_start = pl.multiple_of(refs["visits"][i, t] * block_k, block_k)
    k = refs["k"][pl.ds(k_start, block_k), :]
    v = refs["v"][pl.ds(k_start, block_k), :]
    p = jnp.exp2(_logits(refs, config, q, k, q_start, k_start, batch, 0, partial) - lse[:, None])
    dp = jnp.einsum("qd,kd->qk", do, v, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, None])
    if "dbias" in refs:
      refs["dbias"][:, pl.ds(k_start, block_k)] = ds
    return dq + jnp.einsum("qk,kd->qd", ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

  dq = _visit(refs, i, step, jnp.zeros(q.shape, jnp.float32))
  refs["dq"][...] = (dq * config.scale).astype(refs["dq"].dtype)


def _dkv_kernel(refs, config: Config):
  """One key tile of one kv head: dK, dV [block_k, d], summed over the query heads that
  read this kv head (the query-tile loop runs once per head of the group)."""
  j, batch = pl.program_id(0), pl.program_id(1)
  block_q, block_k = config.backward.block_q, config.backward.block_k
  k, v, k_start = refs["k"][...], refs["v"][...], j * block_k

  def step(t, carry, partial, g):
    dk, dv = carry
    q_start = pl.multiple_of(refs["visits"][j, t] * block_q, block_q)
    q = refs["q"][pl.ds(q_start, block_q), g, :]
    do = refs["do"][pl.ds(q_start, block_q), g, :]
    lse = refs["lse"][g, pl.ds(q_start, block_q)]
    delta = refs["delta"][g, pl.ds(q_start, block_q)]
    p = jnp.exp2(_logits(refs, config, q, k, q_start, k_start, batch, g, partial) - lse[:, None])
    dv = dv + jnp.einsum("qk,qd->kd", p.astype(do.dtype), do, preferred_element_type=jnp.float32)
    dp = jnp.einsum("qd,kd->qk", do, v, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, None])
    dk = dk + jnp.einsum("qk,qd->kd", ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
    return dk, dv

  def head(g, carry):
    return _visit(refs, j, lambda t, c, partial: step(t, c, partial, g), carry)

  group = refs["q"].shape[1]  # the query heads reading this kv head
  start = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  dk, dv = lax.fori_loop(0, group, head, start)
  refs["dk"][...] = (dk * config.scale).astype(refs["dk"].dtype)
  refs["dv"][...] = dv.astype(refs["dv"].dtype)


# ---------------------------------------------------------------- pallas_call plumbing

def _whole(x) -> pl.BlockSpec:
  """The whole (small) array in every program: tables, key lengths, global positions."""
  return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


def _pairwise(heads: int):
  """BlockSpec of a bias / mask [b | 1, H | 1, q_len | 1, kv_len | 1] for programs (tile,
  batch, head): `heads` heads from head · heads on (one when it broadcasts over heads), all
  positions."""
  def spec(x) -> pl.BlockSpec:
    full_batch, full_heads = x.shape[0] > 1, x.shape[1] > 1
    return pl.BlockSpec((None, heads if full_heads else 1, *x.shape[2:]),
                        lambda _, b, h: (b if full_batch else 0, h if full_heads else 0, 0, 0))
  return spec


def _call(kernel, config: Config, tiles: Tiles, grid, inputs: dict, outputs: dict, name: str,
          aliases: dict | None = None):
  """pallas_call of kernel(refs: dict name → ref, config) over `grid`. inputs: name →
  (array or None (left out), spec: array → BlockSpec); outputs: name → (ShapeDtypeStruct,
  spec); aliases: output name → the input name whose buffer it starts from."""
  inputs = {name: (x, spec(x)) for name, (x, spec) in inputs.items() if x is not None}
  names = [*inputs, *outputs]
  positions = {name: n for n, name in enumerate(inputs)}
  out_names = list(outputs)
  return pl.pallas_call(
      lambda *refs: kernel(dict(zip(names, refs)), config),
      grid=grid,
      in_specs=[spec for _, spec in inputs.values()],
      out_specs=[spec(shape) for shape, spec in outputs.values()],
      out_shape=[shape for shape, _ in outputs.values()],
      input_output_aliases={positions[i]: out_names.index(o) for o, i in (aliases or {}).items()},
      compiler_params=plgpu.CompilerParams(num_warps=tiles.num_warps,
                                           num_stages=tiles.num_stages),
      interpret=config.interpret, name=name,
  )(*[x for x, _ in inputs.values()])


def _pattern_inputs(config: Config, tiles: Tiles, padded: tuple[int, int], lengths,
                    transpose: bool) -> dict:
  """The inputs every kernel takes: its visit lists, key lengths, global-token flags.

  `Visibility.block_map` (static: causal, window, global tokens, a block-sparse pattern,
  kv_len) says for each (query tile, key tile) pair: 0 invisible, 1 partially visible, 2
  fully visible. At trace time `masks.visit_lists` makes it, per query tile, the list of key
  tiles to visit (partial ones first) and its two counts, int32 arrays the forward and dQ
  kernels index; the transposed map gives, per key tile, the query tiles for dK, dV. A
  window w thus costs O(L·w), causal half of full, global tokens add their rows and columns
  of tiles, a block-sparse pattern (Sparse Transformer, BigBird) its visible tiles. Partial
  tiles evaluate the pattern on position iotas (window, causality, global tokens through a
  bool table of positions, the fixed / strided rule, the end of the keys; BigBird's tiles
  lie within its blocks, so its table is all in the visit lists); every tile applies the
  dynamic part: key lengths, the user's mask and bias tiles.
  """
  visits, counts = visit_lists(config.pattern, (config.q_len, config.kv_len), padded,
                               (tiles.block_q, tiles.block_k), transpose)
  is_global = None
  if config.pattern.global_tokens:
    is_global = jnp.asarray(np.isin(np.arange(max(padded)), config.pattern.global_tokens))
  return dict(visits=(visits, _whole), counts=(counts, _whole), lengths=(lengths, _whole),
              is_global=(is_global, _whole))


def _forward(config: Config, q, k, v, bias, mask, lengths) -> tuple[Array, Array]:
  """Padded q [b, Lq, H, d], k [b, Lk, H_kv, d], v [b, Lk, H_kv, d_v] → out [b, Lq, H, d_v]
  in q's dtype and lse float32 [b, H, Lq].

  For a query tile Q_i [block_q, d] and the key tiles K_j, V_j [block_k, d] it visits:

    S_ij  = scale · Q_i K_jᵀ + B_ij,  −∞ where query q does not see key k      (float32)
    m'    = max(m, rowmax S_ij)                                                (running max)
    ℓ'    = e^(m − m') ℓ + rowsum e^(S_ij − m')                                (running sum)
    acc'  = e^(m − m') acc + e^(S_ij − m') V_j                                 (float32)
    O_i   = acc / ℓ,   lse_i = m + log ℓ   (a row with ℓ = 0 sees no key: O = 0, lse = +∞)

  (in base 2 inside the kernels: S · log₂e and exp2, the GPU's native exponential).
  """
  batch, q_len, heads, _ = q.shape
  group = heads // k.shape[2]
  tiles = config.forward
  query_tile = lambda x: pl.BlockSpec((None, tiles.block_q, None, x.shape[-1]),
                                      lambda i, b, h: (b, i, h, 0))
  keys = lambda x: pl.BlockSpec((None, x.shape[1], None, x.shape[3]),
                                lambda _, b, h: (b, 0, h // group, 0))
  rows = lambda _: pl.BlockSpec((None, None, tiles.block_q), lambda i, b, h: (b, h, i))
  inputs = dict(q=(q, query_tile), k=(k, keys), v=(v, keys), bias=(bias, _pairwise(1)),
                mask=(mask, _pairwise(1)),
                **_pattern_inputs(config, tiles, (q_len, k.shape[1]), lengths, False))
  outputs = dict(out=(jax.ShapeDtypeStruct((*q.shape[:3], v.shape[3]), q.dtype), query_tile),
                 lse=(jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32), rows))
  return _call(_forward_kernel, config, tiles, (q_len // tiles.block_q, batch, heads), inputs,
               outputs, "pallas_gpu_forward")


def _backward(config: Config, q, k, v, bias, mask, lengths, out, lse, d_out):
  """dq, dk, dv (and dbias float32 [b, H, Lq, Lk] when there is a bias, else None) of the
  padded arrays; lse is +∞ on rows that contribute nothing.

  With P_ij = e^(S_ij − lse_i) recomputed per tile and D = rowsum(dO ∘ O) (an XLA einsum):

    dV_j = Σ_i P_ijᵀ dO_i,  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i)
    dK_j = scale · Σ_i dS_ijᵀ Q_i,   dQ_i = scale · Σ_j dS_ij K_j,   dB = dS

  in two kernels: `_dkv_kernel` (one program per key tile and kv head, looping over the query
  tiles of the H / H_kv query heads that share the kv head) and `_dq_kernel` (one program per
  query tile and head, looping over key tiles; with a bias it also writes dS, which is summed
  over the broadcast axes of the bias: this materialises [batch, H, q_len, kv_len] float32).
  Rows with lse = +∞ (no key seen, or padding) have P = 0 and contribute nothing.
  """
  batch, q_len, heads, _ = q.shape
  kv_len, kv_heads = k.shape[1], k.shape[2]
  group = heads // kv_heads
  tiles = config.backward
  d_out = d_out.astype(q.dtype)
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))

  # dQ (and dS): programs (query tile, batch, head), looping over key tiles
  query_tile = lambda x: pl.BlockSpec((None, tiles.block_q, None, x.shape[-1]),
                                      lambda i, b, h: (b, i, h, 0))
  keys = lambda x: pl.BlockSpec((None, kv_len, None, x.shape[3]),
                                lambda _, b, h: (b, 0, h // group, 0))
  row_tile = lambda _: pl.BlockSpec((None, None, tiles.block_q), lambda i, b, h: (b, h, i))
  ds_rows = lambda _: pl.BlockSpec((None, None, tiles.block_q, kv_len),
                                   lambda i, b, h: (b, h, i, 0))
  outputs = dict(dq=(jax.ShapeDtypeStruct(q.shape, q.dtype), query_tile))
  zeros = None
  if bias is not None:  # dS is written on the visited tiles only: start from zeros
    zeros = jnp.zeros((batch, heads, q_len, kv_len), jnp.float32)
    outputs["dbias"] = (jax.ShapeDtypeStruct(zeros.shape, zeros.dtype), ds_rows)
  dq_and_ds = _call(
      _dq_kernel, config, tiles, (q_len // tiles.block_q, batch, heads),
      dict(q=(q, query_tile), do=(d_out, query_tile), lse=(lse, row_tile),
           delta=(delta, row_tile), k=(k, keys), v=(v, keys), bias=(bias, _pairwise(1)),
           mask=(mask, _pairwise(1)), zeros=(zeros, ds_rows),
           **_pattern_inputs(config, tiles, (q_len, kv_len), lengths, False)),
      outputs, "pallas_gpu_dq", aliases=dict(dbias="zeros") if bias is not None else None)
  dq, ds = dq_and_ds if bias is not None else (dq_and_ds[0], None)

  # dK, dV: programs (key tile, batch, kv head), looping over the group's query tiles
  key_tile = lambda x: pl.BlockSpec((None, tiles.block_k, None, x.shape[3]),
                                    lambda j, b, h: (b, j, h, 0))
  queries = lambda x: pl.BlockSpec((None, q_len, group, x.shape[3]), lambda _, b, h: (b, 0, h, 0))
  rows = lambda _: pl.BlockSpec((None, group, q_len), lambda _, b, h: (b, h, 0))
  dk, dv = _call(
      _dkv_kernel, config, tiles, (kv_len // tiles.block_k, batch, kv_heads),
      dict(k=(k, key_tile), v=(v, key_tile), q=(q, queries), do=(d_out, queries),
           lse=(lse, rows), delta=(delta, rows), bias=(bias, _pairwise(group)),
           mask=(mask, _pairwise(group)),
           **_pattern_inputs(config, tiles, (q_len, kv_len), lengths, True)),
      dict(dk=(jax.ShapeDtypeStruct(k.shape, k.dtype), key_tile),
           dv=(jax.ShapeDtypeStruct(v.shape, v.dtype), key_tile)),
      "pallas_gpu_dkv")
  return dq, dk, dv, ds


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(config: Config, q, k, v, bias, mask, lengths) -> Array:
  """Padded out [b, Lq, H, d_v] of padded inputs (see `pallas_gpu_attention`)."""
  return _forward(config, q, k, v, bias, mask, lengths)[0]


def _flash_forward(config: Config, q, k, v, bias, mask, lengths):
  out, lse = _forward(config, q, k, v, bias, mask, lengths)
  real = jnp.arange(q.shape[1]) < config.q_len
  lse = jnp.where(real, lse, jnp.inf)  # padded queries contribute nothing to dK, dV
  return out, (q, k, v, bias, mask, lengths, out, lse)


def _flash_backward(config: Config, residuals, d_out):
  q, k, v, bias, mask, lengths, out, lse = residuals
  dq, dk, dv, ds = _backward(config, q, k, v, bias, mask, lengths, out, lse, d_out)
  dbias = None
  if bias is not None:
    summed = tuple(a for a in range(4) if bias.shape[a] == 1 and ds.shape[a] > 1)
    dbias = ds.sum(summed, keepdims=True).astype(bias.dtype)
  return dq, dk, dv, dbias, None, None


_flash.defvjp(_flash_forward, _flash_backward)


# ---------------------------------------------------------------- the implementation

def _pad(x: Array, shape: tuple[int, ...]) -> Array:
  """x zero-padded at the end of each axis to `shape`."""
  if x.shape == shape:
    return x
  return jnp.pad(x, [(0, s - n) for n, s in zip(x.shape, shape)])


def _pad_pairwise(x: Array | None, q_len: int, kv_len: int) -> Array | None:
  """A bias / mask [b | 1, H | 1, q | 1, kv | 1] padded to the padded lengths; axes of
  size 1 broadcast and stay 1."""
  if x is None:
    return None
  lengths = (1 if n == 1 else padded for n, padded in zip(x.shape[2:], (q_len, kv_len)))
  return _pad(x, (*x.shape[:2], *lengths))


def pallas_gpu_attention(q: Array, k: Array, v: Array, *, scale: float, bias, mask,
                         visibility: Visibility, block_size: int | None, return_weights: bool,
                         interpret: bool) -> Array:
  """The uniform implementation signature (see `research.attention.registry`).

  q: [batch, q_len, H, d]; k: [batch, kv_len, H_kv, d]; v: [batch, kv_len, H_kv, d_v];
  bias / mask: None or [batch | 1, H | 1, q_len | 1, kv_len | 1]. Returns
  [batch, q_len, H, d_v] in q's dtype. `interpret`: run Pallas' interpreter
  (the dispatcher sets it for the CPU branch) instead of the Triton kernels.

  Supports H_kv dividing H (query head h reads kv head h // (H / H_kv)); causal, windows,
  global tokens, key lengths, a boolean mask and a bias (gradient for the bias, none for
  the mask or lengths); float32, bfloat16, float16 (products in the input dtype,
  accumulated in float32; float32 products follow `jax.default_matmul_precision`, TF32 by
  default on a GPU); head dims up to 256. Lengths are padded to the tiles (`_tiles`; padded
  keys masked, padded queries cut off), head dims to a power of two ≥ 16 with zeros. The
  forward and backward kernels are `_forward` and `_backward`; `_pattern_inputs` says which
  tiles they visit.
  """
  del return_weights  # never asked for: returns_weights=False
  batch, q_len, heads, head_dim = q.shape
  kv_len, d_v = k.shape[1], v.shape[3]
  if max(head_dim, d_v) > MAX_HEAD_DIM:
    raise ValueError(f"pallas_gpu takes head dims up to {MAX_HEAD_DIM}, got {head_dim}, {d_v}")
  dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
  d_padded, dv_padded = (max(MIN_TILE, _power_of_two(n)) for n in (head_dim, d_v))
  nest = None if visibility.sparsity is None else visibility.sparsity.nest
  forward, backward = _tiles(block_size, d_padded, dtype.itemsize, q_len, kv_len, nest)
  config = Config(float(scale), visibility._replace(kv_lengths=None), q_len, kv_len, forward,
                  backward, bool(interpret))
  round_up = lambda n, blocks: -(-n // max(blocks)) * max(blocks)  # to every tile (powers of 2)
  lq = round_up(q_len, (forward.block_q, backward.block_q))
  lk = round_up(kv_len, (forward.block_k, backward.block_k))
  lengths = visibility.kv_lengths
  if lengths is not None:
    lengths = jnp.minimum(jnp.asarray(lengths), kv_len).astype(jnp.int32)
  out = _flash(config, _pad(q.astype(dtype), (batch, lq, heads, d_padded)),
               _pad(k.astype(dtype), (batch, lk, k.shape[2], d_padded)),
               _pad(v.astype(dtype), (batch, lk, k.shape[2], dv_padded)),
               _pad_pairwise(bias, lq, lk), _pad_pairwise(mask, lq, lk), lengths)
  return out[:, :q_len, :, :d_v].astype(q.dtype)


def refusals(request: registry.Request) -> list[str]:
  """What of `request` this kernel cannot do beyond the registered capabilities, in words."""
  reasons = registry.below_capability(request, MIN_CAPABILITY, "XLA's Triton")
  if request.head_dim > MAX_HEAD_DIM:
    reasons.append(f"head dim {request.head_dim} (pallas_gpu takes up to {MAX_HEAD_DIM})")
  nest = None if request.sparsity is None else request.sparsity.nest
  if nest and nest % MIN_TILE:
    reasons.append(f"a pattern of blocks of {nest} (pallas_gpu's tiles, powers of two >= "
                   f"{MIN_TILE}, must divide them)")
  return reasons


def auto_rank(request: registry.Request) -> int:
  """"auto"'s place for this kernel on GPUs, from the accelerator report's measurements
  (results/accelerator/h200.md, bf16 forward + backward on an H200): before cuDNN (rank 0)
  for a window at head dims up to 64, where it was faster (causal window 256: 0.14 against
  0.25 ms at (4, 2048, 8, 64), 0.44 against 0.52 ms at (4, 8192, 8, 64)); after it
  otherwise (tied at 0, cuDNN registered first), where cuDNN was faster (dense causal: 2.53
  against 3.65 ms at (4, 8192, 8, 64); window 256 at d = 128: 0.78 against 1.24 ms at
  (1, 32768, 8, 128))."""
  return -1 if request.window is not None and request.head_dim <= 64 else 0


registry.register(registry.Implementation(
    "pallas_gpu", pallas_gpu_attention, mask=True, bias=True, window="optional",
    global_tokens=True, block_sparse=True, key_value_seq_lengths=True, gqa=True,
    dtypes=frozenset({"float32", "bfloat16", "float16"}), platforms=frozenset({"gpu"}),
    interpreted=frozenset({"cpu"}), refuses=refusals, auto_rank=auto_rank))
