"""The GPU table of `benchmarks/attention.py`: bf16 causal self-attention, forward + backward.

At (B, L, H, d) = (4, 2048, 8, 64), (4, 8192, 8, 64) and (1, 32768, 8, 128), for four
patterns (full causal; causal window 256; causal window 256 + 16 global tokens at positions
0 … 15; causal BigBird: blocks of 64, a window of 3 blocks, 2 global and 3 random blocks,
LRA's setting), times the gradient with respect to q, k and v of

  ours auto / pallas_gpu / cudnn / chunked / banded   research.attention.dot_product_attention
  jax.nn xla / cudnn                                   jax.nn.dot_product_attention (no global tokens)
  torch SDPA                                           full causal only (its window needs a dense mask)
  tokamax                                              tokamax.dot_product_attention, if installed

interleaved round-robin in one process (each timed call runs up to `--inner` steps, fewer
for a slow candidate so that a call lasts about 50 ms, then waits for the device; the
candidates of a shape compile side by side in threads), and prints median ms, TFLOP/s of
the visible work (14 · pairs · d · B · H: 4 in the forward, 10 in the backward, over the
(query, key) pairs the pattern shows), the ratio to torch SDPA (full causal) and the ratio
to jax.nn cudnn's window of the same shape (window rows). The last lines check the goals:
auto within 1.1× the faster of cuDNN and SDPA (causal), within 1.25× cuDNN's window
(window rows), and our Triton kernel with global tokens or BigBird at 50% or more of
cuDNN's dense causal TFLOP/s at the same shape.
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
from research.attention.masks import Visibility

SHAPES = ((4, 2048, 8, 64), (4, 8192, 8, 64), (1, 32768, 8, 128))
WINDOW, NUM_GLOBAL = 256, 16
PATTERNS = {
    "causal": dict(is_causal=True),
    "window 256": dict(is_causal=True, window=WINDOW),
    "window 256 + 16 global": dict(is_causal=True, window=WINDOW,
                                   global_tokens=tuple(range(NUM_GLOBAL))),
    "BigBird": dict(is_causal=True, sparsity=BigBird(block=64, window=3, global_blocks=2,
                                                     random_blocks=3)),
}
XLA_LIMIT_BYTES = 8 * 2**30        # jax.nn xla materialises [B, H, L, L] logits in float32


def visible_pairs(length: int, pattern: dict) -> int:
  """How many (query, key) pairs the pattern shows, counted block by block of 512 rows."""
  sparsity = pattern.get("sparsity")
  if sparsity is not None:
    sparsity = sparsity.bind(length, length, pattern["is_causal"])
  visibility = Visibility.make(pattern["is_causal"], pattern.get("window"),
                               global_tokens=pattern.get("global_tokens", ()), sparsity=sparsity)
  pairs = 0
  for start in range(0, length, 512):
    pairs += int(np.asarray(visibility.dense(min(512, length - start), length, q_start=start)).sum())
  return pairs


def candidates(shape, pattern_name: str) -> dict:
  """name -> attention(q, k, v) for one shape and pattern."""
  batch, length, heads, _ = shape
  pattern = PATTERNS[pattern_name]
  found = {"ours auto": functools.partial(dot_product_attention, **pattern)}
  q = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  sparsity = pattern.get("sparsity")
  request = registry.Request.of(
      q, q, q, is_causal=True, window=pattern.get("window"),
      global_tokens=pattern.get("global_tokens"),
      sparsity=None if sparsity is None else sparsity.bind(length, length, True))._replace(platform="gpu")
  for name in ("pallas_gpu", "cudnn", "chunked", "banded"):
    if not registry.get(name).unsupported(request):
      found[f"ours {name}"] = functools.partial(dot_product_attention, implementation=name,
                                                **pattern)
  if "global_tokens" not in pattern and "sparsity" not in pattern:
    window = None if "window" not in pattern else (WINDOW, 0)
    if 4 * batch * heads * length * length <= XLA_LIMIT_BYTES:
      found["jax.nn xla"] = lambda q, k, v: jax.nn.dot_product_attention(
          q, k, v, is_causal=True, local_window_size=window, implementation="xla")
    found["jax.nn cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, local_window_size=window, implementation="cudnn")
  try:
    import tokamax  # noqa: PLC0415 - optional peer
  except ImportError:
    return found
  if pattern_name == "causal":
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
    if name == "ours pallas_gpu" and pattern in ("window 256 + 16 global", "BigBird") and dense:
      share = rate / dense
      lines.append(f"{shape} {pattern}: pallas_gpu at {share:.0%} of jax.nn cudnn's dense "
                   f"causal TFLOP/s ({'meets' if share >= 0.5 else 'misses'} the goal of 50%)")
  return lines


def main(args):
  import torch  # noqa: PLC0415
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__}; "
        f"bf16 causal self-attention fwd+bwd; medians of {args.repeats} interleaved rounds "
        f"of up to {args.inner} steps (the steps column)\n")
  print("| B, L, H, d | pattern | implementation | ms | TFLOP/s | / torch | / jax.nn cudnn | steps |")
  print("|---|---|---|---|---|---|---|---|")
  all_ms, all_tflops = {}, {}
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    for shape in SHAPES:
      batch, length, heads, d = shape
      rng = np.random.default_rng(0)
      arrays = [jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)
                for _ in range(4)]
      lowered = {(pattern_name, name): lowered_step(attention, *arrays)
                 for pattern_name in PATTERNS
                 for name, attention in candidates(shape, pattern_name).items()}
      compiled = dict(zip(lowered, pool.map(lambda step: step.compile(), lowered.values())))
      for pattern_name in PATTERNS:
        steps, inner = {}, {}
        for (pattern, name), step in compiled.items():
          if pattern == pattern_name:
            steps[name], inner[name] = timed_step(step, arrays, args.inner)
        if pattern_name == "causal":
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
