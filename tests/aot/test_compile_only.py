"""Every experiment compiled for hardware this machine does not have (`--compile_only`):
each default config, the listops `lra` preset in bfloat16, its `s5` and `lru` presets (S5's
and the LRU's recipes: S5's for an H100, the rest in the long tier) and char_lm's transformer, each
for a TPU (one v5e chip, Colab's, or a v4-8 slice: 8 devices, the gradients' all-reduce)
and where its kernels differ for an H100 (CASES), each holding the kernel the attention
registry chose for that platform; a sweep, each point into its own directory, or nothing
written when a point is refused (cuDNN on a T4, named with its compute capability); and,
through launch.py, the report file and an oversized batch refused in one line with each
remedy's memory, the workdir left as found (the refusals that come before compiling:
tests/training/test_launch_rules.py).

LRA's model is compiled here for the H100 only, in bfloat16 and with one of its six layers
(its lengths, widths and kernels, the same in every layer; the layers are unrolled, so each
adds to the compile): `python3 project.py bench compile_targets` compiles the whole model for
every target, the v5e's splash kernel included (Mosaic's compile of its three kernels takes
about a minute of a core whatever the length, so the suite checks only that splash lowers
there: tests/attention/test_lowering.py)."""

import json
import os
import re
import subprocess
import sys

import pytest
from tiers import long_cases

from research import experiments
from research.errors import ConfigError
from research.models.recurrent_mixer import SELECTIVE
from research.training.compile_only import compile_only, compile_sweep
from research.training.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.aot   # needs the `aot` extra's toolchains: skipped where they are missing

# The custom call each attention implementation leaves in a compiled program.
KERNEL_OF = {"pallas_tpu": "tpu_custom_call", "pallas_gpu": "__gpu$xla.gpu.triton",
             "cudnn": "__cudnn$fmha"}
CONFIGS = {
    "nmt_dates": "experiments/nmt_dates.py",
    "sequence_tasks": "experiments/sequence_tasks.py",
    "listops_lra_bf16": "experiments/listops.py",
    "char_lm": "experiments/char_lm.py",
    "char_lm_transformer": "experiments/char_lm.py:model=transformer",
    "kernel_regression": "experiments/kernel_regression.py",
    "listops_s5": "experiments/listops.py:preset=s5",
    "listops_lru": "experiments/listops.py:preset=lru",
    **{f"mqar_{kind}": f"experiments/mqar.py:preset=cpu,model={kind}" for kind in SELECTIVE},
}
# Each model once for a TPU and, where its kernels differ there, once for a GPU: the v4-8 for
# the recurrences (its 8 chips: the gradients' all-reduce), the v5e (Colab's TPU) for the
# others but ListOps (see above), the H100 for cuDNN (ListOps in bfloat16) and our Triton
# kernel (char_lm's transformer in float32).
CASES = [("nmt_dates", "tpu-v4-8"), ("sequence_tasks", "tpu-v5e-1"), ("sequence_tasks", "h100"),
         ("listops_lra_bf16", "h100"), ("char_lm", "tpu-v4-8"), ("char_lm_transformer", "h100"),
         ("kernel_regression", "tpu-v5e-1"), ("listops_s5", "h100"), ("listops_s5", "tpu-v5e-1"),
         ("listops_lru", "h100"), ("listops_lru", "tpu-v5e-1"),
         # the selective recurrences, each for both (seven of them long: LONG)
         *((f"mqar_{kind}", target) for kind in SELECTIVE for target in ("h100", "tpu-v5e-1"))]
# The cases left to the long tier (`python3 project.py long`), compiles a benchmark also makes
# (`bench compile_targets`); the others stay in the suite.
LONG = {("nmt_dates", "tpu-v4-8"), ("listops_lra_bf16", "h100"), ("char_lm_transformer", "h100"),
        ("listops_s5", "h100"), ("listops_s5", "tpu-v5e-1"), ("listops_lru", "h100"),
        ("listops_lru", "tpu-v5e-1"), ("mqar_mamba", "tpu-v5e-1"), ("mqar_mamba2", "h100"),
        ("mqar_mamba2", "tpu-v5e-1"), ("mqar_gla", "h100"), ("mqar_gla", "tpu-v5e-1"),
        ("mqar_deltanet", "tpu-v5e-1"), ("mqar_deltanet", "h100")}
LRA_LAYERS = 1
# S5's and the LRU's ListOps presets, compiled with one of their blocks (8 and 4, each the
# same; S5's eight take 150 s of a core for the H100): bench compile_targets compiles them
# whole.


def _config(name: str):
  config, _ = load_config(os.path.join(ROOT, CONFIGS[name]))
  if name == "listops_lra_bf16":
    config.model.dtype = "bfloat16"
  if name.startswith("listops"):
    config.model.num_layers = LRA_LAYERS
  if config.experiment == "nmt_dates":
    config.data.dir = ""     # nothing written outside the test's directory
  return config


@pytest.mark.slow
@pytest.mark.parametrize("name, target", long_cases(CASES, LONG))
def test_every_experiment_compiles_for_each_target_with_its_kernels(name, target, tmp_path):
  config = _config(name)
  if target == "tpu-v4-8":     # 8 devices: the batch rounded down to a multiple of 8 (50 -> 48)
    config.train.batch_size -= config.train.batch_size % 8
  report = compile_only(config, str(tmp_path), experiments.get(config.experiment), target)
  assert json.loads((tmp_path / "compile_report.json").read_text()) == report
  assert report["chips"] == (8 if target == "tpu-v4-8" else 1)
  for step in ("train", "eval"):
    compiled = report["steps"][step]
    assert compiled["fits"] and 0 < compiled["bytes"]["total"] <= compiled["chip_memory_bytes"]
    kernels = " ".join(compiled["kernels"])
    for implementation in report["attention"]:      # what the registry chose there
      if implementation in KERNEL_OF:
        assert KERNEL_OF[implementation] in kernels, (implementation, kernels)
    if report["chips"] > 1 and step == "train":
      assert "all-reduce" in compiled["collectives"]   # the gradients' mean over 8 devices
  if target.startswith("tpu"):
    assert report["steps"]["train"]["flops"] > 0
  if name == "char_lm_transformer" and target == "h100":
    assert report["attention"] == ["pallas_gpu"]       # float32: our Triton kernel


