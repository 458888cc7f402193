"""Accelerator kernels, each registered as an attention implementation at import.

  cudnn.py       NVIDIA's fused flash attention through `jax.nn` (GPU)
  pallas_gpu.py  our flash-attention Pallas kernel, Triton lowering (GPU; interpret mode on a CPU)
  pallas_tpu.py  Pallas TPU splash attention with our patterns as block-sparse masks (TPU;
                 interpret mode on a CPU)

They import only `research.attention.registry` and `masks` (never the dispatcher);
`research.attention.functional` imports this package, so `implementation="auto"` finds
them, and `research.attention.platforms` lowers each for its own platform only. The pure
strategies and the score / pattern modules know nothing about platforms.
"""

from research.attention.kernels import cudnn, pallas_gpu, pallas_tpu  # noqa: F401
