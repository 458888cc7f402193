"""config.train.grad_accum_steps: the gradient of k microbatches, accumulated, is the
gradient of their whole batch, for every experiment (without dropout, which draws other
masks per microbatch). The reference is jax.value_and_grad of the experiment's own loss on
the whole batch."""

import importlib
import os
import sys

import jax
import numpy as np
import pytest
import tiny
from tiers import long_cases

from research import experiments
from research.errors import ConfigError
from research.training.config import apply_overrides, check_devices, check_shared
from research.training.train_step import accumulated_gradients, microbatches

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = {"train.num_steps": 2, "train.warmup_steps": 0, "train.log_every": 1,
         "train.eval_every": 2, "train.checkpoint_every": 2}
CASES = {   # experiment: (variant, overrides); batches of 16 (kernel_regression: 20)
    "nmt_dates": (None, {"data.train_examples": 32, "data.eval_examples": 16,
                         "data.test_examples": 16, "data.locales": "en,fr,ja",
                         "model.kind": "rnn", "model.embed_size": 8, "model.hidden_size": 16,
                         "train.batch_size": 16}),
    "sequence_tasks": ("task=copy,model=transformer", {
        "data.length": 8, "data.eval_examples": 16, "model.hidden_size": 16,
        "model.num_layers": 1, "train.batch_size": 16}),
    "listops": ("preset=cpu", {
        "data.min_tree_length": 8, "data.max_tree_length": 40, "data.train_examples": 16,
        "data.eval_examples": 8, "data.test_examples": 8, "data.max_length": 48,
        "data.length_buckets": 1, "model.num_layers": 1, "model.hidden_size": 8,
        "model.num_heads": 2, "model.mlp_size": 16, "train.batch_size": 16}),
    "char_lm": ("model=gru", {"data.context": 16, "data.eval_windows": 4,
                              "data.test_bytes": 100, "data.test_lanes": 1,
                              "data.test_chunk": 16, "model.hidden_size": 16,
                              "model.embed_size": 8, "train.batch_size": 16}),
    "kernel_regression": (None, {"data.num_train": 20, "model.grid_size": 10,
                                 "train.batch_size": 20}),
}


def config(name: str, tmp_path, **overrides):
  directory = os.path.join(ROOT, "experiments")
  if directory not in sys.path:
    sys.path.insert(0, directory)
  variant, tiny = CASES[name]
  extra = {"data.dir": str(tmp_path)} if name == "listops" else {}
  if name == "char_lm":
    for i in range(40):
      (tmp_path / "lib").mkdir(exist_ok=True)
      (tmp_path / "lib" / f"module_{i}.py").write_text(f"# module {i}\nx = {i}\n" * (1 + i % 5))
    extra = {"data.stdlib": str(tmp_path / "lib")}
  return apply_overrides(importlib.import_module(name).get_config(variant),
                         {**STEPS, **tiny, **extra, **overrides})


@pytest.mark.parametrize("name", long_cases(list(CASES), ("nmt_dates", "listops")))
def test_accumulating_4_microbatches_is_the_whole_batch_gradient(name, tmp_path):
  assert_4_microbatches_give_the_whole_batch_gradient(
      experiments.get(name).build(config(name, tmp_path)))


def assert_4_microbatches_give_the_whole_batch_gradient(workload):
  """The loss's value and gradient, accumulated over 4 microbatches of a training batch,
  against jax.value_and_grad of the whole batch."""
  batch = next(workload.train_data)
  params = jax.jit(workload.init)(jax.random.key(0))
  rng = jax.random.key(1)
  whole = jax.jit(jax.value_and_grad(workload.loss, has_aux=True))(params, batch, rng)
  accumulated = jax.jit(accumulated_gradients(workload.loss, workload.loss_weight, 4))(
      params, batch, rng)
  for leaf, expected in zip(jax.tree.leaves(accumulated), jax.tree.leaves(whole), strict=True):
    np.testing.assert_allclose(leaf, expected, rtol=2e-5, atol=1e-6)


def test_microbatches_are_weighted_by_the_count_the_loss_divides_by():
  """A loss over masked positions (Σ mask · e / Σ mask, as nmt_dates' over target tokens)
  whose microbatches hold 8 to 11 positions: weighted by their counts, the accumulated
  gradient is the whole batch's; the plain mean of theirs would not be."""
  lengths = np.array([1, 2, 3, 4, 7, 7, 7, 7])          # microbatch i: rows i and i + 4
  batch = {"x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8),
           "mask": np.arange(8)[None, :] < lengths[:, None]}

  def loss(w, batch, rng):
    del rng
    errors = (batch["x"] * w - 1.0) ** 2
    return (errors * batch["mask"]).sum() / batch["mask"].sum(), {}

  whole = jax.grad(lambda w: loss(w, batch, None)[0])(np.float32(0.3))
  weighted = accumulated_gradients(loss, lambda b: b["mask"].sum(), 4)(np.float32(0.3), batch,
                                                                       jax.random.key(0))
  unweighted = accumulated_gradients(loss, None, 4)(np.float32(0.3), batch, jax.random.key(0))
  np.testing.assert_allclose(weighted[1], whole, rtol=1e-6)
  assert not np.isclose(unweighted[1], whole, rtol=1e-3)


def test_microbatch_i_holds_rows_i_i_plus_k_and_so_on():
  rows = np.arange(12)
  np.testing.assert_array_equal(microbatches({"x": rows}, 4)["x"],
                                [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]])


@pytest.mark.parametrize("overrides, message", [
    ({"train.grad_accum_steps": 0}, r"grad_accum_steps=0 must be a number > 0"),
    ({"train.grad_accum_steps": 3}, r"grad_accum_steps=3 must divide config\.train\.batch_size=16"),
])
def test_grad_accum_steps_refusals(overrides, message, tmp_path):
  with pytest.raises(ConfigError, match=message):
    check_shared(config("sequence_tasks", tmp_path, **overrides))


def test_each_device_splits_its_rows_into_the_microbatches(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  with pytest.raises(ConfigError, match=r"batch_size=16 must split into "
                                        r"config\.train\.grad_accum_steps=4 microbatches on each "
                                        r"of the 8 devices; allowed batch sizes are multiples of 32"):
    check_devices(config("sequence_tasks", tmp_path, **{"train.grad_accum_steps": 4}))


@pytest.mark.parametrize("kind", long_cases(list(tiny.SELECTIVE), ("mamba", "mamba2", "gla")))
def test_accumulation_holds_for_each_selective_recurrence(kind):
  """4 microbatches of the block stack with Mamba, Mamba-2, GLA or DeltaNet in attention's
  place: the whole batch's gradient (nothing in these layers mixes the rows of a batch)."""
  assert_4_microbatches_give_the_whole_batch_gradient(
      experiments.get("mqar").build(tiny.selective_config(kind)))
