"""StopAgreement: one process stops after the step its signal arrives in; several stop
after the same step, read from a gather of every process's signal (here a stand-in for the
gather across processes, which tests/training/test_multiprocess.py runs for real)."""

import signal
import threading

import jax
import jax.numpy as jnp
import pytest

from research.errors import RunFailed
from research.training import parallel


def test_one_process_stops_after_the_step_its_signal_arrives_in():
  agreement = parallel.StopAgreement()
  assert [agreement.stop_signal(step, 0) for step in (1, 2, 3)] == [None, None, None]
  assert agreement.stop_signal(4, signal.SIGTERM) == signal.SIGTERM
  assert parallel.StopAgreement().stop_signal(1, None) is None


def _two_processes(monkeypatch, signals_of_process_1: dict[int, int]):
  """A StopAgreement on process 0 of two; process 1 gets signals_of_process_1[step]."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  steps = iter(range(1, 1000))

  def gather_factory():
    return lambda signum: jnp.array([signum, signals_of_process_1.get(next(steps), 0)])

  monkeypatch.setattr(parallel, "_signal_gather", gather_factory)
  return parallel.StopAgreement()


def test_several_processes_stop_after_the_same_step_with_the_signal_another_got(monkeypatch):
  """Process 1's SIGTERM after step 5 stops process 0 after step 5 + STOP_LAG, its number
  kept; the lowest-numbered process's signal wins when two come in the same step."""
  agreement = _two_processes(monkeypatch, {5: signal.SIGTERM, 6: signal.SIGTERM})
  stop = 5 + parallel.STOP_LAG
  assert [agreement.stop_signal(step, 0) for step in range(1, stop)] == [None] * (stop - 1)
  assert agreement.stop_signal(stop, 0) == signal.SIGTERM

  agreement = _two_processes(monkeypatch, {3: signal.SIGTERM})
  signals = [agreement.stop_signal(step, signal.SIGINT if step >= 3 else 0)
             for step in range(1, 4 + parallel.STOP_LAG)]
  assert signals == [None] * (2 + parallel.STOP_LAG) + [signal.SIGINT]


class _NeverDone:
  """A gather that one process never joins."""

  def block_until_ready(self):
    threading.Event().wait()


def test_a_signalled_process_that_others_do_not_answer_ends_the_run_naming_the_timeout(
    monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(parallel, "_signal_gather", lambda: lambda signum: _NeverDone())
  monkeypatch.setattr(parallel, "STOP_TIMEOUT_S", 0.3)
  agreement = parallel.StopAgreement()
  for step in range(1, 1 + parallel.STOP_LAG):
    assert agreement.stop_signal(step, signal.SIGTERM) is None
  with pytest.raises(RunFailed, match=r"a stop was requested \(signal 15\) but not every "
                                      r"process answered after step 1 within 0\.005 minutes; "
                                      "the last complete checkpoint is kept"):
    agreement.stop_signal(1 + parallel.STOP_LAG, signal.SIGTERM)
