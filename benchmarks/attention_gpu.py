"""The GPU table of `benchmarks/attention.py`: bf16 causal self-attention, forward + backward.

At (B, L, H, d) = (4, 2048, 8, 64), (4, 8192, 8, 64) and (1, 32768, 8, 128) (`--gpu_shapes`
by L), for four patterns (`--patterns`: causal, full causal; window, causal window 256;
global, causal window 256 + 16 global tokens at positions 0 … 15; bigbird, causal BigBird:
blocks of 64, a window of 3 blocks, 2 global and 3 random blocks, LRA's setting), times the
gradient with respect to q, k and v of (`--candidates`: auto, pallas_gpu, cudnn, chunked,
banded, xla, jax_cudnn, torch, tokamax)

  ours auto / pallas_gpu / cudnn / chunked / banded   research.attention.dot_product_attention
  jax.nn xla / cudnn                                   jax.nn.dot_product_attention (no global tokens)
  torch SDPA                                           full causal only (its window needs a dense mask)
  tokamax                                              tokamax.dot_product_attention, if installed
  ours pallas_gpu VARIANT                              our Triton kernel with other settings
                                                       (`--variants`, VARIANTS): its long rows
                                                       not split, other tilings at d = 128

interleaved round-robin in one process (each timed call runs up to `--inner` steps, fewer
for a slow candidate so that a call lasts about 50 ms, then waits for the device; the
candidates of a shape compile side by side in threads), and prints median ms, TFLOP/s of
the visible work (14 · pairs · d · B · H: 4 in the forward, 10 in the backward, over the
(query, key) pairs the pattern shows), the ratio to torch SDPA (full causal) and the ratio
to jax.nn cudnn's window of the same shape (window rows). The last lines check the goals:
auto within 1.1× the faster of cuDNN and SDPA (causal), within 1.25× cuDNN's window
(window rows), and our Triton kernel with global tokens or BigBird at 50% or more of
cuDNN's dense causal TFLOP/s at the same shape, and our Triton kernel (each variant) at d =
128, dense causal, at 60% or more of cuDNN's.

`--rehearse` runs this table's code on a CPU at tiny shapes (REHEARSAL_SHAPES), our Pallas
kernel interpreted and the GPU-only peers (cuDNN, torch on CUDA, tokamax) left out: a check
that a GPU call will not stop on a typo, no measurement.
"""

import concurrent.futures
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from timing import median_ms

from research.attention import dot_product_attention, registry
from research.attention.block_sparse import BigBird
from research.attention.kernels import pallas_gpu
from research.attention.kernels.gpu_tiles import Tiles, Tiling
from research.attention.masks import Visibility

SHAPES = {2048: (4, 2048, 8, 64), 8192: (4, 8192, 8, 64), 32768: (1, 32768, 8, 128)}
REHEARSAL_SHAPES = {2048: (1, 128, 2, 64), 8192: (1, 256, 2, 64), 32768: (1, 256, 1, 128)}
WINDOW, NUM_GLOBAL = 256, 16
PATTERNS = {
    "causal": dict(is_causal=True),
    "window 256": dict(is_causal=True, window=WINDOW),
    "window 256 + 16 global": dict(is_causal=True, window=WINDOW,
                                   global_tokens=tuple(range(NUM_GLOBAL))),
    "BigBird": dict(is_causal=True, sparsity=BigBird(block=64, window=3, global_blocks=2,
                                                     random_blocks=3)),
}
PATTERN_NAMES = dict(zip(("causal", "window", "global", "bigbird"), PATTERNS))  # --patterns
CANDIDATES = ("auto", "pallas_gpu", "cudnn", "chunked", "banded", "xla", "jax_cudnn", "torch",
              "tokamax")
GPU_ONLY = ("cudnn", "jax_cudnn", "torch", "tokamax")
# Our Triton kernel with other settings, beside its default (`--variants`): {name: (its
# pallas_gpu_attention settings, the patterns it is timed on, the head dims)}. "splits=1":
# every long row one program (the kernel before issue 49); "compact": the tiling before
# issue 49 at d = 128; the rest: d = 128 tilings beside "d128" (forward, dQ, dK / dV tiles).
GLOBAL_PATTERNS = ("window 256 + 16 global", "BigBird")
VARIANTS = {
    "splits=1": (dict(splits=1), GLOBAL_PATTERNS, (64, 128)),
    "compact": (dict(tiling="compact"), tuple(PATTERNS), (128,)),
    "fwd 128x128": (dict(tiling=Tiling(Tiles(128, 128, 8, 2), Tiles(128, 32, 8, 2),
                                       Tiles(32, 128, 8, 2))), ("causal",), (128,)),
    "bwd 64": (dict(tiling=Tiling(Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 2),
                                  Tiles(64, 128, 8, 2))), ("causal",), (128,)),
    "bwd 3 stages": (dict(tiling=Tiling(Tiles(128, 64, 8, 3), Tiles(128, 32, 8, 3),
                                        Tiles(32, 128, 8, 3))), ("causal",), (128,)),
}
XLA_LIMIT_BYTES = 8 * 2**30        # jax.nn xla materialises [B, H, L, L] logits in float32


