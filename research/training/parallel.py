"""Parallelism: data parallel over every device (`jit` over a mesh, the default, or `pmap`),
and several processes (hosts) as one run (`jax.distributed`, a stop every process agrees
on). Each host feeds only its own rows of every global batch; the results are identical up
to float reduction order, and only process 0 writes metrics, plots, reports and the lock."""

import glob
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from research.errors import ConfigError, RunFailed

AXIS = "data"


def host_rows(batch: dict) -> dict:
  """This process's contiguous share of a global batch."""
  count, index = jax.process_count(), jax.process_index()
  return jax.tree.map(lambda x: np.split(x, count)[index], batch)


class MeshStrategy:
  """`jit` with explicit shardings: state replicated, batch split along a 1-D mesh."""
  axis_name = None      # jit sees global arrays: means over the batch are already global

  def __init__(self, devices=None, compiler_options: dict | None = None):
    """Over `devices` (default: every device of every process; compile-only devices of a
    target for `research.training.compile_only`, with its XLA `compiler_options`)."""
    self.mesh = Mesh(np.array(jax.devices() if devices is None else devices), (AXIS,))
    self.compiler_options = compiler_options
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self.split = NamedSharding(self.mesh, PartitionSpec(AXIS))
    self.state_sharding = self.replicated   # where init and restore place the state

  def put_state(self, state):
    return jax.device_put(state, self.replicated)

  def put_batch(self, batch: dict):
    return self.put_rows(host_rows(batch))

  def put_rows(self, rows: dict):
    """This process's share of a global batch, placed as the global batch."""
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.split, x), rows)

  def abstract_rows(self, rows: dict):
    """ShapeDtypeStructs of the global batch of which `rows` are this process's share."""
    return self.abstract_batch(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((x.shape[0] * jax.process_count(), *x.shape[1:]),
                                       x.dtype), rows))

  def abstract_state(self, shapes):
    """ShapeDtypeStructs of the state as put_state places it."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=self.replicated), shapes)

  def abstract_batch(self, batch: dict):
    """ShapeDtypeStructs of a global batch as put_batch places it."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.split),
                        batch)

  def compile_step(self, step: Callable, state, batch) -> Callable:
    """Traced under the mesh (`jax.set_mesh`): kernels XLA cannot partition (Mosaic, Triton)
    run per device on its rows (`research.attention.platforms.over_the_batch`)."""
    with jax.set_mesh(self.mesh):
      return jax.jit(step, in_shardings=(self.replicated, self.split),
                     out_shardings=(self.replicated, self.replicated),
                     donate_argnums=0).lower(state, batch).compile(self.compiler_options)

  def compile_eval(self, evaluate: Callable, params, batch) -> Callable:
    with jax.set_mesh(self.mesh):
      return jax.jit(evaluate, in_shardings=(self.replicated, self.split),
                     out_shardings=self.replicated).lower(params, batch).compile(
                         self.compiler_options)

  def host_state(self, state):
    """The state as global arrays (what Orbax saves)."""
    return state

  def host_metrics(self, metrics):
    return metrics


