"""One traced call, a program per platform: `auto` and each named kernel lowered for
their platforms from this CPU through the public API (`jax.jit(...).trace(...).lower(
lowering_platforms=...)`), a named kernel refused when lowered for a platform it cannot
run on, and a model exported for CPU, GPU and TPU at once (`jax.export`), whose CPU part
runs here and equals the model."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from research.attention import MultiHeadAttention, dot_product_attention, platforms, registry

pytestmark = pytest.mark.usefixtures("highest_precision")

TPU, TRITON, CUDNN = "tpu_custom_call", "__gpu$xla.gpu.triton", "__cudnn$fmha"
# The tests and cases marked `aot` lower cuDNN's kernel for CUDA: they need the `aot` extra's
# toolchains (tests/conftest.py skips them where those are missing).


def _kernels(lowered) -> str:
  """The custom-call targets of a lowered program, space-separated."""
  return " ".join(sorted(set(re.findall(r"custom_call @([\w$.]+)", lowered.as_text()))))


def _inputs(dtype, length=256, heads=2, d=64):
  rng = np.random.default_rng(0)
  return tuple(jnp.asarray(rng.standard_normal((2, length, heads, d)), dtype) for _ in range(3))


@pytest.mark.parametrize("dtype, pattern, expected", [
    ("float32", dict(is_causal=True), {"cpu": "", "tpu": TPU, "cuda": TRITON}),
    pytest.param("bfloat16", dict(is_causal=True), {"cpu": "", "tpu": TPU, "cuda": CUDNN},
                 marks=pytest.mark.aot),
    ("bfloat16", dict(is_causal=True, window=32, global_tokens=[0, 1]),
     {"cpu": "", "tpu": TPU, "cuda": TRITON}),        # cuDNN has no global tokens
    ("float32", dict(bias=True), {"cpu": "", "tpu": "", "cuda": TRITON}),   # splash: no bias
], ids=["f32_causal", "bf16_causal", "bf16_window_global", "f32_bias"])
def test_auto_lowers_to_each_platforms_kernel(dtype, pattern, expected):
  q, k, v = _inputs(dtype)
  if pattern.pop("bias", False):
    pattern["bias"] = jnp.zeros((1, 1, 256, 256), jnp.float32)
  traced = jax.jit(lambda q: dot_product_attention(q, k, v, **pattern)).trace(q)
  grad = jax.jit(jax.grad(lambda q: dot_product_attention(q, k, v, **pattern).astype(
      jnp.float32).sum())).trace(q)
  for platform, kernel in expected.items():
    forward = _kernels(traced.lower(lowering_platforms=(platform,)))
    backward = _kernels(grad.lower(lowering_platforms=(platform,)))
    if kernel:
      assert kernel in forward and kernel in backward, (platform, forward, backward)
    else:
      assert not any(k in forward + backward for k in (TPU, TRITON, CUDNN)), (platform, forward)


@pytest.mark.parametrize("name, dtype, native, kernel", [
    ("pallas_tpu", "float32", "tpu", TPU),
    ("pallas_gpu", "float32", "cuda", TRITON),
    pytest.param("cudnn", "bfloat16", "cuda", CUDNN, marks=pytest.mark.aot),
])
def test_a_named_kernel_is_the_real_one_on_its_platform_and_refused_elsewhere(name, dtype, native,
                                                                             kernel):
  q, k, v = _inputs(dtype, length=128)
  traced = jax.jit(lambda q: dot_product_attention(q, k, v, is_causal=True,
                                                   implementation=name)).trace(q)
  assert kernel in _kernels(traced.lower(lowering_platforms=(native,)))
  for platform in {"cpu", "cuda", "tpu"} - {native}:
    if platforms.LOWERING[platform] in registry.get(name).interpreted:   # Pallas' interpreter:
      lowered = traced.lower(lowering_platforms=(platform,))      # pallas_gpu on a CPU,
      assert not _kernels(lowered) and "while" in lowered.as_text()   # pallas_tpu on a CPU or GPU
      continue
    with pytest.raises(registry.ImplementationError, match=f"implementation='{name}' cannot"):
      traced.lower(lowering_platforms=(platform,))


@pytest.mark.aot
def test_a_gpu_below_compute_capability_8_gets_neither_cudnn_nor_triton():
  """A T4 (7.5): cuDNN's flash attention and XLA's Triton need 8.0, so auto goes portable."""
  q, k, v = _inputs("bfloat16")
  with registry.compiling_for("gpu", (7, 5)):
    traced = jax.jit(lambda q: dot_product_attention(q, k, v, is_causal=True)).trace(q)
  assert not _kernels(traced.lower(lowering_platforms=("cuda",)))
  with registry.compiling_for("gpu", (8, 0)):
    traced = jax.jit(lambda q: dot_product_attention(q, k, v, is_causal=True)).trace(q)
  assert CUDNN in _kernels(traced.lower(lowering_platforms=("cuda",)))


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return MultiHeadAttention(num_heads=2, dtype=jnp.bfloat16)(x, is_causal=True) + x


@pytest.mark.aot
def test_a_model_exported_for_three_platforms_holds_each_kernel_and_runs_here():
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 256, 128)), jnp.bfloat16)
  model = _Block()
  params = model.init(jax.random.key(0), x)
  exported = export.export(jax.jit(model.apply), platforms=("cpu", "cuda", "tpu"),
                           disabled_checks=platforms.export_checks_to_disable())(params, x)
  assert exported.platforms == ("cpu", "cuda", "tpu")
  text = exported.mlir_module()
  assert TPU in text and CUDNN in text
  np.testing.assert_allclose(np.asarray(exported.call(params, x), np.float32),
                             np.asarray(model.apply(params, x), np.float32), atol=1e-2)
