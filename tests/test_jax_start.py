"""jax_start's probe for a visible NVIDIA GPU or TPU chip, which reads files and starts no
backend, the CPU alone where it sees none, and the CUDA plugin's notices left out of every
entry point's output where no GPU is visible."""

import importlib.util
import os
import subprocess
import sys

import jax
import pytest
from tiers import long_cases

from research import jax_start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, text: str = "") -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_the_probe_reads_nvidia_device_files_and_tpu_chips_pci_ids(tmp_path):
  assert jax_start.visible_accelerator(str(tmp_path)) == "none"
  nic = tmp_path / "sys/bus/pci/devices/0000:00:04.0"
  _write(nic / "vendor", "0x1ae0\n")          # Google's, but a network card (gVNIC)
  _write(nic / "device", "0x0042\n")
  _write(tmp_path / "sys/bus/pci/devices/0000:00:05.0/vendor", "0x8086\n")
  _write(tmp_path / "sys/bus/pci/devices/0000:00:05.0/device", "0x0063\n")
  assert jax_start.visible_accelerator(str(tmp_path)) == "none"
  _write(tmp_path / "sys/bus/pci/devices/0000:00:06.0/vendor", "0x1ae0\n")
  _write(tmp_path / "sys/bus/pci/devices/0000:00:06.0/device", "0x0063\n")   # a TPU v5e
  assert jax_start.visible_accelerator(str(tmp_path)) == "tpu"
  for name in ("nvidia0", "nvidiactl", "dxg"):
    gpu = tmp_path / name
    _write(gpu / "dev" / name)
    assert jax_start.visible_accelerator(str(gpu)) == "gpu"


def test_the_probe_sees_what_jax_runs_on_here():
  """'none' on a machine without a GPU or TPU (JAX then runs on the CPU), else its kind."""
  if os.environ.get("JAX_PLATFORMS"):
    pytest.skip("JAX_PLATFORMS chooses the backend here, not the probe")
  expected = {"cpu": "none"}.get(jax.default_backend(), jax.default_backend())
  assert jax_start.visible_accelerator() == expected


@pytest.mark.slow
def test_jax_starts_the_cpu_alone_where_the_probe_sees_no_accelerator():
  code = ("from research import jax_start; jax_start.cpu_unless_accelerators(); import jax; "
          "print(jax.config.jax_platforms or '')")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=True)
  expected = "cpu" if jax_start.visible_accelerator() == "none" else ""
  assert result.stdout.strip() == expected


# ---- Quiet on a machine without a GPU: the CUDA plugin's notices left out ---------------

# What the CUDA plugin (jax-cuda12-plugin 0.10.2) writes without an NVIDIA driver, as
# `import jax; jax.devices()` printed it on a CPU machine (the traceback shortened).
NO_GPU_NOTICES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795986863.076809   20190 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda12.initialize()",
    "RuntimeError: Unable to load CUDA. Is it installed?",
]


def test_the_plugins_no_driver_lines_are_left_out_and_every_other_line_kept():
  preamble, notice = NO_GPU_NOTICES[:2]
  other = "E0000 00:00:1795986864.274008   20190 common_lib.cc:554] INVALID_ARGUMENT: a log"
  text = "".join(f"{line}\n" for line in [
      preamble, notice, "a warning of ours", preamble, notice, preamble, other,
      f"{notice} (and more)", preamble])
  assert jax_start.without_cuda_notices(text) == (
      f"a warning of ours\n{preamble}\n{other}\n{notice} (and more)\n{preamble}\n")
  assert jax_start.without_cuda_notices(f"{preamble}\r\n{notice}\r\nend") == "end"


def test_the_notices_are_expected_only_where_no_gpu_is_visible(tmp_path):
  """The plugin is left alone where a GPU is visible or CUDA is asked for."""
  plugin = any(importlib.util.find_spec(name) for name in jax_start.CUDA_PLUGINS)
  for platforms in ("", "cpu", "tpu,cpu"):
    assert jax_start.cuda_notices_expected(str(tmp_path), platforms) == plugin
  for platforms in ("cuda", "gpu,cpu"):
    assert not jax_start.cuda_notices_expected(str(tmp_path), platforms)
  _write(tmp_path / "dev/nvidia0")
  assert not jax_start.cuda_notices_expected(str(tmp_path), "")


SHOWS_DEVICES = "import jax; print(jax.devices()); print(jax.numpy.arange(3).sum())"
# The project's entry points, each as a user starts it (python3 project.py test: pytest).
ENTRY_POINTS = {
    "research": ["-c", f"import research.training, research.predict; {SHOWS_DEVICES}"],
    "notebook": ["-c", "import sys; sys.path.insert(0, 'notebooks'); import colab; "   # cells 1, 2
                 "import matplotlib.pyplot; from research.training import apply_overrides; "
                 f"{SHOWS_DEVICES}"],
    "launch": ["launch.py", "--config", "experiments/lra.py:task=bogus"],
    "benchmark": ["benchmarks/attention.py", "--help"],
    "pytest": ["-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider",
               "tests/test_jax_start.py", "-k", "probe_reads"],
}


@pytest.mark.aot
@pytest.mark.slow
@pytest.mark.parametrize("entry_point", long_cases(list(ENTRY_POINTS),   # (their fresh JAX
                                                   {"pytest", "notebook", "benchmark"}))  # starts)
def test_no_entry_point_prints_the_cuda_plugins_notices_without_a_gpu(entry_point):
  if not jax_start.cuda_notices_expected():
    pytest.skip("a GPU is visible here, or no CUDA plugin is installed")
  env = {key: value for key, value in os.environ.items()
         if key != "JAX_PLATFORMS" and not key.startswith("PYTEST_")}
  result = subprocess.run([sys.executable, *ENTRY_POINTS[entry_point]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  output = result.stdout + result.stderr
  for notice in ("cudart_stub", "Could not find cuda drivers", "absl::InitializeLog",
                 "Jax plugin configuration error", "Unable to load CUDA"):
    assert notice not in output
  expected = {"launch": (2, "error: variant task='bogus' is not allowed"),
              "benchmark": (0, "usage: attention.py"), "pytest": (0, "1 passed")}
  status, text = expected.get(entry_point, (0, "[CpuDevice(id=0)]\n3\n"))
  assert result.returncode == status and text in output, output
