"""jax_start's probe for a visible NVIDIA GPU or TPU chip, which reads files and starts no
backend, and the CPU alone where it sees none."""

import os
import subprocess
import sys

import jax
import pytest

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
