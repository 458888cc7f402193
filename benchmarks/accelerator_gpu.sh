#!/usr/bin/env bash
# The accelerator report on a lent GPU machine whose image has JAX, torch and the test tools
# but not every package the project needs (docs/accelerators.md, "The accelerator report"):
#   bash benchmarks/accelerator_gpu.sh OUTPUT_DIR
# installs the wheels of .whl/ (prepared on a machine with a network) whose distributions the
# image lacks, puts the project on PYTHONPATH, and writes OUTPUT_DIR/accelerator_report.md
# and OUTPUT_DIR/artifacts/ (benchmarks/accelerator.py).
set -u
out=${1:?usage: bash benchmarks/accelerator_gpu.sh OUTPUT_DIR}
mkdir -p "$out/artifacts"
missing=$(python3 - <<'PY'
import glob, importlib.metadata, os
for wheel in sorted(glob.glob(".whl/*.whl")):
  name = os.path.basename(wheel).split("-")[0]
  try:
    importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    print(wheel)
PY
)
if [ -n "$missing" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $missing
fi
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -m pip list 2>/dev/null; } > "$out/artifacts/machine.txt" 2>&1
python3 benchmarks/accelerator.py --output "$out/accelerator_report.md" --artifacts "$out/artifacts"
