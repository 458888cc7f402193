"""`implementation="pallas_gpu"`: our flash attention in Pallas (Triton), forward and backward.

Exact attention out = softmax(S) V over the visible keys, computed tile by tile without the
[q_len, kv_len] weights and visiting only the tiles some query sees; a tile that visits far
more than the others (global tokens) is split over several programs whose partial results
are combined (`split_visits`). On an NVIDIA GPU the kernels are compiled by Triton; on any
other backend they run through Pallas' interpreter (`interpret=True`), slowly but exactly.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from research.attention import registry
from research.attention.kernels import split_visits
from research.attention.kernels.gpu_tiles import MIN_TILE, Tiles, Tiling, power_of_two, tiles_for
from research.attention.masks import Visibility, visit_lists
from research.errors import ConfigError

Array = jax.Array
MIN_CAPABILITY = (8, 0)   # XLA compiles Triton kernels for Ampere and newer only
MAX_HEAD_DIM = 256
LOG2E = math.log2(math.e)


class Config(NamedTuple):
  """Everything static about one call: the kernels branch on it at trace time."""
  scale: float
  pattern: Visibility               # causal, window, global tokens (no key lengths)
  q_len: int                        # unpadded lengths
  kv_len: int
  tiling: Tiling
  splits: int | None                # slices per long visit-list row (`split_visits.split`)
  interpret: bool


# ---------------------------------------------------------------- tiles inside the kernels

def _pairwise_tile(ref, head, q_start, k_start, block_q: int, block_k: int) -> Array:
  """[block_q | 1, block_k | 1] of a bias / mask block [heads | 1, q_len | 1, kv_len | 1]."""
  heads, rows, cols = ref.shape
  return ref[head if heads > 1 else 0,
             pl.ds(q_start, block_q) if rows > 1 else pl.ds(0, 1),
             pl.ds(k_start, block_k) if cols > 1 else pl.ds(0, 1)]


def _visible(refs, config: Config, q_start, k_start, block_q: int, block_k: int, batch, head,
             partial: bool, keys_first: bool) -> Array | None:
  """bool [block_q, block_k] (keys_first: [block_k, block_q]; or broadcastable): query
  q_start + a sees key k_start + b. None when nothing is masked. `partial`: the tile needs
  the static pattern too."""
  along = lambda x, axis: jnp.expand_dims(x, 1 - axis)   # a vector along a tile's axis
  q_axis, k_axis = (1, 0) if keys_first else (0, 1)
  queries = along(q_start + jnp.arange(block_q), q_axis)
  keys = along(k_start + jnp.arange(block_k), k_axis)
  conditions = []
  if partial:
    flags = {}
    if config.pattern.global_tokens:
      is_global = refs["is_global"]
      flags = dict(global_queries=along(is_global[pl.ds(q_start, block_q)], q_axis),
                   global_keys=along(is_global[pl.ds(k_start, block_k)], k_axis))
    pattern = config.pattern.tile_visible(queries, keys, **flags)
    if pattern is not None:
      conditions.append(pattern)
    if config.kv_len % block_k:
      conditions.append(keys < config.kv_len)  # padding: ragged tiles are partial
  if "lengths" in refs:
    conditions.append(keys < refs["lengths"][batch])
  if "mask" in refs:
    tile = _pairwise_tile(refs["mask"], head, q_start, k_start, block_q, block_k)
    conditions.append(tile.T if keys_first else tile)
  return functools.reduce(jnp.logical_and, conditions) if conditions else None


def _logits(refs, config: Config, q, k, q_start, k_start, batch, head, partial: bool,
            keys_first: bool = False) -> Array:
  """float32 [block_q, block_k] (keys_first: its transpose [block_k, block_q]): S · log₂e,
  S = scale · q kᵀ + bias, −∞ where the query does not see the key (base 2: the kernels
  exponentiate with exp2). q: [block_q, d], k: [block_k, d]."""
  block_q, block_k = q.shape[0], k.shape[0]
  if keys_first:
    s = jnp.einsum("kd,qd->kq", k, q, preferred_element_type=jnp.float32)
  else:
    s = jnp.einsum("qd,kd->qk", q, k, preferred_element_type=jnp.float32)
  s = s * (config.scale * LOG2E)
  if "bias" in refs:
    bias = _pairwise_tile(refs["bias"], head, q_start, k_start, block_q, block_k)
    s = s + (bias.T if keys_first else bias).astype(jnp.float32) * LOG2E
  visible = _visible(refs, config, q_start, k_start, block_q, block_k, batch, head, partial,
                     keys_first)
  return s if visible is None else jnp.where(visible, s, -jnp.inf)


def _visit(refs, row, step, carry):
  """Runs step(t, carry, partial) over the visit list `row`: partial tiles, then full ones."""
  partial, every = refs["counts"][row, 0], refs["counts"][row, 1]
  carry = lax.fori_loop(0, partial, functools.partial(step, partial=True), carry)
  return lax.fori_loop(partial, every, functools.partial(step, partial=False), carry)


def _slicing(refs) -> bool:
  """Whether this program walks a slice of a long row (`split_visits`): its row is the
  `owners` table's entry, its held rows are cut from the whole array, and it writes
  partial results for the combine."""
  return "owners" in refs


def _held(refs, name: str, start, size: int) -> Array:
  """The program's held rows start … start + size of refs[name]: its own block, or cut
  from the whole rows in a slice's program."""
  return refs[name][pl.ds(start, size)] if _slicing(refs) else refs[name][...]


