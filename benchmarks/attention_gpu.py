"""The GPU table of `benchmarks/attention.py`: bf16 causal self-attention, forward + backward.

At (B, L, H, d) = (4, 2048, 8, 64), (4, 8192, 8, 64) and (1, 32768, 8, 128), for three
patterns (full causal; causal window 256; causal window 256 + 16 global tokens at positions
0 … 15), times the gradient with respect to q, k and v of

  ours auto / pallas_gpu / cudnn / chunked / banded   research.attention.dot_product_attention
  jax.nn xla / cudnn                                   jax.nn.dot_product_attention (no global tokens)
  torch SDPA                                           full causal only (its window needs a dense mask)
  tokamax                                              tokamax.dot_product_attention, if installed

interleaved round-robin in one process (each timed call runs `--inner` steps, then waits for
the device), and prints median ms, TFLOP/s of the visible work (14 · pairs · d · B · H:
4 in the forward, 10 in the backward, over the (query, key) pairs the pattern shows), the
ratio to torch SDPA (full causal) and the ratio to jax.nn cudnn's window of the same shape
(window rows), the peers of issue 12's goals.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from timing import median_ms

from research.attention import dot_product_attention, registry
from research.attention.masks import Visibility

SHAPES = ((4, 2048, 8, 64), (4, 8192, 8, 64), (1, 32768, 8, 128))
WINDOW, NUM_GLOBAL = 256, 16
PATTERNS = {
    "causal": dict(is_causal=True),
    "window 256": dict(is_causal=True, window=WINDOW),
    "window 256 + 16 global": dict(is_causal=True, window=WINDOW,
                                   global_tokens=tuple(range(NUM_GLOBAL))),
}
XLA_LIMIT_BYTES = 8 * 2**30        # jax.nn xla materialises [B, H, L, L] logits in float32


def visible_pairs(length: int, pattern: dict) -> int:
  """How many (query, key) pairs the pattern shows, counted block by block of 512 rows."""
  visibility = Visibility.make(pattern["is_causal"], pattern.get("window"),
                               global_tokens=pattern.get("global_tokens", ()))
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
  request = registry.Request.of(q, q, q, is_causal=True, window=pattern.get("window"),
                                       global_tokens=pattern.get("global_tokens"))
  for name in ("pallas_gpu", "cudnn", "chunked", "banded"):
    if not registry.get(name).unsupported(request):
      found[f"ours {name}"] = functools.partial(dot_product_attention, implementation=name,
                                                **pattern)
  if "global_tokens" not in pattern:
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


def jax_step(attention, q, k, v, cotangent, inner: int):
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.vdot(attention(q, k, v), cotangent).real,
                          (0, 1, 2)))

  def run():
    for _ in range(inner):
      out = grad(q, k, v)
    jax.block_until_ready(out)
  return run


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


def main(args):
  import torch  # noqa: PLC0415
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__}; "
        f"bf16 causal self-attention fwd+bwd; medians of {args.repeats} interleaved rounds "
        f"of {args.inner} steps\n")
  print("| B, L, H, d | pattern | implementation | ms | TFLOP/s | / torch | / jax.nn cudnn |")
  print("|---|---|---|---|---|---|---|")
  for shape in SHAPES:
    batch, length, heads, d = shape
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)
              for _ in range(4)]
    for pattern_name in PATTERNS:
      steps = {name: jax_step(attention, *arrays, args.inner)
               for name, attention in candidates(shape, pattern_name).items()}
      if pattern_name == "causal":
        steps["torch SDPA"] = torch_step(arrays, args.inner)
      ms = {name: t / args.inner for name, t in median_ms(steps, args.repeats, 0.0).items()}
      flop = 14 * visible_pairs(length, PATTERNS[pattern_name]) * d * batch * heads
      for name, time in ms.items():
        to_torch = f"{time / ms['torch SDPA']:.2f}" if "torch SDPA" in ms else "—"
        to_cudnn = f"{time / ms['jax.nn cudnn']:.2f}" if "jax.nn cudnn" in ms else "—"
        print(f"| {batch}, {length}, {heads}, {d} | {pattern_name} | {name} | {time:.2f} | "
              f"{flop / time / 1e9:.0f} | {to_torch} | {to_cudnn} |", flush=True)
