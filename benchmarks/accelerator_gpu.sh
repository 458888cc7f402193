#!/usr/bin/env bash
# The accelerator report on a lent GPU machine whose image has JAX, torch and the test tools
# but not every package the project needs (docs/accelerators.md, "The accelerator report"):
#   bash benchmarks/accelerator_gpu.sh OUTPUT_DIR
# installs the wheels of .whl/ whose distributions the image lacks and puts the project on
# PYTHONPATH (benchmarks/gpu_env.sh), and writes OUTPUT_DIR/accelerator_report.md
# and OUTPUT_DIR/artifacts/ (benchmarks/accelerator.py).
set -u
out=${1:?usage: bash benchmarks/accelerator_gpu.sh OUTPUT_DIR}
mkdir -p "$out/artifacts"
source benchmarks/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -m pip list 2>/dev/null; } > "$out/artifacts/machine.txt" 2>&1
python3 benchmarks/accelerator.py --output "$out/accelerator_report.md" --artifacts "$out/artifacts"