def _program_tile(refs, size: int, order):
  """(the program's row of the visit tables, the first position of the tile it holds):
  `order`'s tile (`Plan.order`), or in a slice's program the `owners` table's."""
  program = pl.program_id(0)
  if _slicing(refs):
    return program, pl.multiple_of(refs["owners"][program] * size, size)
  tile = order(program)
  return tile, pl.multiple_of(tile * size, size)


# ---------------------------------------------------------------- the kernels

def _forward_kernel(refs, config: Config, order):
  """One query tile of one head: out [block_q, d_v] and lse [block_q] (online softmax, base
  2); a slice's program writes its running max, sum and unnormalised output (m, ℓ, acc)."""
  batch = pl.program_id(1)
  block_q, block_k = config.tiling.forward.block_q, config.tiling.forward.block_k
  row, q_start = _program_tile(refs, block_q, order)
  q = _held(refs, "q", q_start, block_q)

  def step(t, carry, partial):
    m, l, acc = carry
    k_start = pl.multiple_of(refs["visits"][row, t] * block_k, block_k)
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
  m, l, acc = _visit(refs, row, step, start)
  if _slicing(refs):
    refs["m"][...], refs["l"][...], refs["acc"][...] = m, l, acc
    return
  seen = l > 0
  refs["out"][...] = (acc / jnp.where(seen, l, 1.0)[:, None]).astype(refs["out"].dtype)
  refs["lse"][...] = jnp.where(seen, m + jnp.log2(l), jnp.inf)


