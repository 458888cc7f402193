"""Accelerator kernels, each registered as an attention implementation at import: cuDNN's
fused attention (`cudnn.py`), our Triton flash attention (`pallas_gpu.py`) and splash
attention (`pallas_tpu.py`). They import only `research.attention.registry`, `masks` and
their helpers here (`gpu_tiles.py`, `split_visits.py`), never the dispatcher, which imports
this package so that "auto" finds them; `research.attention.platforms` lowers each for its
own platform only, and the portable strategies know nothing about platforms.
"""

from research.attention.kernels import cudnn, pallas_gpu, pallas_tpu  # noqa: F401
