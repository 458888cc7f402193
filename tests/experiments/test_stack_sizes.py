"""The sizes of a stack of blocks bounded by what the model can use and by memory, as the
experiments' validate() checks them before anything is built (stack_config.py): a probe
of bad inputs found Reformer's num_hashes=100000000 and block_size=2³¹ − 1 ending in
OverflowErrors, Sinkhorn's block_size=2³¹ − 1 aborting XLA, S5's state_size=200000 in a
298 GiB NumPy allocation, and an LRU's max_phase=inf or S5's dt_max=inf (or 1e300) in a
NaN loss; each case here is one of those or a new one of the same kind, in listops,
sequence_tasks and char_lm alike."""

import importlib.util
import os

import pytest

from research.errors import ConfigError
from research.experiments import char_lm, listops, sequence_tasks
from research.training.config import apply_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = {"listops": listops, "sequence_tasks": sequence_tasks, "char_lm": char_lm}
# listops' cpu preset: max_length 255 and the CLS token; sequence_tasks' copy: 3 + 6 + 1 + 3
SMALL = {"listops": {}, "char_lm": {},
         "sequence_tasks": {"data.length": 6, "data.num_items": 3, "data.num_symbols": 5}}
LISTOPS = "256 positions \\(config.data.max_length=255 and the CLS token\\)"
COPY = "13 positions \\(config.data.length=6, config.data.num_items=3\\)"
CONTEXT = "128 positions \\(config.data.context=128\\)"
S5_MEMORY = (r"config\.model\.state_size=200000, config\.model\.recurrence\.s5\.blocks={blocks} "
             r"would need .* of host memory for S5's HiPPO-N initialisation \(a NumPy "
             r"eigendecomposition of a {n} × {n} matrix\), but this machine has")


