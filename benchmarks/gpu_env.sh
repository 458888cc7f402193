# Sourced by the scripts run on a lent GPU machine (accelerator_gpu.sh, gpu_pass2.sh), from the
# project root: installs the wheels of .whl/ whose distributions the image lacks (prepared
# beforehand by `bash ../shared/gpu/wheels.sh`, carried with the call), and puts the project
# on PYTHONPATH with the settings several processes sharing one GPU need.
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
  # shellcheck disable=SC2086  # one argument per wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $missing
fi
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
