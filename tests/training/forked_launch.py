"""Many launch.py commands for the cost of one start-up: each runs launch.py's entry point
(`launch.run`) in its own forked child of one process that imported launch.py once.

A child is a process of its own (exit status, stdout, stderr, JAX backends started by the
command itself: the parent starts none, and runs no other thread when it forks), so what
a test sees is what a user sees from `python launch.py ...`; only importing launch.py, JAX
and the experiments (seconds) is shared. The commands run one after another, in the order given: a command may use the
workdir an earlier one left.

    python forked_launch.py COMMANDS_JSON OUTPUT_DIR
    # COMMANDS_JSON: {name: [launch.py's arguments]}; writes OUTPUT_DIR/<name>.out, .err
    # and OUTPUT_DIR/statuses.json {name: exit status}

A command may also be {"cut": PATH, "keep": N}: the file is cut to its first N bytes
there (a kill while it was written, between two commands).
"""

import json
import os
import subprocess
import sys
import threading
import traceback

import tiny


def run_all(commands: dict[str, list[str]], directory: str,
            devices: int = 1) -> dict[str, tuple[int, str, str]]:
  """{name: (exit status, stdout, stderr)} of each command, run by this script in one
  subprocess (tiny.environment(devices), with JAX's compile log on: a refusal before
  compiling prints nothing else)."""
  with open(os.path.join(directory, "commands.json"), "w") as f:
    json.dump(commands, f)
  env = {**tiny.environment(devices), "JAX_LOG_COMPILES": "1"}
  driver = subprocess.run([sys.executable, __file__, os.path.join(directory, "commands.json"),
                           directory], env=env, capture_output=True, text=True, timeout=600)
  assert driver.returncode == 0, driver.stderr[-3000:]
  with open(os.path.join(directory, "statuses.json")) as f:
    statuses = json.load(f)
  results = {}
  for name, status in statuses.items():          # (cuts have none)
    with open(os.path.join(directory, f"{name}.out")) as out, open(
        os.path.join(directory, f"{name}.err")) as err:
      results[name] = (status, out.read(), err.read())
  return results


def _child(argv: list[str], directory: str, name: str) -> int:
  """Runs launch.py with argv as `python launch.py argv` would, its output in files; the
  exit status Python would give."""
  for fd, suffix in ((1, "out"), (2, "err")):
    with open(os.path.join(directory, f"{name}.{suffix}"), "wb") as f:
      os.dup2(f.fileno(), fd)
  import launch  # noqa: PLC0415 - imported by the parent already: no cost

  status = 0
  try:
    launch.run([os.path.join(tiny.ROOT, "launch.py"), *argv])
  except SystemExit as exit_:
    if isinstance(exit_.code, str):
      print(exit_.code, file=sys.stderr)
    status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
  except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught one
    traceback.print_exc()
    status = 1
  sys.stdout.flush()
  sys.stderr.flush()
  return status


def main(commands_json: str, directory: str) -> None:
  sys.path.insert(0, tiny.ROOT)
  from jax._src import xla_bridge  # noqa: PLC0415

  import launch  # noqa: F401, PLC0415 - once, before forking

  # Forking is safe while no backend runs (JAX's threads start with them) and this
  # process runs no other Python thread.
  assert not xla_bridge.backends_are_initialized() and threading.active_count() == 1

  with open(commands_json) as f:
    commands = json.load(f)
  statuses = {}
  for name, argv in commands.items():
    if isinstance(argv, dict):
      os.truncate(argv["cut"], argv["keep"])
      continue
    pid = os.fork()
    if pid == 0:
      os._exit(_child(argv, directory, name))
    statuses[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
  with open(os.path.join(directory, "statuses.json"), "w") as f:
    json.dump(statuses, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