def visible_pairs(length: int, pattern: dict) -> int:
  """How many (query, key) pairs the pattern shows, counted block by block of 512 rows."""
  visibility = _visibility(length, pattern)
  pairs = 0
  for start in range(0, length, 512):
    pairs += int(np.asarray(visibility.dense(min(512, length - start), length, q_start=start)).sum())
  return pairs


def _visibility(length: int, pattern: dict) -> Visibility:
  sparsity = pattern.get("sparsity")
  if sparsity is not None:
    sparsity = sparsity.bind(length, length, pattern["is_causal"])
  return Visibility.make(pattern["is_causal"], pattern.get("window"),
                         global_tokens=pattern.get("global_tokens", ()), sparsity=sparsity)


def variant(shape, pattern: dict, settings: dict, interpret: bool):
  """attention(q, k, v) of our Triton kernel called directly with `settings`."""
  visibility = _visibility(shape[1], pattern)
  return lambda q, k, v: pallas_gpu.pallas_gpu_attention(
      q, k, v, scale=shape[3] ** -0.5, bias=None, mask=None, visibility=visibility,
      block_size=None, return_weights=False, interpret=interpret, **settings)


def candidates(shape, pattern_name: str, chosen=CANDIDATES, variants=(), gpu: bool = True
               ) -> dict:
  """name -> attention(q, k, v) for one shape and pattern: the `chosen` candidates (on a
  CPU, `gpu` False, those that run there) and our kernel's `variants` that apply."""
  batch, length, heads, head_dim = shape
  pattern = PATTERNS[pattern_name]
  chosen = [c for c in chosen if gpu or c not in GPU_ONLY]
  found = {}
  if "auto" in chosen:
    found["ours auto"] = functools.partial(dot_product_attention, **pattern)
  q = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  sparsity = pattern.get("sparsity")
  request = registry.Request.of(
      q, q, q, is_causal=True, window=pattern.get("window"),
      global_tokens=pattern.get("global_tokens"),
      sparsity=None if sparsity is None else sparsity.bind(length, length, True))._replace(platform="gpu")
  for name in ("pallas_gpu", "cudnn", "chunked", "banded"):
    if name in chosen and not registry.get(name).unsupported(request):
      found[f"ours {name}"] = functools.partial(dot_product_attention, implementation=name,
                                                **pattern)
  for name in variants:
    settings, patterns, head_dims = VARIANTS[name]
    if pattern_name in patterns and head_dim in head_dims:
      found[f"ours pallas_gpu {name}"] = variant(shape, pattern, settings, not gpu)
  if "global_tokens" not in pattern and "sparsity" not in pattern:
    window = None if "window" not in pattern else (WINDOW, 0)
    if "xla" in chosen and 4 * batch * heads * length * length <= XLA_LIMIT_BYTES:
      found["jax.nn xla"] = lambda q, k, v: jax.nn.dot_product_attention(
          q, k, v, is_causal=True, local_window_size=window, implementation="xla")
    if "jax_cudnn" in chosen:
      found["jax.nn cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(
          q, k, v, is_causal=True, local_window_size=window, implementation="cudnn")
  if "tokamax" not in chosen or pattern_name != "causal":
    return found
  try:
    import tokamax  # noqa: PLC0415 - optional peer
  except ImportError:
    return found
  found["tokamax"] = lambda q, k, v: tokamax.dot_product_attention(q, k, v, is_causal=True)
  return found


def lowered_step(attention, q, k, v, cotangent):
  """The forward + backward of `attention`, lowered (compiled by `timed_step`)."""
  return jax.jit(jax.grad(lambda q, k, v: jnp.vdot(attention(q, k, v), cotangent).real,
                          (0, 1, 2))).lower(q, k, v)


def timed_step(compiled, arrays, inner: int):
  """(fn running `n` steps then waiting for the device, n): n ≤ inner steps of about 50 ms
  in all, from one warm-up step's time."""
  q, k, v, _ = arrays
  jax.block_until_ready(compiled(q, k, v))
  start = time.perf_counter()
  jax.block_until_ready(compiled(q, k, v))
  steps = max(1, min(inner, round(0.05 / (time.perf_counter() - start))))

  def run():
    for _ in range(steps):
      out = compiled(q, k, v)
    jax.block_until_ready(out)
  return run, steps


def torch_step(arrays, inner: int):
  import torch  # noqa: PLC0415 - only on the GPU table
  tq, tk, tv, tg = (torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda().to(torch.bfloat16)
                    .transpose(1, 2).contiguous() for x in arrays)
  for t in (tq, tk, tv):
    t.requires_grad_()

  def run():
    for _ in range(inner):
      for t in (tq, tk, tv):
        t.grad = None
      torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)
    torch.cuda.synchronize()
  return run


