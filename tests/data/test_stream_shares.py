"""Each process's share of a stream's batches (`select`): its rows alone, and the shares
together the one-process batch bit for bit, at any step, after a restore too."""

import numpy as np
import pytest

from research.data.stream import BLOCK, GeneratedStream, ShuffledStream


def _generate(rng: np.random.Generator, count: int) -> dict:
  return {"x": rng.normal(size=(count, 3)).astype(np.float32),
          "label": rng.integers(0, 10, size=count)}


def _dataset() -> dict:
  rng = np.random.default_rng(0)
  return {"tokens": rng.integers(0, 50, size=(100, 12)), "lengths": rng.integers(1, 13, size=100)}


STREAMS = {
    "generated": lambda batch_size: GeneratedStream(_generate, batch_size, seed=3),
    "shuffled": lambda batch_size: ShuffledStream(_dataset(), batch_size, seed=3),
    "bucketed": lambda batch_size: ShuffledStream(
        _dataset(), batch_size, seed=3, lengths=_dataset()["lengths"], boundaries=(6, 12),
        trim=("tokens",)),
}


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("batch_size, count", [(16, 2), (12, 4), (20, 5)])
def test_the_shares_of_count_processes_are_the_one_process_batches(name, batch_size, count):
  whole = STREAMS[name](batch_size)
  shares = [STREAMS[name](batch_size) for _ in range(count)]
  for index, share in enumerate(shares):
    share.select(index, count)
  for step in range(7):
    if step == 4:                         # a restore: every stream goes back to step 2
      for stream in (whole, *shares):
        stream.set_state({"step": 2})
    batch, parts = next(whole), [next(share) for share in shares]
    for key, value in batch.items():
      assert all(len(part[key]) == batch_size // count for part in parts)   # its rows alone
      np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), value)


def test_a_generated_batch_is_drawn_in_blocks_of_rows():
  """Rows j·BLOCK … of batch n come from default_rng([seed, n, j]) (what lets a process
  draw its own rows); the last block is shorter."""
  batch = next(GeneratedStream(_generate, BLOCK + 3, seed=3))
  first = _generate(np.random.default_rng([3, 0, 0]), BLOCK)
  last = _generate(np.random.default_rng([3, 0, 1]), 3)
  np.testing.assert_array_equal(batch["x"], np.concatenate([first["x"], last["x"]]))


def test_a_batch_that_does_not_split_over_the_processes_is_refused():
  with pytest.raises(ValueError, match="batch_size 10 does not split over 4 processes"):
    GeneratedStream(_generate, 10, seed=0).select(1, 4)
