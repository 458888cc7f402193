"""research.predict.runs, the rules every predictor keeps: any iterable read once into a
list (one string, or what is not iterable, refused); ints within a stated range (a bool, a
float, a string refused, the range in the message); batches of at most rows_per_call rows,
every call of one shape, whose answers equal one call over all the rows; per-input outputs
refused beyond RESULT_BYTES."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.errors import InputError
from research.predict import runs


@pytest.mark.parametrize("values", [
    ["a", "b", "c"], ("a", "b", "c"), (s for s in "abc"), np.array(["a", "b", "c"]),
    iter(["a", "b", "c"]), {"a": 1, "b": 2, "c": 3},
])
def test_any_iterable_is_read_once_into_a_list(values):
  listed = runs.listed(values, "texts", "texts", "text")
  assert listed == ["a", "b", "c"] and type(listed) is list


@pytest.mark.parametrize("values, message", [
    ("abc", "texts must be a list of texts, got one string 'abc': give [text]"),
    (b"abc", "texts must be a list of texts, got one bytes b'abc': give [text]"),
    (7, "texts must be a list of texts, got a int, which is not iterable"),
    (None, "texts must be a list of texts, got a NoneType, which is not iterable"),
    (np.array("abc"), "texts must be a list of texts, got a ndarray, which is not iterable"),
])
def test_one_string_or_what_is_not_iterable_is_refused(values, message):
  with pytest.raises(InputError) as raised:
    runs.listed(values, "texts", "texts", "text")
  assert str(raised.value) == message


@pytest.mark.parametrize("value", [0, 1, 7, np.int64(7), np.uint8(3), 2**32 - 1])
def test_an_int_within_the_range_is_taken_as_a_python_int(value):
  taken = runs.check_int(value, "seed", 0, 2**32 - 1)
  assert taken == value and type(taken) is int


@pytest.mark.parametrize("value", [-1, 2**32, 2**64, 2**1000, -2**63, 1.5, 2.0, "3", True,
                                   False, None, np.float32(3), float("nan")])
def test_what_is_not_an_int_in_the_range_is_refused_with_the_range(value):
  with pytest.raises(InputError) as raised:
    runs.check_int(value, "seed", 0, 2**32 - 1, "why")
  assert str(raised.value) == f"seed={value!r} must be an int in 0 … 4294967295 (why)"


@pytest.mark.parametrize("value", [0, 1, "True", None, np.array([True])])
def test_a_flag_that_is_not_a_bool_is_refused(value):
  with pytest.raises(InputError, match="^attention=.* must be True or False$"):
    runs.check_bool(value, "attention")
  assert runs.check_bool(np.True_, "attention") is True


def test_rows_per_call_keeps_the_bytes_of_a_call_within_the_bound(monkeypatch):
  assert runs.rows_per_call(1, 64) == 64                       # the predictor's own bound
  assert runs.rows_per_call(1, 10**9) == runs.MAX_ROWS
  assert runs.rows_per_call(runs.CALL_BYTES // 10, 64) == 10   # 10 such rows fit a call
  assert runs.rows_per_call(runs.CALL_BYTES * 5, 64) == 1      # one row, however large
  monkeypatch.setattr(runs, "MAX_ROWS", 3)
  assert runs.rows_per_call(1, 64) == 3


def test_per_input_outputs_beyond_the_bound_are_refused_naming_the_argument():
  runs.check_result(2, runs.RESULT_BYTES // 2, "attention=True", "weights", "pass False")
  with pytest.raises(InputError) as raised:
    runs.check_result(3, runs.RESULT_BYTES // 2, "attention=True", "the weights", "pass False")
  total = 3 * (runs.RESULT_BYTES // 2)
  assert str(raised.value) == (
      f"attention=True: the weights of 3 inputs take {total:,} bytes, more than a prediction "
      f"returns at once (research.predict.runs.RESULT_BYTES = {runs.RESULT_BYTES:,}): pass False")


class Recorded:
  """A function of rows [B, …] (and an optional None output) that records each call's
  shapes: in_batches' `call`."""

  def __init__(self):
    self.shapes = []

  def __call__(self, x, y):
    self.shapes.append((x.shape, y.shape))
    return {"sum": jnp.asarray(x).sum(-1) + jnp.asarray(y), "none": None,
            "pair": (jnp.asarray(x) * 2, jnp.asarray(y).astype(jnp.int32))}


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 40), rows=st.integers(1, 12), whole=st.booleans())
def test_batches_answer_as_one_call_over_all_rows_in_calls_of_one_shape(count, rows, whole):
  x = np.arange(count * 3, dtype=np.float32).reshape(count, 3)
  y = np.arange(count, dtype=np.float32) * -1.5
  reference = Recorded()(x, y)
  recorded = Recorded()
  answers = runs.in_batches(recorded, (x, y), rows, whole=whole)
  size = rows if whole else min(rows, count)
  assert len(recorded.shapes) == -(-count // size)
  assert set(recorded.shapes) == {((size, 3), (size,))}          # one compiled shape
  assert answers["none"] is None
  for leaf, expected in ((answers["sum"], reference["sum"]),
                         (answers["pair"][0], reference["pair"][0]),
                         (answers["pair"][1], reference["pair"][1])):
    assert isinstance(leaf, np.ndarray) and leaf.shape[0] == count
    np.testing.assert_array_equal(leaf, np.asarray(expected))
    assert leaf.dtype == np.asarray(expected).dtype


def test_the_last_batch_is_padded_with_copies_of_its_last_row():
  seen = []
  runs.in_batches(lambda x: seen.append(np.asarray(x).copy()) or x, (np.arange(5),), 3)
  np.testing.assert_array_equal(seen[0], [0, 1, 2])
  np.testing.assert_array_equal(seen[1], [3, 4, 4])


@pytest.mark.parametrize("values", [[[1, 2], [3, 4]], ((1, 2), (3, 4)), np.array([[1, 2], [3, 4]]),
                                    (row for row in [[1, 2], [3, 4]]), iter([(1, 2), [3, 4]])])
def test_arrays_are_read_once_a_generator_into_a_list_first(values):
  np.testing.assert_array_equal(runs.as_array(values, "inputs", "ints [B, L]"), [[1, 2], [3, 4]])


def test_a_ragged_array_is_refused_naming_it():
  with pytest.raises(InputError, match=r"^inputs is not an array \(.*\): ints \[B, L\]$"):
    runs.as_array((row for row in [[1, 2], [3]]), "inputs", "ints [B, L]")