def goals(ms: dict, tflops: dict) -> list[str]:
  """The goal lines, from {(shape, pattern, name): ms} and the same of TFLOP/s."""
  lines = []
  for (shape, pattern, name), took in ms.items():
    if name != "ours auto":
      continue
    peers = {n: ms.get((shape, pattern, n)) for n in ("jax.nn cudnn", "torch SDPA")}
    peers = {n: t for n, t in peers.items() if t is not None}
    if pattern == "causal" and peers:
      best = min(peers, key=peers.get)
      ratio = took / peers[best]
      lines.append(f"{shape} causal: auto / {best} (the faster peer) = {ratio:.2f} "
                   f"({'meets' if ratio <= 1.1 else 'misses'} the goal of 1.1)")
    if pattern.startswith("window 256") and "+" not in pattern and "jax.nn cudnn" in peers:
      ratio = took / peers["jax.nn cudnn"]
      lines.append(f"{shape} {pattern}: auto / jax.nn cudnn = {ratio:.2f} "
                   f"({'meets' if ratio <= 1.25 else 'misses'} the goal of 1.25)")
  for (shape, pattern, name), rate in tflops.items():
    dense = tflops.get((shape, "causal", "jax.nn cudnn"))
    if not name.startswith("ours pallas_gpu") or not dense:
      continue
    share, kernel = rate / dense, name.removeprefix("ours ")
    if pattern in GLOBAL_PATTERNS:
      lines.append(f"{shape} {pattern}: {kernel} at {share:.0%} of jax.nn cudnn's dense "
                   f"causal TFLOP/s ({'meets' if share >= 0.5 else 'misses'} the goal of 50%)")
    if pattern == "causal" and shape[3] == 128:
      lines.append(f"{shape} causal: {kernel} at {share:.0%} of jax.nn cudnn's TFLOP/s "
                   f"({'meets' if share >= 0.6 else 'misses'} the goal of 60%)")
  return lines


def inputs(shape) -> list:
  """q, k, v and the output cotangent, standard normal in bfloat16."""
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)
          for _ in range(4)]


def main(args):
  import torch  # noqa: PLC0415
  gpu = not args.rehearse
  shapes = [(SHAPES if gpu else REHEARSAL_SHAPES)[length] for length in args.gpu_shapes]
  patterns = [PATTERN_NAMES[name] for name in args.patterns]
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__}; "
        f"bf16 causal self-attention fwd+bwd; medians of {args.repeats} interleaved rounds "
        f"of up to {args.inner} steps (the steps column)"
        + ("" if gpu else "; a rehearsal on a CPU: tiny shapes, our Pallas kernel "
           "interpreted, no GPU-only peer") + "\n")
  print("| B, L, H, d | pattern | implementation | ms | TFLOP/s | / torch | / jax.nn cudnn | steps |")
  print("|---|---|---|---|---|---|---|---|")
  all_ms, all_tflops = {}, {}
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    for shape in shapes:
      batch, length, heads, d = shape
      arrays = inputs(shape)
      lowered = {(pattern_name, name): lowered_step(attention, *arrays)
                 for pattern_name in patterns
                 for name, attention in candidates(shape, pattern_name, args.candidates,
                                                   args.variants, gpu).items()}
      compiled = dict(zip(lowered, pool.map(lambda step: step.compile(), lowered.values())))
      for pattern_name in patterns:
        steps, inner = {}, {}
        for (pattern, name), step in compiled.items():
          if pattern == pattern_name:
            steps[name], inner[name] = timed_step(step, arrays, args.inner)
        if pattern_name == "causal" and gpu and "torch" in args.candidates:
          steps["torch SDPA"], inner["torch SDPA"] = torch_step(arrays, args.inner), args.inner
        ms = {name: t / inner[name] for name, t in median_ms(steps, args.repeats, 0.0).items()}
        flop = 14 * visible_pairs(length, PATTERNS[pattern_name]) * d * batch * heads
        for name, took in ms.items():
          to_torch = f"{took / ms['torch SDPA']:.2f}" if "torch SDPA" in ms else "—"
          to_cudnn = f"{took / ms['jax.nn cudnn']:.2f}" if "jax.nn cudnn" in ms else "—"
          all_ms[shape, pattern_name, name] = took
          all_tflops[shape, pattern_name, name] = flop / took / 1e9
          print(f"| {batch}, {length}, {heads}, {d} | {pattern_name} | {name} | {took:.2f} | "
                f"{flop / took / 1e9:.0f} | {to_torch} | {to_cudnn} | {inner[name]} |", flush=True)
  print("\nGoals:")
  for line in goals(all_ms, all_tflops):
    print(f"- {line}")
