"""Where a run came from: provenance.jsonl in its workdir, one JSON line per start or resume
(its step, command, checkout, versions and devices: `current`; where a warm start's
parameters came from: `record`), which `research.training.restore` returns, warning when
today's versions or devices differ from the last start's (`differences`);
docs/trained_runs.md, "Where a run came from".
"""

import datetime
import json
import os
import platform
import subprocess
import sys

import flax
import jax
import jaxlib
import optax
import orbax.checkpoint as ocp

import research
from research import files

FILE = "provenance.jsonl"
GIT_SECONDS = 10          # git answers in milliseconds; a hung filesystem must not stop a run


def versions() -> dict[str, str]:
  """{"python", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "research"}: the
  version of each, as the running modules give it."""
  modules = {"jax": jax, "jaxlib": jaxlib, "flax": flax, "optax": optax,
             "orbax-checkpoint": ocp, "research": research}
  return {"python": platform.python_version(),
          **{name: str(module.__version__) for name, module in modules.items()}}


def devices() -> dict:
  """The devices JAX runs on: platform, kind (of device 0), count (of every process) and
  processes."""
  device = jax.devices()[0]
  return {"platform": device.platform, "kind": device.device_kind,
          "count": jax.device_count(), "processes": jax.process_count()}


def git_state(directory: str) -> dict:
  """{"commit": HEAD's hash, "changes": whether tracked files differ from it} of the git
  checkout holding `directory`, or {"commit": None, "reason": why there is none}."""
  def git(*args: str) -> str:
    return subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                          timeout=GIT_SECONDS, check=True).stdout.strip()

  try:
    commit = git("rev-parse", "HEAD")
    changes = bool(git("status", "--porcelain", "--untracked-files=no"))
  except FileNotFoundError:
    return {"commit": None, "reason": "git is not installed"}
  except subprocess.TimeoutExpired:
    return {"commit": None, "reason": f"git did not answer in {GIT_SECONDS} s"}
  except subprocess.CalledProcessError as error:
    lines = (error.stderr or "").strip().splitlines()
    reason = lines[0] if lines else f"git exited with status {error.returncode}"
    return {"commit": None,
            "reason": "not a git checkout" if "not a git repository" in reason else reason}
  return {"commit": commit, "changes": changes}


def current(step: int) -> dict:
  """This process's record, for a run starting from `step` (a start or a resume):

    {"time": "2025-01-31T12:00:00+00:00", "step": 0,         the step it starts from
     "argv": ["launch.py", "--config", ...],                 sys.argv
     "git": {"commit": "<40 hex digits>", "changes": false}, the package's checkout, changes
                                                             to its tracked files; or
            {"commit": null, "reason": "not a git checkout"} (no git, a copy, an installed
                                                             wheel)
     "versions": {"python": "3.11.7", "jax": ..., "jaxlib": ..., "flax": ..., "optax": ...,
                  "orbax-checkpoint": ..., "research": ...},
     "devices": {"platform": "cpu", "kind": "cpu", "count": 8, "processes": 1}}
  """
  return {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "step": step, "argv": list(sys.argv),
          "git": git_state(os.path.dirname(os.path.abspath(research.__file__))),
          "versions": versions(), "devices": devices()}


def _lines(workdir: str) -> list[str]:
  """The non-empty lines of the workdir's provenance.jsonl ([] where there is none)."""
  try:
    with open(os.path.join(workdir, FILE), encoding="utf-8", errors="replace") as f:
      return [line for line in f.read().splitlines() if line.strip()]
  except FileNotFoundError:
    return []


def read(workdir: str) -> list[dict]:
  """The workdir's records, oldest first ([] where there is no file, or for a run of an
  earlier version); a line that is not a JSON object (edited by hand) is left out."""
  records = []
  for line in _lines(workdir):
    try:
      value = json.loads(line)
    except ValueError:
      continue
    if isinstance(value, dict):
      records.append(value)
  return records


def record(workdir: str, step: int, init_from: dict | None = None) -> None:
  """Appends `current(step)` to the workdir's provenance.jsonl, with "init_from" for a warm
  start (where its parameters came from: {"workdir": the other run's, absolute, "step": its
  checkpoint's, "params_taken": how many parameter arrays of "params_total" the model has};
  research/training/warm_start.py): process 0 rewrites the file whole, its earlier lines as
  they were."""
  if jax.process_index() != 0:
    return
  line = current(step) | ({"init_from": init_from} if init_from else {})
  lines = [*_lines(workdir), json.dumps(line)]
  files.write_text(os.path.join(workdir, FILE), "\n".join(lines) + "\n")


def differences(recorded: dict, today: dict) -> str:
  """The versions and devices of `today` (a `current` record) that differ from those
  `recorded`, in words ("jax 0.4.30 then, 0.10.2 now; devices 8 × cpu then, 1 × cpu now");
  '' when none do. What a record lacks is not compared."""
  changed = []
  then, now = recorded.get("versions") or {}, today["versions"]
  changed += [f"{name} {then[name]} then, {now[name]} now" for name in now
              if name in then and then[name] != now[name]]
  then, now = recorded.get("devices") or {}, today["devices"]
  if then and any(key in then and then[key] != now[key] for key in now):
    changed.append(f"devices {_devices(then)} then, {_devices(now)} now")
  return "; ".join(changed)


def _devices(record: dict) -> str:
  """'8 × cpu', '16 × TPU v5 lite in 4 processes'."""
  processes = record.get("processes", 1)
  return (f"{record.get('count')} × {record.get('kind')}"
          + (f" in {processes} processes" if processes != 1 else ""))
