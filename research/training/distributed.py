"""Several processes (hosts) as one run: `jax.distributed` from config.distributed.

  coordinator_address "HOST:PORT"   explicit: process `process_id` of `num_processes`,
                                    process 0 serving at HOST:PORT (e.g. two processes
                                    on one machine: localhost:PORT)
  coordinator_address ""            JAX's cluster auto-detection where a cluster is in
                                    sight (SLURM, Cloud TPU pods and VMs, Open MPI, GKE),
                                    else a single process: nothing is probed on a laptop

Every process runs the same command; each feeds its own rows of every global batch
(parallel.host_rows), all of them save and restore checkpoints together (Orbax), and
only process 0 writes metrics, plots, reports and the workdir lock.
"""

import glob
import os
import re

import jax
import numpy as np
from jax.experimental import multihost_utils

from research.errors import ConfigError

# Environment variables set by the cluster managers that jax.distributed detects.
CLUSTER_VARIABLES = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES",
                     "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")


def check(config) -> None:
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
  one); call before any JAX work."""
  check(config)
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