class PmapStrategy:
  """`pmap` over local devices: state replicated per device, batch [devices, per_device, ...].

  One process only (validation says so): jax 0.10's pmap, built on shard_map, deletes the
  arrays a donating pmap is lowered on when several processes run, and fails to lower on
  shapes there; the mesh strategy is the one for several hosts.
  """
  axis_name = AXIS

  def __init__(self):
    self.devices = jax.local_devices()
    self.state_sharding = SingleDeviceSharding(self.devices[0])   # before put_state copies it
    # pmap's own layout: the leading axis split over the devices (what jax >= 0.11 expects
    # of committed arguments)
    self.stacked = NamedSharding(Mesh(np.array(self.devices), (AXIS,)), PartitionSpec(AXIS))

  def abstract_state(self, shapes):
    count = len(self.devices)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((count, *x.shape), x.dtype,
                                                       sharding=self.stacked), shapes)

  def abstract_batch(self, batch: dict):
    count = len(self.devices)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        (count, x.shape[0] // count, *x.shape[1:]), x.dtype, sharding=self.stacked), batch)

  def put_state(self, state):
    """A copy per device along a new leading axis, which pmap splits over the devices."""
    count = len(self.devices)
    return jax.tree.map(
        lambda x: jax.device_put(jnp.broadcast_to(x, (count, *jnp.shape(x))), self.stacked),
        state)

  def put_batch(self, batch: dict):
    return self.put_rows(host_rows(batch))

  def put_rows(self, rows: dict):
    return jax.tree.map(lambda x: jax.device_put(
        x.reshape(len(self.devices), -1, *x.shape[1:]), self.stacked), rows)

  def abstract_rows(self, rows: dict):
    return self.abstract_batch(rows)            # one process: its rows are the batch

  def compile_step(self, step: Callable, state, batch) -> Callable:
    return jax.pmap(step, axis_name=AXIS, donate_argnums=0).lower(state, batch).compile()

  def compile_eval(self, evaluate: Callable, params, batch) -> Callable:
    return jax.pmap(evaluate, axis_name=AXIS).lower(params, batch).compile()

  def host_state(self, state):
    return jax.tree.map(lambda x: x[0], state)

  def host_metrics(self, metrics):
    return jax.tree.map(lambda x: x[0], metrics)


STRATEGIES = {"jit": MeshStrategy, "pmap": PmapStrategy}   # config.train.parallelism


def make_strategy(name: str) -> Any:
  """The strategy named by config.train.parallelism (checked by config.check_shared)."""
  return STRATEGIES[name]()


# ---- Several processes (hosts) as one run ---------------------------------------------------
CLUSTER_VARIABLES = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES",
                     "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")
STOP_LAG = 2                  # steps between a step's gather of signals and its reading
STOP_TIMEOUT_S = 10 * 60      # a signalled process's wait for every process's answer


def check_distributed(config) -> None:
  """ConfigError for config.distributed values that cannot describe a run, with a
  coordinator address or without (where JAX's cluster detection, or one process, decides:
  the process numbers then stay at their defaults, 1 and 0, rather than go unused)."""
  d = config.distributed
  if not _is_int(d.num_processes) or d.num_processes < 1:
    raise ConfigError(f"config.distributed.num_processes={d.num_processes!r} must be an int >= 1")
  if not _is_int(d.process_id) or not 0 <= d.process_id < d.num_processes:
    raise ConfigError(f"config.distributed.process_id={d.process_id!r} must be in 0 … "
                      f"{d.num_processes - 1} (config.distributed.num_processes - 1)")
  if not d.coordinator_address:
    if (d.num_processes, d.process_id) != (1, 0):
      raise ConfigError(
          f"config.distributed.num_processes={d.num_processes} and process_id={d.process_id} "
          "are used only with config.distributed.coordinator_address=HOST:PORT; without it "
          "JAX's cluster detection numbers the processes (or one runs): give the address, or "
          "leave them at 1 and 0")
    return
  if not re.fullmatch(r"[^\s:]+:\d{1,5}", d.coordinator_address):
    raise ConfigError(f"config.distributed.coordinator_address={d.coordinator_address!r} must "
                      "be HOST:PORT (process 0's address), or '' for JAX's cluster detection")


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def initialize(config) -> None:
  """Joins the run described by config.distributed (ConfigError first if it cannot describe
  one); call before any JAX work.

    coordinator_address "HOST:PORT"   explicit: process `process_id` of `num_processes`,
                                      process 0 serving at HOST:PORT (e.g. two processes
                                      on one machine: localhost:PORT)
    coordinator_address ""            JAX's cluster auto-detection where a cluster is in
                                      sight (SLURM, Cloud TPU pods and VMs, Open MPI, GKE),
                                      else a single process: nothing is probed on a laptop
  """
  check_distributed(config)
  d = config.distributed
  if d.coordinator_address:
    jax.distributed.initialize(coordinator_address=d.coordinator_address,
                               num_processes=d.num_processes, process_id=d.process_id)
  elif cluster_in_sight():
    jax.distributed.initialize()


