"""The sequence-task generators against the task definitions, written out example by example."""

import numpy as np
import pytest

from research.data.sequence_tasks import adding_problem, associative_recall, copy_memory

B = 16


@pytest.mark.parametrize("length, num_symbols, num_items", [(1, 8, 8), (7, 3, 5), (30, 10, 10)])
@pytest.mark.parametrize("reverse", [False, True])
def test_copy_memory_layout_and_targets(length, num_symbols, num_items, reverse):
  batch = copy_memory(np.random.default_rng(0), B, length=length, num_symbols=num_symbols,
                      num_items=num_items, reverse=reverse)
  inputs, targets = batch["inputs"], batch["targets"]
  assert inputs.shape == (B, 2 * num_items + length + 1) and inputs.dtype == np.int32
  assert targets.shape == (B, num_items) and targets.dtype == np.int32
  delimiter = num_symbols + 1
  for tokens, target in zip(inputs, targets):
    symbols = list(tokens[:num_items])
    assert all(1 <= s <= num_symbols for s in symbols)
    assert list(tokens[num_items:]) == [0] * length + [delimiter] + [0] * num_items
    due = symbols[::-1] if reverse else symbols
    assert list(target) == [s - 1 for s in due]


def test_copy_memory_draws_every_symbol():
  batch = copy_memory(np.random.default_rng(0), 64, length=2, num_symbols=5, num_items=10)
  assert set(np.unique(batch["targets"])) == set(range(5))


@pytest.mark.parametrize("length", [2, 3, 10, 101])
def test_adding_problem_marks_one_value_per_half_and_sums_them(length):
  batch = adding_problem(np.random.default_rng(1), B, length=length)
  inputs, targets = batch["inputs"], batch["targets"]
  assert inputs.shape == (B, length, 2) and inputs.dtype == np.float32
  assert targets.shape == (B,) and targets.dtype == np.float32
  half = length // 2
  for (values, markers), target in zip(inputs.transpose(0, 2, 1), targets):
    assert np.all((0 <= values) & (values < 1))
    assert set(np.unique(markers)) <= {0.0, 1.0}
    marked = [t for t in range(length) if markers[t] == 1]
    assert len(marked) == 2 and marked[0] < half <= marked[1]
    assert target == pytest.approx(values[marked[0]] + values[marked[1]], abs=1e-6)


def test_adding_problem_constant_one_scores_about_one_sixth():
  targets = adding_problem(np.random.default_rng(2), 20_000, length=50)["targets"]
  assert np.mean((targets - 1.0) ** 2) == pytest.approx(1 / 6, abs=0.01)


@pytest.mark.parametrize("length, num_symbols, num_items", [(1, 4, 4), (9, 8, 3), (20, 10, 6)])
def test_associative_recall_answers_the_value_of_the_query_key(length, num_symbols, num_items):
  batch = associative_recall(np.random.default_rng(3), B, length=length, num_symbols=num_symbols,
                             num_items=num_items)
  inputs, targets = batch["inputs"], batch["targets"]
  assert inputs.shape == (B, 2 * num_items + length + 1) and inputs.dtype == np.int32
  assert targets.shape == (B,) and targets.dtype == np.int32
  for tokens, target in zip(inputs, targets):
    keys, values = tokens[0:2 * num_items:2], tokens[1:2 * num_items:2]
    assert len(set(keys)) == num_items and all(1 <= k <= num_symbols for k in keys)
    assert all(num_symbols + 1 <= v <= 2 * num_symbols for v in values)
    assert list(tokens[2 * num_items:-1]) == [0] * length
    query = tokens[-1]
    pairs = dict(zip(keys, values))
    assert query in pairs and target == pairs[query] - num_symbols - 1


@pytest.mark.parametrize("generate, settings", [
    (copy_memory, dict(length=5, num_symbols=8, num_items=4)),
    (adding_problem, dict(length=5)),
    (associative_recall, dict(length=5, num_symbols=8, num_items=4)),
])
def test_a_batch_is_a_function_of_the_generator_state(generate, settings):
  first = generate(np.random.default_rng([7, 3]), B, **settings)
  again = generate(np.random.default_rng([7, 3]), B, **settings)
  other = generate(np.random.default_rng([7, 4]), B, **settings)
  for name in first:
    np.testing.assert_array_equal(first[name], again[name])
  assert not np.array_equal(first["inputs"], other["inputs"])
