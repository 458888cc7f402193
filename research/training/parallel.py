"""Data parallelism over every device: `jit` over a mesh (default) or `pmap`.

Both strategies take the same pure functions

  step(state, batch) -> (state, metrics)         with `axis_name` for cross-device means
  evaluate(params, batch) -> {name: (sum, sum)}

and the same global batches (dicts of NumPy arrays [global_batch, ...]). Each host
feeds only its own rows: a training stream makes only them (`put_rows`, `abstract_rows`:
its share, research/data/stream.py's `select`), an evaluation batch is cut (`put_batch`,
`abstract_batch`); the results are identical up to float reduction order.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

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
  """The strategy named by config.train.parallelism (checked by validation.check_shared)."""
  return STRATEGIES[name]()