def cluster_in_sight() -> bool:
  """A cluster manager's variables, or a Cloud TPU VM's accelerator devices."""
  return (any(name in os.environ for name in CLUSTER_VARIABLES)
          or bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")))


def any_process(flag: bool) -> bool:
  """Whether `flag` holds on any process: every process gets the same answer."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(flag)))))


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


class StopAgreement:
  """`stop_signal(step, signum)` after each step: the signal to stop with once this is the
  step every process stops after, else None (signum: the signal this process got, 0 or None
  for none yet).

  On one process a SIGTERM (a preemption notice) or SIGINT stops the loop after the step it
  arrives in: that step is saved, and the rerun resumes from it. On several (a pod's hosts)
  each would stop after its own step and enter the checkpoint's save apart, so they agree
  through a collective on the devices, like the train step's own:

    1. after step s every process queues a gather of each process's signal (0: none) behind
       step s on its devices, and reads none of it yet;
    2. after step s + STOP_LAG it reads the gather of step s (done by then, unless the host
       runs more than STOP_LAG steps ahead of its devices): every process reads the same;
    3. a signal there stops every process after step s + STOP_LAG, which all of them save,
       with the signal of the lowest-numbered process that got one.

  A process that got a signal waits at most STOP_TIMEOUT_S for the gather (a process that
  died or left the loop does not answer), then ends the run with RunFailed, the last complete
  checkpoint kept; the others wait as for any step (JAX ends a run whose process dies). A
  signal in the last STOP_LAG steps: the run ends at its last step, saved, as planned.
  """

  def __init__(self):
    self.processes, self.pending = jax.process_count(), []
    self.gather = _signal_gather() if self.processes > 1 else None

  def stop_signal(self, step: int, signum: int | None) -> int | None:
    if self.processes == 1:
      return signum or None
    self.pending.append((step, self.gather(signum or 0)))
    if len(self.pending) <= STOP_LAG:
      return None
    gathered_step, gathered = self.pending.pop(0)
    if signum and not _ready_within(gathered, STOP_TIMEOUT_S):
      raise RunFailed(f"a stop was requested (signal {signum}) but not every process answered "
                      f"after step {gathered_step} within {STOP_TIMEOUT_S / 60:g} minutes; the "
                      "last complete checkpoint is kept")
    signals = [int(s) for s in np.asarray(gathered.addressable_data(0)) if s]
    return signals[0] if signals else None


def _signal_gather():
  """signum -> every process's signum, an array replicated on every device (its values not
  waited for): each process's row put on its devices, gathered by one jitted identity."""
  devices = np.array([[d for d in jax.devices() if d.process_index == p]
                      for p in range(jax.process_count())])
  mesh = Mesh(devices, ("processes", "local_devices"))
  rows = NamedSharding(mesh, PartitionSpec("processes"))
  replicate = jax.jit(lambda signals: signals, out_shardings=NamedSharding(mesh, PartitionSpec()))
  return lambda signum: replicate(jax.make_array_from_process_local_data(
      rows, np.asarray([signum], np.int32), (jax.process_count(),)))


def _ready_within(array: jax.Array, seconds: float) -> bool:
  """Whether `array` is computed within `seconds` (a daemon thread waits for it, so that a
  computation that never ends does not hold the process at exit)."""
  done = threading.Event()

  def wait():
    try:
      array.block_until_ready()
    finally:
      done.set()                # an error: raised when the array is read

  threading.Thread(target=wait, name="stop-agreement", daemon=True).start()
  return done.wait(seconds)
