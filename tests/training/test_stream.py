"""Streams: batch n depends only on (seed, n); restoring the state continues the sequence."""

import numpy as np
import pytest

from research.data.stream import GeneratedStream, ShuffledStream, eval_batches


def _generate(rng, batch_size):
  return {"x": rng.integers(0, 1000, size=(batch_size, 3))}


def test_generated_stream_resumes_exactly():
  stream = GeneratedStream(_generate, 4, seed=7)
  batches = [next(stream)["x"] for _ in range(5)]
  resumed = GeneratedStream(_generate, 4, seed=7)
  resumed.set_state({"step": 3})
  np.testing.assert_array_equal(next(resumed)["x"], batches[3])
  np.testing.assert_array_equal(batches[1], _generate(np.random.default_rng([7, 1]), 4)["x"])
  assert not np.array_equal(next(GeneratedStream(_generate, 4, seed=8))["x"], batches[0])


def test_shuffled_stream_visits_each_example_once_per_epoch():
  data = {"x": np.arange(10), "y": np.arange(10) * 2}
  stream = ShuffledStream(data, batch_size=3, seed=0)        # 3 batches per epoch, 1 left out
  epochs = [np.concatenate([next(stream)["x"] for _ in range(3)]) for _ in range(2)]
  for epoch in epochs:
    assert len(set(epoch.tolist())) == 9
  assert not np.array_equal(epochs[0], epochs[1])             # reshuffled
  resumed = ShuffledStream(data, batch_size=3, seed=0)
  resumed.set_state(stream.get_state())
  np.testing.assert_array_equal(next(resumed)["y"], next(stream)["y"])
  batch = next(ShuffledStream(data, batch_size=3, seed=0))
  np.testing.assert_array_equal(batch["y"], batch["x"] * 2)  # rows stay aligned


def test_shuffled_stream_rejects_bad_sizes():
  with pytest.raises(ValueError, match="equal lengths"):
    ShuffledStream({"x": np.arange(3), "y": np.arange(4)}, 1, 0)
  with pytest.raises(ValueError, match="exceeds"):
    ShuffledStream({"x": np.arange(3)}, 4, 0)


def test_eval_batches_cover_every_example_with_weights():
  batches = eval_batches({"x": np.arange(7)}, 3)
  assert [len(b["x"]) for b in batches] == [3, 3, 3]
  weights = np.concatenate([b["weight"] for b in batches])
  np.testing.assert_array_equal(weights, [1] * 7 + [0, 0])
  real = np.concatenate([b["x"] for b in batches])[weights > 0]
  np.testing.assert_array_equal(real, np.arange(7))


def test_bucketed_stream_trims_each_batch_to_its_bucket_and_resumes():
  lengths = np.array([1, 2, 3, 3, 5, 6, 7, 8, 8, 2, 9, 10])
  tokens = (np.arange(10)[None, :] < lengths[:, None]) * (np.arange(12)[:, None] + 1)
  data = {"tokens": tokens, "lengths": lengths}
  stream = ShuffledStream(data, batch_size=2, seed=0, lengths=lengths, boundaries=(4, 8, 10),
                          trim=("tokens",))
  assert stream.batches_per_epoch == 2 + 2 + 1      # buckets of 5, 5 and 2 examples
  seen = []
  for _ in range(stream.batches_per_epoch):
    batch = next(stream)
    bound = batch["tokens"].shape[1]
    assert bound in (4, 8, 10) and batch["lengths"].max() <= bound
    assert batch["lengths"].min() > {4: 0, 8: 4, 10: 8}[bound]          # one bucket per batch
    np.testing.assert_array_equal(batch["tokens"], tokens[batch["tokens"][:, 0] - 1, :bound])
    seen += (batch["tokens"][:, 0] - 1).tolist()
  assert len(set(seen)) == 10                      # one left out of each 5-example bucket
  resumed = ShuffledStream(data, 2, 0, lengths, (4, 8, 10), ("tokens",))
  resumed.set_state({"step": 3})
  stream.set_state({"step": 3})
  np.testing.assert_array_equal(next(resumed)["tokens"], next(stream)["tokens"])


def test_bucketed_eval_batches_score_every_example_once_in_short_batches():
  lengths = np.array([9, 1, 5, 2, 7])
  tokens = np.where(np.arange(10)[None] < lengths[:, None], np.arange(5)[:, None] + 1, 0)
  batches = eval_batches({"tokens": tokens, "lengths": lengths}, 2, lengths, (4, 10),
                         trim=("tokens",))
  assert [b["tokens"].shape[1] for b in batches] == [4, 10, 10]
  real = np.concatenate([b["tokens"][:, 0][b["weight"] > 0] for b in batches])
  assert sorted(real.tolist()) == [1, 2, 3, 4, 5]
