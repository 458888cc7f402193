"""The MQAR generator against the Zoology paper's description, read example by example, and
its draws against NumPy's own sampling: the gaps against `Generator.choice` without
replacement (sequential draws proportional to the power law), the keys and values against
uniform draws without replacement."""

import numpy as np
import pytest
from scipy import stats

from research.data.mqar import check_sizes, multi_query_recall


@pytest.mark.parametrize("length, pairs, vocab", [(64, 4, 8192), (64, 16, 40), (17, 4, 12),
                                                  (256, 16, 512)])
@pytest.mark.parametrize("noise", [False, True])
def test_every_key_is_asked_once_after_the_pairs_and_its_value_is_the_target(
    length, pairs, vocab, noise):
  batch = multi_query_recall(np.random.default_rng(0), 32, length=length, num_pairs=pairs,
                             vocab_size=vocab, random_non_queries=noise)
  inputs, positions, targets = batch["inputs"], batch["positions"], batch["targets"]
  assert inputs.shape == (32, length) and positions.shape == targets.shape == (32, pairs)
  assert inputs.dtype == positions.dtype == targets.dtype == np.int32
  half = vocab // 2
  for tokens, where, values in zip(inputs, positions, targets):
    keys, stored = tokens[0:2 * pairs:2], tokens[1:2 * pairs:2]
    assert len(set(keys)) == pairs and all(1 <= k < half for k in keys)
    assert len(set(stored)) == pairs and all(half <= v < vocab for v in stored)
    assert list(values) == list(stored)              # query i asks key i: its value is due
    assert list(tokens[where]) == list(keys)
    assert len(set(where)) == pairs
    assert all(p >= 2 * pairs and (p - 2 * pairs) % 2 == 0 and p < length for p in where)
    rest = np.delete(tokens, np.concatenate([np.arange(2 * pairs), where]))
    if noise:
      assert np.all((0 <= rest) & (rest < vocab))
    else:
      assert np.all(rest == 0)


def test_noise_draws_the_whole_vocabulary():
  batch = multi_query_recall(np.random.default_rng(1), 64, length=64, num_pairs=4,
                             vocab_size=32, random_non_queries=True)
  assert set(np.unique(batch["inputs"][:, 8:])) == set(range(32))


def power_law(length, pairs, power):
  """The paper's gap weights, written out: p(g) ∝ α g^(α − 1) for g = 1 … (L − 2N) / 2."""
  space = (length - 2 * pairs) // 2
  p = power * np.arange(1, space + 1) ** (power - 1)
  return p / p.sum()


@pytest.mark.parametrize("power", [0.01, 0.5, 1.0])
def test_gaps_are_drawn_as_numpy_draws_without_replacement(power):
  """The first query's gap follows the power law; each gap's chance to be used at all is
  what NumPy's sequential sampling without replacement gives."""
  length, pairs, count = 40, 4, 20_000
  p = power_law(length, pairs, power)
  batch = multi_query_recall(np.random.default_rng(2), count, length=length, num_pairs=pairs,
                             vocab_size=64, power=power)
  gaps = (batch["positions"] - 2 * pairs) // 2
  first = np.bincount(gaps[:, 0], minlength=p.size)
  assert stats.chisquare(first, p * count).pvalue > 1e-3
  rng = np.random.default_rng(3)
  reference = np.stack([rng.choice(p.size, pairs, replace=False, p=p) for _ in range(count)])
  used = np.bincount(gaps.ravel(), minlength=p.size)
  expected = np.bincount(reference.ravel(), minlength=p.size)
  table = np.stack([used, expected])
  assert stats.chi2_contingency(table[:, table.sum(0) > 0]).pvalue > 1e-3


def test_keys_and_values_are_uniform_over_their_halves():
  batch = multi_query_recall(np.random.default_rng(4), 20_000, length=32, num_pairs=8,
                             vocab_size=40)
  keys, values = batch["inputs"][:, 0:16:2], batch["targets"]
  assert stats.chisquare(np.bincount(keys.ravel(), minlength=20)[1:]).pvalue > 1e-3
  assert stats.chisquare(np.bincount(values.ravel(), minlength=40)[20:]).pvalue > 1e-3


def test_the_same_generator_state_gives_the_same_batch():
  make = lambda seed: multi_query_recall(np.random.default_rng(seed), 8, length=64,
                                         num_pairs=8, vocab_size=512)
  first, again, other = make(5), make(5), make(6)
  assert all(np.array_equal(first[k], again[k]) for k in first)
  assert not np.array_equal(first["inputs"], other["inputs"])


@pytest.mark.parametrize("length, pairs, vocab, message", [
    (63, 16, 512, "16 pairs need a length of at least 4 × 16 = 64"),
    (8, 3, 512, "3 pairs need a length of at least 4 × 3 = 12"),
    (64, 8, 17, "8 distinct keys need a vocabulary of at least 2 × \\(8 \\+ 1\\) = 18"),
])
def test_impossible_sizes_are_named(length, pairs, vocab, message):
  with pytest.raises(ValueError, match=message):
    multi_query_recall(np.random.default_rng(0), 1, length=length, num_pairs=pairs,
                       vocab_size=vocab)
  assert check_sizes(length + 100, pairs, vocab + 100) is None