def _dq_kernel(refs, config: Config, order):
  """One query tile of one head: dQ [block_q, d] (a slice's program: its key tiles' share,
  float32), and dS into dbias when there is a bias."""
  batch = pl.program_id(1)
  block_q, block_k = config.tiling.dq.block_q, config.tiling.dq.block_k
  row, q_start = _program_tile(refs, block_q, order)
  q, do = _held(refs, "q", q_start, block_q), _held(refs, "do", q_start, block_q)
  lse, delta = _held(refs, "lse", q_start, block_q), _held(refs, "delta", q_start, block_q)
  ds_rows = pl.ds(q_start, block_q) if _slicing(refs) else slice(None)

  def step(t, dq, partial):
    k_start = pl.multiple_of(refs["visits"][row, t] * block_k, block_k)
    k = refs["k"][pl.ds(k_start, block_k), :]
    v = refs["v"][pl.ds(k_start, block_k), :]
    p = jnp.exp2(_logits(refs, config, q, k, q_start, k_start, batch, 0, partial) - lse[:, None])
    dp = jnp.einsum("qd,kd->qk", do, v, preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, None])
    if "dbias" in refs:
      refs["dbias"][ds_rows, pl.ds(k_start, block_k)] = ds
    return dq + jnp.einsum("qk,kd->qd", ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

  dq = _visit(refs, row, step, jnp.zeros(q.shape, jnp.float32))
  refs["dq"][...] = (dq * config.scale).astype(refs["dq"].dtype)


def _dkv_kernel(refs, config: Config, order):
  """One key tile of one kv head: dK, dV [block_k, d], summed over the query heads that
  read this kv head (the query-tile loop runs once per head of the group); a slice's
  program sums its query tiles only (float32). Key-major: every product has the held keys
  as its rows (Sᵀ = K Qᵀ, dV += Pᵀ dO, dPᵀ = V dOᵀ, dK += dSᵀ Q), no tile transposed."""
  batch = pl.program_id(1)
  block_q, block_k = config.tiling.dkv.block_q, config.tiling.dkv.block_k
  row, k_start = _program_tile(refs, block_k, order)
  k, v = _held(refs, "k", k_start, block_k), _held(refs, "v", k_start, block_k)

  def step(t, carry, partial, g):
    dk, dv = carry
    q_start = pl.multiple_of(refs["visits"][row, t] * block_q, block_q)
    q = refs["q"][pl.ds(q_start, block_q), g, :]
    do = refs["do"][pl.ds(q_start, block_q), g, :]
    lse = refs["lse"][g, pl.ds(q_start, block_q)]
    delta = refs["delta"][g, pl.ds(q_start, block_q)]
    s_t = _logits(refs, config, q, k, q_start, k_start, batch, g, partial, keys_first=True)
    p_t = jnp.exp2(s_t - lse[None, :])
    dv = dv + jnp.einsum("kq,qd->kd", p_t.astype(do.dtype), do, preferred_element_type=jnp.float32)
    dp_t = jnp.einsum("kd,qd->kq", v, do, preferred_element_type=jnp.float32)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = dk + jnp.einsum("kq,qd->kd", ds_t.astype(q.dtype), q, preferred_element_type=jnp.float32)
    return dk, dv

  def head(g, carry):
    return _visit(refs, row, lambda t, c, partial: step(t, c, partial, g), carry)

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


def _rows(tile: int | None, order=None, group: int | None = None):
  """BlockSpec of x [b, L, H, d] for programs (p, batch, head): tile `order(p)` (`tile`
  rows) of head h, or (tile None) all L rows of head h, or of the `group` heads from
  h · group on (the query heads that read kv head h)."""
  def spec(x) -> pl.BlockSpec:
    heads = None if group is None else group
    if tile is None:
      return pl.BlockSpec((None, x.shape[1], heads, x.shape[3]), lambda _, b, h: (b, 0, h, 0))
    return pl.BlockSpec((None, tile, heads, x.shape[3]), lambda p, b, h: (b, order(p), h, 0))
  return spec


def _by_head(tile: int | None, order=None, group: int | None = None):
  """BlockSpec of x [b, H, L] for programs (p, batch, head): tile `order(p)` (`tile`
  entries) of head h, all L (tile None), or all L of `group` heads from h · group on."""
  def spec(x) -> pl.BlockSpec:
    if group is not None:
      return pl.BlockSpec((None, group, x.shape[2]), lambda _, b, h: (b, h, 0))
    if tile is None:
      return pl.BlockSpec((None, None, x.shape[2]), lambda _, b, h: (b, h, 0))
    return pl.BlockSpec((None, None, tile), lambda p, b, h: (b, h, order(p)))
  return spec


def _part(x) -> pl.BlockSpec:
  """BlockSpec of a slices' output [b, H, slices, ...] for programs (slice, batch, head)."""
  rest = x.shape[3:]
  return pl.BlockSpec((None, None, None, *rest), lambda p, b, h: (b, h, p, *(0,) * len(rest)))


def _call(kernel, config: Config, tiles: Tiles, grid, inputs: dict, outputs: dict, name: str,
          aliases: dict | None = None, order=None):
  """pallas_call of kernel(refs: dict name → ref, config, order) over `grid`. inputs: name →
  (array or None (left out), spec: array → BlockSpec); outputs: name → (ShapeDtypeStruct,
  spec); aliases: output name → the input name whose buffer it starts from."""
  inputs = {name: (x, spec(x)) for name, (x, spec) in inputs.items() if x is not None}
  names = [*inputs, *outputs]
  positions = {name: n for n, name in enumerate(inputs)}
  out_names = list(outputs)
  return pl.pallas_call(
      lambda *refs: kernel(dict(zip(names, refs)), config, order),
      grid=grid,
      in_specs=[spec for _, spec in inputs.values()],
      out_specs=[spec(shape) for shape, spec in outputs.values()],
      out_shape=[shape for shape, _ in outputs.values()],
      input_output_aliases={positions[i]: out_names.index(o) for o, i in (aliases or {}).items()},
      compiler_params=plgpu.CompilerParams(num_warps=tiles.num_warps,
                                           num_stages=tiles.num_stages),
      interpret=config.interpret, name=name,
  )(*[x for x, _ in inputs.values()])


class Plan(NamedTuple):
  """One kernel's visits: its main call's inputs, its slices' call's (None without long
  rows), the Slices, and `order`: the tile main-call program p holds (p, or the tiles in
  reverse where the later ones visit more, as causal queries do: the heaviest programs
  start first and the last wave holds light ones)."""
  main: dict
  sliced: dict | None
  slices: split_visits.Slices | None
  order: Callable


def _plan(config: Config, tiles: Tiles, padded: tuple[int, int], lengths,
          transpose: bool) -> Plan:
  """The visits of a kernel: its visit lists, key lengths, global-token flags.

  `Visibility.block_map` (static: causal, window, global tokens, a block-sparse pattern,
  kv_len) says for each (query tile, key tile) pair: 0 invisible, 1 partially visible, 2
  fully visible. At trace time `masks.visit_lists` makes it, per query tile, the list of key
  tiles to visit (partial ones first) and its two counts, int32 arrays the forward and dQ
  kernels index; the transposed map gives, per key tile, the query tiles for dK, dV. A
  window w thus costs O(L·w), causal half of full, global tokens add their rows and columns
  of tiles, a block-sparse pattern (Sparse Transformer, BigBird) its visible tiles. Rows
  far longer than the others (global rows and columns) are emptied in the main call and
  cut into slices for a second call (`split_visits.split`, `config.splits` slices each).
  Partial tiles evaluate the pattern on position iotas (window, causality, global tokens
  through a bool table of positions, the fixed / strided rule, the end of the keys;
  BigBird's tiles lie within its blocks, so its table is all in the visit lists); every
  tile applies the dynamic part: key lengths, the user's mask and bias tiles.
  """
  visits, counts = visit_lists(config.pattern, (config.q_len, config.kv_len), padded,
                               (tiles.block_q, tiles.block_k), transpose)
  counts, slices = split_visits.split(visits, counts, config.splits)
  is_global = None
  if config.pattern.global_tokens:
    is_global = jnp.asarray(np.isin(np.arange(max(padded)), config.pattern.global_tokens))
  shared = dict(lengths=(lengths, _whole), is_global=(is_global, _whole))
  main = dict(visits=(visits, _whole), counts=(counts, _whole), **shared)
  last, half = len(counts) - 1, len(counts) // 2
  reverse = counts[half:, 1].sum() > counts[:half, 1].sum()
  order = (lambda p: last - p) if reverse else (lambda p: p)
  if slices is None:
    return Plan(main, None, None, order)
  return Plan(main, dict(visits=(slices.visits, _whole), counts=(slices.counts, _whole),
                         owners=(slices.owners, _whole), **shared), slices, order)


def _replace_tiles(x: Array, rows: np.ndarray, values: Array) -> Array:
  """x [b, L, H, d] with its tiles `rows` (of values.shape[3] positions) set to values
  [b, H, len(rows), tile, d], cast to x's dtype."""
  batch, length, heads, dim = x.shape
  tile = values.shape[3]
  tiles = x.reshape(batch, length // tile, tile, heads, dim)
  values = jnp.transpose(values, (0, 2, 3, 1, 4)).astype(x.dtype)
  return tiles.at[:, rows].set(values).reshape(x.shape)


def _sum_slices(parts: Array, slices: split_visits.Slices) -> Array:
  """[b, H, long · parts, ...] → [b, H, long, ...]: each long row's slices summed."""
  batch, heads, _, *rest = parts.shape
  return parts.reshape(batch, heads, len(slices.rows), slices.parts, *rest).sum(3)


def _combine(out: Array, lse: Array, m: Array, l: Array, acc: Array,
             slices: split_visits.Slices) -> tuple[Array, Array]:
  """out [b, Lq, H, d_v] and lse [b, H, Lq] with the long rows' tiles set from their slices'
  partial softmaxes m, ℓ [b, H, long · parts, block_q] and acc [..., d_v] (base 2):

    m* = maxₛ mₛ,   ℓ = Σₛ e^(mₛ − m*) ℓₛ,   O = Σₛ e^(mₛ − m*) accₛ / ℓ,   lse = m* + log ℓ

  (a row no slice saw anything of: O = 0, lse = +∞, as in the kernel)."""
  batch, heads, _, block_q = m.shape
  m, l, acc = (x.reshape(batch, heads, len(slices.rows), slices.parts, *x.shape[3:])
               for x in (m, l, acc))
  top = m.max(3)
  shift = jnp.where(top == -jnp.inf, 0.0, top)
  weight = jnp.exp2(m - shift[:, :, :, None])
  total = (weight * l).sum(3)
  merged = (weight[..., None] * acc).sum(3) / jnp.where(total > 0, total, 1.0)[..., None]
  merged_lse = jnp.where(total > 0, shift + jnp.log2(total), jnp.inf)
  lse = lse.reshape(batch, heads, -1, block_q).at[:, :, slices.rows].set(merged_lse)
  return _replace_tiles(out, slices.rows, merged), lse.reshape(batch, heads, -1)


def _forward(config: Config, q, k, v, bias, mask, lengths) -> tuple[Array, Array]:
  """Padded q [b, Lq, H, d], k [b, Lk, H_kv, d], v [b, Lk, H_kv, d_v] → out [b, Lq, H, d_v]
  in q's dtype and lse float32 [b, H, Lq].

  For a query tile Q_i [block_q, d] and the key tiles K_j, V_j [block_k, d] it visits:

    S_ij  = scale · Q_i K_jᵀ + B_ij,  −∞ where query q does not see key k      (float32)
    m'    = max(m, rowmax S_ij)                                                (running max)
    ℓ'    = e^(m − m') ℓ + rowsum e^(S_ij − m')                                (running sum)
    acc'  = e^(m − m') acc + e^(S_ij − m') V_j                                 (float32)
    O_i   = acc / ℓ,   lse_i = m + log ℓ   (a row with ℓ = 0 sees no key: O = 0, lse = +∞)

  (in base 2 inside the kernels: S · log₂e and exp2, the GPU's native exponential). A
  long row's slices each stop at (m, ℓ, acc), merged by `_combine`.
  """
  batch, q_len, heads, _ = q.shape
  group = heads // k.shape[2]
  tiles = config.tiling.forward
  plan = _plan(config, tiles, (q_len, k.shape[1]), lengths, False)
  keys = lambda x: pl.BlockSpec((None, x.shape[1], None, x.shape[3]),
                                lambda _, b, h: (b, 0, h // group, 0))
  common = dict(k=(k, keys), v=(v, keys), bias=(bias, _pairwise(1)), mask=(mask, _pairwise(1)))
  query_tile = _rows(tiles.block_q, plan.order)
  outputs = dict(out=(jax.ShapeDtypeStruct((*q.shape[:3], v.shape[3]), q.dtype), query_tile),
                 lse=(jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32),
                      _by_head(tiles.block_q, plan.order)))
  out, lse = _call(_forward_kernel, config, tiles, (q_len // tiles.block_q, batch, heads),
                   dict(q=(q, query_tile), **common, **plan.main), outputs,
                   "pallas_gpu_forward", order=plan.order)
  slices = plan.slices
  if slices is None:
    return out, lse
  count = len(slices.owners)
  rows = jax.ShapeDtypeStruct((batch, heads, count, tiles.block_q), jnp.float32)
  m, l, acc = _call(
      _forward_kernel, config, tiles, (count, batch, heads),
      dict(q=(q, _rows(None)), **common, **plan.sliced),
      dict(m=(rows, _part), l=(rows, _part),
           acc=(jax.ShapeDtypeStruct((*rows.shape, v.shape[3]), jnp.float32), _part)),
      "pallas_gpu_forward_slices")
  return _combine(out, lse, m, l, acc, slices)


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
  Rows with lse = +∞ (no key seen, or padding) have P = 0 and contribute nothing. Each
  kernel's long rows (a query tile holding global rows in dQ, a key tile holding global
  tokens in dK / dV) run as slices whose float32 sums are added up here.
  """
  batch, q_len, heads, _ = q.shape
  kv_len, kv_heads = k.shape[1], k.shape[2]
  group = heads // kv_heads
  d_out = d_out.astype(q.dtype)
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
  dq, ds = _backward_dq(config, q, k, v, bias, mask, lengths, lse, d_out, delta, group)

  # dK, dV: programs (key tile, batch, kv head), looping over the group's query tiles
  tiles = config.tiling.dkv
  plan = _plan(config, tiles, (q_len, kv_len), lengths, True)
  common = dict(q=(q, _rows(None, group=group)), do=(d_out, _rows(None, group=group)),
                lse=(lse, _by_head(None, group=group)),
                delta=(delta, _by_head(None, group=group)),
                bias=(bias, _pairwise(group)), mask=(mask, _pairwise(group)))
  key_tile = _rows(tiles.block_k, plan.order)
  dk, dv = _call(
      _dkv_kernel, config, tiles, (kv_len // tiles.block_k, batch, kv_heads),
      dict(k=(k, key_tile), v=(v, key_tile), **common, **plan.main),
      dict(dk=(jax.ShapeDtypeStruct(k.shape, k.dtype), key_tile),
           dv=(jax.ShapeDtypeStruct(v.shape, v.dtype), key_tile)), "pallas_gpu_dkv",
      order=plan.order)
  slices = plan.slices
  if slices is not None:
    part = lambda x: jax.ShapeDtypeStruct((batch, kv_heads, len(slices.owners), tiles.block_k,
                                           x.shape[3]), jnp.float32)
    dk_parts, dv_parts = _call(
        _dkv_kernel, config, tiles, (len(slices.owners), batch, kv_heads),
        dict(k=(k, _rows(None)), v=(v, _rows(None)), **common, **plan.sliced),
        dict(dk=(part(k), _part), dv=(part(v), _part)), "pallas_gpu_dkv_slices")
    dk = _replace_tiles(dk, slices.rows, _sum_slices(dk_parts, slices))
    dv = _replace_tiles(dv, slices.rows, _sum_slices(dv_parts, slices))
  return dq, dk, dv, ds


def _backward_dq(config: Config, q, k, v, bias, mask, lengths, lse, d_out, delta, group: int):
  """dq and dS (float32 [b, H, Lq, Lk] with a bias, else None): programs (query tile, batch,
  head) looping over key tiles; dS is written on the visited tiles only (it starts from
  zeros), the slices' call continuing the main call's buffer."""
  batch, q_len, heads, _ = q.shape
  kv_len = k.shape[1]
  tiles = config.tiling.dq
  plan = _plan(config, tiles, (q_len, kv_len), lengths, False)
  keys = lambda x: pl.BlockSpec((None, kv_len, None, x.shape[3]),
                                lambda _, b, h: (b, 0, h // group, 0))
  ds_rows = lambda x: pl.BlockSpec((None, None, tiles.block_q, kv_len),
                                   lambda p, b, h: (b, h, plan.order(p), 0))
  ds_whole = lambda x: pl.BlockSpec((None, None, q_len, kv_len), lambda _, b, h: (b, h, 0, 0))
  common = dict(k=(k, keys), v=(v, keys), bias=(bias, _pairwise(1)), mask=(mask, _pairwise(1)))
  held = lambda block: dict(q=(q, _rows(block, plan.order)), do=(d_out, _rows(block, plan.order)),
                            lse=(lse, _by_head(block, plan.order)),
                            delta=(delta, _by_head(block, plan.order)))
  outputs = dict(dq=(jax.ShapeDtypeStruct(q.shape, q.dtype), _rows(tiles.block_q, plan.order)))
  ds = aliases = None
  if bias is not None:
    ds = jnp.zeros((batch, heads, q_len, kv_len), jnp.float32)
    outputs["dbias"] = (jax.ShapeDtypeStruct(ds.shape, ds.dtype), ds_rows)
    aliases = dict(dbias="zeros")
  dq, *ds_out = _call(_dq_kernel, config, tiles, (q_len // tiles.block_q, batch, heads),
                      dict(**held(tiles.block_q), **common, zeros=(ds, ds_rows), **plan.main),
                      outputs, "pallas_gpu_dq", aliases, plan.order)
  ds, slices = (ds_out[0] if ds_out else None), plan.slices
  if slices is None:
    return dq, ds
  outputs = dict(dq=(jax.ShapeDtypeStruct((batch, heads, len(slices.owners), tiles.block_q,
                                           q.shape[3]), jnp.float32), _part))
  if ds is not None:
    outputs["dbias"] = (jax.ShapeDtypeStruct(ds.shape, ds.dtype), ds_whole)
  dq_parts, *ds_out = _call(_dq_kernel, config, tiles, (len(slices.owners), batch, heads),
                            dict(**held(None), **common, zeros=(ds, ds_whole), **plan.sliced),
                            outputs, "pallas_gpu_dq_slices", aliases)
  return (_replace_tiles(dq, slices.rows, _sum_slices(dq_parts, slices)),
          ds_out[0] if ds_out else None)


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
                         interpret: bool, splits: int | None = None,
                         tiling: str | Tiling | None = None) -> Array:
  """The uniform implementation signature (see `research.attention.registry`), and two
  settings of this kernel's own.

  q: [batch, q_len, H, d]; k: [batch, kv_len, H_kv, d]; v: [batch, kv_len, H_kv, d_v];
  bias / mask: None or [batch | 1, H | 1, q_len | 1, kv_len | 1]. Returns
  [batch, q_len, H, d_v] in q's dtype. `interpret`: run Pallas' interpreter
  (the dispatcher sets it for the CPU branch) instead of the Triton kernels. `splits`:
  slices of each long visit-list row (global rows and columns; `split_visits`), None: √ of
  its tiles, 1: none (one program walks the row). `tiling`: TILINGS' name, a Tiling, or
  None ("d128" at head dim 128 in bf16 / f16, else "compact").

  Supports H_kv dividing H (query head h reads kv head h // (H / H_kv)); causal, windows,
  global tokens, key lengths, a boolean mask and a bias (gradient for the bias, none for
  the mask or lengths); float32, bfloat16, float16 (products in the input dtype,
  accumulated in float32; float32 products follow `jax.default_matmul_precision`, TF32 by
  default on a GPU); head dims up to 256. Lengths are padded to the tiles
  (`gpu_tiles.tiles_for`; padded keys masked, padded queries cut off), head dims to a power
  of two ≥ 16 with zeros. The forward and backward kernels are `_forward` and `_backward`;
  `_plan` says which tiles they visit.
  """
  del return_weights  # never asked for: returns_weights=False
  batch, q_len, heads, head_dim = q.shape
  kv_len, d_v = k.shape[1], v.shape[3]
  if max(head_dim, d_v) > MAX_HEAD_DIM:
    raise ValueError(f"pallas_gpu takes head dims up to {MAX_HEAD_DIM}, got {head_dim}, {d_v}")
  if splits is not None and (not isinstance(splits, int) or isinstance(splits, bool)
                             or splits < 1):
    raise ConfigError(f"pallas_gpu: splits must be None (by the row's length) or an int >= 1, "
                      f"got {splits!r}")
  dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
  d_padded, dv_padded = (max(MIN_TILE, power_of_two(n)) for n in (head_dim, d_v))
  nest = None if visibility.sparsity is None else visibility.sparsity.nest
  tiles = tiles_for(block_size, tiling, max(d_padded, dv_padded), dtype.itemsize, q_len, kv_len,
                 nest)
  config = Config(float(scale), visibility._replace(kv_lengths=None), q_len, kv_len, tiles,
                  splits, bool(interpret))
  round_up = lambda n, blocks: -(-n // max(blocks)) * max(blocks)  # to every tile (powers of 2)
  lq = round_up(q_len, [t.block_q for t in tiles])
  lk = round_up(kv_len, [t.block_k for t in tiles])
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
