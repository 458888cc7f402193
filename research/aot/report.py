"""What a compiled step needs on one device, and what is in it: `analyze(compiled,
memory_bytes)` reads XLA's own accounts of a compiled executable (its memory, whether it
fits, its custom-call kernels, collectives and FLOPs).
"""

import collections
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
_OP = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")   # the op, not its users


def memory(compiled) -> dict[str, int]:
  """Per-device bytes of a compiled executable (see `analyze`)."""
  m = compiled.memory_analysis()
  sizes = {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
           "temp": m.temp_size_in_bytes, "code": m.generated_code_size_in_bytes}
  sizes["total"] = sum(sizes.values()) - m.alias_size_in_bytes
  return sizes


def analyze(compiled, memory_bytes: int) -> dict:
  """The report of one compiled step on a device of `memory_bytes`:

    bytes      per device: arguments, outputs, temporaries, generated code, and their total
               less the donated buffers the outputs reuse (XLA's `memory_analysis()`)
    fits       total <= the device's memory
    kernels    the custom-call targets in the optimized program: Mosaic (tpu_custom_call,
               splash attention and our Pallas TPU kernels), Triton (__gpu$xla.gpu.triton),
               cuDNN fused attention (__cudnn$fmha…), cuBLAS GEMMs (__cublas$gemm) …
    collectives  all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    flops      XLA's count (`cost_analysis()`) where the backend gives one (TPU; a GPU
               target's is empty, and a Pallas call counts only with a cost estimate)
  """
  text = compiled.as_text()
  sizes = memory(compiled)
  costs = compiled.cost_analysis() or {}
  costs = costs[0] if isinstance(costs, list) else costs
  flops = costs.get("flops")
  return {"bytes": sizes, "chip_memory_bytes": memory_bytes,
          "fits": sizes["total"] <= memory_bytes,
          "kernels": dict(sorted(collections.Counter(_CUSTOM_CALL.findall(text)).items())),
          "collectives": dict(sorted(collections.Counter(_OP.findall(text)).items())),
          "flops": float(flops) if flops and flops > 0 else None}
