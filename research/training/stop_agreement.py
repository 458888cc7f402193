"""Stopping together: a signal to any process of a run stops every process at one step.

On one process a SIGTERM (a preemption notice) or SIGINT stops the loop after the step it
arrives in: that step is saved, and the rerun resumes from it. On several processes (a
pod's hosts) each would stop after its own step, and the processes would enter the
checkpoint's save apart, or one of them not at all. Here the first process to see a signal
asks the others, through the coordination service's key-value store that
`jax.distributed.initialize` started:

  1. a process that got a signal sets REQUEST to the signal's number (the first one wins);
  2. after every step each process looks for REQUEST (a non-blocking read); a process that
     finds it publishes the step it has just finished under STEP/<process index>, and
     waits for every process's;
  3. the agreed step is the largest published: a process that is behind trains on to it,
     then every process saves that step and stops with the requested signal.

The processes are never more than a few steps apart (every step ends in a cross-host
reduction), so the agreed step comes a step or two after the signal. A process that does
not publish within TIMEOUT_MS (it died) ends the run with an error, the last complete
checkpoint kept.
"""

import jax

from research.errors import RunFailed

REQUEST, STEP = "research/stop/signal", "research/stop/step"
TIMEOUT_MS = 10 * 60 * 1000


def _client():
  """The coordination service's client of this process (jax.distributed.initialize)."""
  from jax._src import distributed  # noqa: PLC0415 - JAX keeps it there, not in the API
  return distributed.global_state.client


class StopAgreement:
  """`stop_signal(step, signum)` after each step: the signal to stop with once this is the
  step every process stops after, else None."""

  def __init__(self):
    self.processes, self.index = jax.process_count(), jax.process_index()
    self.requested, self.published, self.agreed = False, False, None

  def stop_signal(self, step: int, signum: int | None) -> int | None:
    """signum: the signal this process got (0 or None: none yet)."""
    if self.processes == 1:
      return signum
    client = _client()
    if signum and not self.requested:
      self.requested = True
      try:
        client.key_value_set(REQUEST, str(signum))
      except Exception:  # noqa: BLE001 - another process asked first: its signal stands
        pass
    if self.agreed is None:
      try:
        requested = client.key_value_try_get(REQUEST)
      except Exception:  # noqa: BLE001 - not found: nobody asked
        return None
      self._publish(client, step)
      try:
        steps = [int(client.blocking_key_value_get(f"{STEP}/{i}", TIMEOUT_MS))
                 for i in range(self.processes)]
      except Exception as error:  # noqa: BLE001 - a process that does not answer
        raise RunFailed(f"a stop was requested (signal {requested}) but not every process "
                        f"answered within {TIMEOUT_MS // 60000} minutes ({error}); the last "
                        "complete checkpoint is kept") from None
      self.agreed = (max(steps), int(requested))
    stop_step, agreed_signum = self.agreed
    return agreed_signum if step >= stop_step else None

  def finished(self, step: int) -> None:
    """The loop ran to its last `step`: published for a process that asks to stop now
    (a signal in the last steps), which would otherwise wait for this one's answer."""
    if self.processes > 1:
      self._publish(_client(), step)

  def _publish(self, client, step: int) -> None:
    if not self.published:
      self.published = True
      client.key_value_set(f"{STEP}/{self.index}", str(step))
