"""The benchmarks' command line. Arguments are checked before anything is compiled, timed
or written: a bad value ends the run with one line, `error: argument --NAME: ...` naming
what is allowed, and exit status 2 (argparse's usage message left out). A run that does not
fit this machine's memory is refused likewise when the check estimates it (`check_memory`:
the largest inputs and what is built from them, roughly, against the memory available),
and ends with one `error:` line and exit status 1 where an allocation fails all the same
(`run`).

    parser = Parser(description=...)
    parser.add_argument("--lengths", type=positive_ints, default="1024,4096")
    parser.add_argument("--attentions", type=names_of(("full", "linear")), default="full")
    args = parse(parser, argv, check)   # check(parser, args): parser.error(...) refuses
    ...
    if __name__ == "__main__":
      run(main)

String defaults go through `type` too (argparse's rule), so `args.lengths` is a list. The
toolchains of the `aot` extra log to stderr when JAX is imported and when its backends
start (the benchmarks import JAX inside `jax_start.held_back()` for that); `parse` starts
the backends inside it too (on the CPU alone where no accelerator is visible), so that
neither a refusal nor the run prints those logs.
"""

import argparse
import math
import sys

from research import jax_start


class Refused(Exception):
  """A bad argument, in words (argparse's message)."""


class Parser(argparse.ArgumentParser):
  """argparse.ArgumentParser whose errors raise Refused (`parse` prints them in one line)."""

  def error(self, message: str):
    raise Refused(message)


def parse(parser: Parser, argv: list[str] | None = None, check=None) -> argparse.Namespace:
  """`parser.parse_args(argv)`, then `check(parser, args)` if given; a refusal: one
  `error: ...` line on stderr and exit status 2."""
  refusal = None
  with jax_start.held_back():   # what JAX logs shown only if something crashes
    jax_start.cpu_unless_accelerators()
    import jax  # noqa: PLC0415 - the benchmark imported it already, held back
    jax.devices()                # the backends start here, their plugins' logs held back
    try:
      args = parser.parse_args(argv)
      if check:
        check(parser, args)
    except Refused as error:
      refusal = error
  if refusal:
    sys.stderr.write(f"error: {refusal}\n")
    sys.exit(2)
  return args


def positive_int(text: str) -> int:
  """An integer >= 1."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
  return value


def non_negative_float(text: str) -> float:
  """A finite number >= 0 (seconds)."""
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not math.isfinite(value) or value < 0:
    raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
  return value


def _items(text: str) -> list[str]:
  items = [item.strip() for item in text.split(",")] if text.strip() else []
  if "" in items:
    raise argparse.ArgumentTypeError(f"an empty item in the comma list {text!r}")
  if repeated := sorted({item for item in items if items.count(item) > 1}):
    raise argparse.ArgumentTypeError(f"{', '.join(map(repr, repeated))} given twice")
  return items


def positive_ints(text: str) -> list[int]:
  """A comma list of one or more integers >= 1, each once: "1024,4096" -> [1024, 4096]."""
  items = _items(text)
  if not items or not all(item.isdigit() and int(item) >= 1 for item in items):
    raise argparse.ArgumentTypeError(
        f"must be a comma list of positive integers, each once, got {text!r}")
  return [int(item) for item in items]


def names_of(known, allow_empty: bool = False, every: str | None = None):
  """The `type` of a comma list of names from `known` (each once; at least one unless
  `allow_empty`: then '' is the empty list); the word `every`, if given, stands for all."""
  known = list(known)

  def names(text: str) -> list[str]:
    if every is not None and text == every:
      return known
    items = _items(text)
    if unknown := [item for item in items if item not in known]:
      raise argparse.ArgumentTypeError(
          f"unknown {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}"
          + (f" (or {every})" if every else ""))
    if not items and not allow_empty:
      raise argparse.ArgumentTypeError(f"give at least one of: {', '.join(known)}")
    return items

  names.__name__ = "names"
  return names


def name_of(known, allow_empty: bool = False):
  """The `type` of one name from `known` ('' for none when `allow_empty`: then None)."""
  known = list(known)

  def name(text: str) -> str | None:
    if text == "" and allow_empty:
      return None
    if text not in known:
      none = " (or '' for none)" if allow_empty else ""
      raise argparse.ArgumentTypeError(
          f"unknown {text!r}; choose one of: {', '.join(known)}{none}")
    return text

  name.__name__ = "name"
  return name


# XLA, torch, NumPy (an array whose bytes exceed what it can index)
OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "out of memory", "can't allocate memory",
                 "array is too big")


def check_memory(parser: Parser, needed: int, sizes: str, what: str) -> None:
  """Refuses (parser.error) arguments whose run would need `needed` bytes of host memory
  (an estimate: the largest inputs and what is built from them) where this machine has
  less available; `sizes` names the arguments ('--batch=…, --lengths=…'), `what` what the
  bytes are for."""
  from research.training.config import host_memory_refusal  # noqa: PLC0415 - imports JAX

  if refusal := host_memory_refusal(needed, sizes, what):
    parser.error(refusal)


def run(main) -> None:
  """Calls `main()`; an allocation this machine cannot make (NumPy's MemoryError, XLA's
  RESOURCE_EXHAUSTED, torch's allocator) ends the run with one `error:` line, exit status 1."""
  try:
    main()
  except Exception as error:  # noqa: BLE001 - each library names running out differently
    text = str(error)
    if not isinstance(error, MemoryError) and not any(
        words.lower() in text.lower() for words in OUT_OF_MEMORY):
      raise
    lines = text.strip().splitlines() or [type(error).__name__]
    sys.exit(f"error: out of memory: {lines[0][:200]}; choose smaller lengths or batches")
