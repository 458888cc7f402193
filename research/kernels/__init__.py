"""Accelerator kernels, each registered as an attention implementation at import.

  cudnn.py       NVIDIA's fused flash attention through `jax.nn` (GPU)
  pallas_gpu.py  our flash-attention Pallas kernel, Triton lowering (GPU; interpret mode elsewhere)
  pallas_tpu.py  Pallas TPU splash attention with our patterns as block-sparse masks (TPU;
                 interpret mode elsewhere)

`research.attention` imports this package, so `implementation="auto"` finds them; the
pure strategies and the score / pattern modules know nothing about platforms.
"""

from research.kernels import cudnn, pallas_gpu, pallas_tpu  # noqa: F401
