"""The long tier (`python3 project.py long`) for single cases of a parametrize list."""

import pytest


def long_cases(cases: list, long) -> list:
  """`cases` with those in `long` marked `long` (a tuple case is the test's arguments); a
  name in `long` that no case has is refused, so that a renamed case cannot leave the tier
  silently."""
  unknown = set(long) - set(cases)
  if unknown:
    raise ValueError(f"long cases {sorted(map(str, unknown))} are not among the cases")
  return [pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.long)
          if case in long else case for case in cases]