def get_config(name: str, variant: str):
  spec = importlib.util.spec_from_file_location(f"{name}_config",
                                                os.path.join(ROOT, "experiments", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def positions(key: str, value: int, attention: str, length: str, last: int) -> str:
  return (rf"config\.model\.{key}={value} must be at most the longest input, {length}, with "
          rf"config\.model\.attention='{attention}': 1 … {last}")


CASES = {   # name: (experiment, variant, overrides, the message's pattern; None: accepted)
    "listops reformer num_hashes 1e8": (
        "listops", "preset=cpu,attention=reformer", {"model.num_hashes": 100_000_000},
        r"config\.model\.num_hashes: num_hashes=100000000 rounds of 16 buckets over 256 "
        r"positions need sort keys up to .* beyond int32; at most 493,447 rounds there"),
    "listops reformer num_hashes one past int32": (
        "listops", "preset=cpu,attention=reformer", {"model.num_hashes": 493_448},
        r"num_hashes=493448 rounds .* at most 493,447 rounds there"),
    "listops reformer num_hashes at int32": (
        "listops", "preset=cpu,attention=reformer", {"model.num_hashes": 493_447}, None),
    "listops reformer block_size 2^31 - 1": (
        "listops", "preset=cpu,attention=reformer", {"model.block_size": 2**31 - 1},
        positions("block_size", 2**31 - 1, "reformer", LISTOPS, 256)),
    "listops sinkhorn block_size 2^31 - 1": (
        "listops", "preset=cpu,attention=sinkhorn", {"model.block_size": 2**31 - 1},
        positions("block_size", 2**31 - 1, "sinkhorn", LISTOPS, 256)),
    "listops sinkhorn block_size 257": (
        "listops", "preset=cpu,attention=sinkhorn", {"model.block_size": 257},
        positions("block_size", 257, "sinkhorn", LISTOPS, 256)),
    "listops sinkhorn block_size 256": (
        "listops", "preset=cpu,attention=sinkhorn", {"model.block_size": 256}, None),
    "listops bigbird block_size 1000": (
        "listops", "preset=cpu,attention=bigbird", {"model.block_size": 1000},
        positions("block_size", 1000, "bigbird", LISTOPS, 256)),
    "listops linformer proj_len 100000": (
        "listops", "preset=cpu,attention=linformer", {"model.proj_len": 100_000},
        positions("proj_len", 100_000, "linformer", LISTOPS, 256)),
    "listops memory_compressed compression 1000": (
        "listops", "preset=cpu,attention=memory_compressed", {"model.compression": 1000},
        positions("compression", 1000, "memory_compressed", LISTOPS, 256)),
    "listops longformer window 2^31 - 1": (
        "listops", "preset=cpu,attention=longformer", {"model.window": 2**31 - 1},
        positions("window", 2**31 - 1, "longformer", LISTOPS, 256)),
    "listops mean pooling, no CLS token": (
        "listops", "preset=cpu,attention=sparse", {"model.pooling": "mean", "model.block_size": 256},
        positions("block_size", 256, "sparse", r"255 positions \(config\.data\.max_length=255\)",
                  255)),
    "listops s5 state_size 200000": (
        "listops", "preset=cpu,kind=s5", {"model.state_size": 200_000},
        S5_MEMORY.format(blocks=1, n=200000)),
    "listops s5 state_size 200000 in 1000 blocks": (   # V [N, P] is dense
        "listops", "preset=cpu,kind=s5", {"model.state_size": 200_000,
                                          "model.recurrence.s5.blocks": 1000},
        S5_MEMORY.format(blocks=1000, n=200)),
    "listops lru state_size 2^31 - 1": (
        "listops", "preset=cpu,kind=lru", {"model.state_size": 2**31 - 1},
        r"config\.model\.state_size=2147483647, config\.data\.max_length=255 would need .* for "
        r"about 1,662,152,\d{3},\d{3} parameters"),        # 2 layers · N (3 + 6 · 64) and more
    "listops lru odd state_size": (     # S5's conjugate pairs refused it, for S5's sake
        "listops", "preset=cpu,kind=lru", {"model.state_size": 63}, None),
    "listops lru max_phase inf": (
        "listops", "preset=cpu,kind=lru", {"model.recurrence.lru.max_phase": float("inf")},
        r"config\.model\.recurrence: lru: max_phase must be a finite number, got inf"),
    "listops lru max_phase 7": (
        "listops", "preset=cpu,kind=lru", {"model.recurrence.lru.max_phase": 7.0},
        r"config\.model\.recurrence: lru: max_phase must be in \(0, 2π\]"),
    "listops s5 dt_max 1e300": (
        "listops", "preset=cpu,kind=s5", {"model.recurrence.s5.dt_max": 1e300},
        r"config\.model\.recurrence: s5: need 0 < dt_min <= dt_max <= 174"),
    "sequence_tasks sinkhorn block_size 14": (
        "sequence_tasks", "task=copy,model=transformer",
        {"model.attention": "sinkhorn", "model.block_size": 14},
        positions("block_size", 14, "sinkhorn", COPY, 13)),
    "sequence_tasks reformer num_hashes 2^30": (
        "sequence_tasks", "task=copy,model=transformer",
        {"model.attention": "reformer", "model.block_size": 4, "model.num_hashes": 2**30},
        r"config\.model\.num_hashes: num_hashes=1073741824 rounds of 4 buckets over 16 "
        r"positions .* beyond int32"),
    "sequence_tasks s5 state_size 200000": (
        "sequence_tasks", "task=copy,model=s5", {"model.state_size": 200_000},
        S5_MEMORY.format(blocks=1, n=200000)),
    "sequence_tasks s5 dt_min nan": (
        "sequence_tasks", "task=copy,model=s5", {"model.recurrence.s5.dt_min": float("nan")},
        r"config\.model\.recurrence: s5: dt_min must be a finite number, got nan"),
    "char_lm local window 129": (
        "char_lm", "model=transformer", {"model.attention": "local", "model.window": 129},
        positions("window", 129, "local", CONTEXT, 128)),
    "char_lm local window 128": (
        "char_lm", "model=transformer", {"model.attention": "local", "model.window": 128}, None),
    "char_lm bigbird block_size 2^31 - 1": (
        "char_lm", "model=transformer", {"model.attention": "bigbird", "model.block_size": 2**31 - 1},
        positions("block_size", 2**31 - 1, "bigbird", CONTEXT, 128)),
    "char_lm s5 state_size 200000": (
        "char_lm", "model=s5", {"model.state_size": 200_000}, S5_MEMORY.format(blocks=1, n=200000)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_size_the_model_cannot_use_is_refused_naming_the_key(case):
  name, variant, overrides, message = CASES[case]
  config = apply_overrides(get_config(name, variant), {**SMALL[name], **overrides})
  if message is None:
    EXPERIMENTS[name].validate(config)
  else:
    with pytest.raises(ConfigError, match=message):
      EXPERIMENTS[name].validate(config)