def _launch(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_launch_compile_only_writes_the_report_and_a_t4_gets_no_cudnn(tmp_path):
  """A T4 (compute capability 7.5) cannot run cuDNN's flash attention or XLA's Triton: the
  transformer compiles with what "auto" picks there, and the report says which."""
  run = _launch("--config=experiments/char_lm.py:model=transformer",
                "--config.model.dtype=bfloat16", "--compile_only=t4", f"--workdir={tmp_path}")
  assert run.returncode == 0, run.stderr[-2000:]
  report = json.loads((tmp_path / "compile_report.json").read_text())
  assert (report["target"], report["device_kind"]) == ("t4", "Tesla T4")
  assert report["attention"] and not set(report["attention"]) & {"cudnn", "pallas_gpu"}
  assert not any(k in " ".join(report["steps"]["train"]["kernels"]) for k in KERNEL_OF.values())
  assert "t4 (1 x Tesla T4)" in run.stdout and "fits" in run.stdout


@pytest.mark.slow
@pytest.mark.long
def test_an_oversized_batch_is_refused_in_one_line_with_each_remedy_and_nothing_is_written(
    tmp_path):
  """An LSTM over 1 000 steps with a batch of 8 192 needs about 4 times an H100: the line
  names the accumulations tried until one fits (each about half the one before: the
  activations of one microbatch at a time), then the other remedies."""
  workdir = tmp_path / "new"
  run = _launch("--config=experiments/sequence_tasks.py:task=adding,model=lstm",
                "--config.model.hidden_size=1024", "--config.data.length=1000",
                "--config.train.batch_size=8192", "--compile_only=h100", f"--workdir={workdir}")
  assert run.returncode == 2, run.stderr[-2000:]
  (line,) = run.stderr.strip().splitlines()
  assert line.startswith("error: the train step needs ") and "per device" in line
  assert "but h100 (NVIDIA H100 80GB HBM3) has 79.11 GiB; compiled with each remedy: " in line
  needed = float(line.split("needs ")[1].split(" GiB")[0])
  tried = re.findall(r"--config\.train\.grad_accum_steps=(\d+): ([\d.]+) GiB \((fits|too much)\)",
                     line)
  assert [int(k) for k, _, _ in tried] == [2 ** (i + 1) for i in range(len(tried))]
  assert [verdict for *_, verdict in tried] == ["too much"] * (len(tried) - 1) + ["fits"]
  figures = [needed] + [float(gib) for _, gib, _ in tried]
  for before, after in zip(figures, figures[1:]):
    assert 0.45 < after / before < 0.55
  assert re.search(r"fits\), --config\.model\.remat=block: [\d.]+ GiB \((fits|too much)\), "
                   r"--config\.model\.dtype=bfloat16: [\d.]+ GiB \((fits|too much)\); or "
                   r"reduce config\.train\.batch_size \(now 8192\)", line)
  assert not workdir.exists()          # not even created: no report, no run.lock


SWEEP = [{"model.kind": "lstm"}, {"model.kind": "transformer"}]


def _sequence_config(**overrides):
  config, _ = load_config(os.path.join(ROOT, "experiments/sequence_tasks.py"))
  for key, value in {"data.length": 16, "model.hidden_size": 32, "model.num_layers": 1,
                     "train.batch_size": 8, "model.dtype": "bfloat16", **overrides}.items():
    parent, _, leaf = key.rpartition(".")
    config[parent][leaf] = value
  return config


@pytest.mark.slow
@pytest.mark.long
def test_a_sweep_compiles_each_point_into_its_directory_or_writes_nothing(tmp_path):
  """For a T4 (compute capability 7.5): "auto" compiles both points; cuDNN's attention,
  named, cannot run there, and the transformer point is refused after the LSTM compiled."""
  experiment = experiments.get("sequence_tasks")
  reports = compile_sweep(_sequence_config(), SWEEP, str(tmp_path / "auto"), experiment, "t4")
  assert list(reports) == ["model.kind=lstm", "model.kind=transformer"]
  for point, report in reports.items():
    assert json.loads((tmp_path / "auto" / point / "compile_report.json").read_text()) == report
    assert report["device_kind"] == "Tesla T4" and report["steps"]["train"]["fits"]
  assert reports["model.kind=lstm"]["attention"] == []
  assert reports["model.kind=transformer"]["attention"]
  assert not set(reports["model.kind=transformer"]["attention"]) & {"cudnn", "pallas_gpu"}
  rows = (tmp_path / "auto" / "compile_summary.md").read_text().splitlines()[2:]
  assert [row.split(" | ")[0] for row in rows] == ["| model.kind=lstm", "| model.kind=transformer"]

  with pytest.raises(ConfigError) as refused:
    compile_sweep(_sequence_config(**{"model.implementation": "cudnn"}), SWEEP,
                  str(tmp_path / "cudnn"), experiment, "t4")
  assert str(refused.value).startswith(
      "sweep point 1 (model.kind=transformer): config.model.implementation='cudnn' cannot do "
      "this: t4 (Tesla T4), a GPU of compute capability 7.5 (cuDNN's flash attention needs 8.0 "
      "or newer)")
  assert not (tmp_path / "cudnn").exists()
