"""Date translation pairs from CLDR: "dimanche 14 janvier 2024" -> "2024-01-14".

A source is one day written by babel's `format_date(day, format, locale)` for a locale of
LOCALES and a format of FORMATS; its target is the ISO form YYYY-MM-DD. The (locale, format)
combinations that would write one string for two days are dropped (`ambiguous_combinations`),
and the splits are disjoint by day (`split_days`).
"""

import collections
import datetime
import functools
import itertools
import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from babel import Locale
from babel.dates import format_date

LOCALES = ("en", "zh", "fr", "de", "es", "ja", "ru", "it", "pt", "nl", "pl", "sv", "tr", "ko",
           "vi", "id", "cs", "uk", "fi", "da", "hi", "ar", "el", "hu")
# CLDR's four standard lengths and a few fixed CLDR patterns.
FORMATS = ("short", "medium", "long", "full", "d MMMM y", "EEE d MMM y", "y/MM/dd", "dd.MM.y")
# Exactly one century, so that a two-digit year ("14/1/24") names exactly one day.
FIRST_DAY = datetime.date(1950, 1, 1)
LAST_DAY = datetime.date(2049, 12, 31)
SPLITS = {"train": 0.9, "validation": 0.05, "test": 0.05}  # fractions of all days
SPLIT_SEED = 0

_DIGIT_RUN = re.compile("[0-9]+")
_FIELD = "\0"  # stands for one run of digits in a template's text


class DatePair(NamedTuple):
  source: str  # e.g. "dimanche 14 janvier 2024"
  target: str  # e.g. "2024-01-14"
  locale: str  # e.g. "fr"
  format: str  # e.g. "full"


@functools.cache
def _locale(name: str) -> Locale:
  return Locale.parse(name)


@functools.cache
def all_days() -> tuple[datetime.date, ...]:
  """FIRST_DAY..LAST_DAY: 36525 days."""
  count = (LAST_DAY - FIRST_DAY).days + 1
  return tuple(FIRST_DAY + datetime.timedelta(days=i) for i in range(count))


def split_days(split: str) -> np.ndarray:
  """The days of one split as proleptic Gregorian ordinals: int64 [days in split].

  Splits are disjoint by day: a fixed permutation of all days (seed SPLIT_SEED, whatever seed
  the caller samples with) gives 90% of the days to train, 5% to validation and 5% to test.
  """
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
  days = np.array([day.toordinal() for day in all_days()])
  order = np.random.default_rng(SPLIT_SEED).permutation(len(days))
  ends = np.round(np.cumsum(list(SPLITS.values())) * len(days)).astype(int)
  starts = np.concatenate([[0], ends[:-1]])
  index = list(SPLITS).index(split)
  return days[np.sort(order[starts[index]:ends[index]])]


# --- ambiguity ----------------------------------------------------------------------------
# A rendered day is text plus runs of digits. Within one class of days (one month, one
# weekday) CLDR keeps the text and the literal digits (a numeric month, "T2" for a
# Vietnamese Monday) fixed and changes only the day and year runs, so a template read off
# three renderings (checked to agree) writes every day of the class. Equal strings need
# equal texts; within a text, two readings (roles, month) that take the day and the year
# from the same runs agree on the day, readings whose runs never show the same digits
# never meet, and only the classes of the remaining readings are written out and compared.
# This exact check of the whole range takes about a second, where formatting all 7 million
# (day, locale, format) strings with babel takes a minute.


def _digits(value: int, width: int) -> str:
  """A day or year as CLDR writes it: width 1 unpadded, else the last `width` digits."""
  return str(value) if width == 1 else f"{value % 10**width:0{width}d}"


def _template(locale: str, format: str, days: Sequence[datetime.date]) -> tuple[str, tuple]:
  """(text, roles) that render `days` (a day, a week later, 28 years later) in one format.

  text: the rendering with each digit run replaced by _FIELD; roles: per run, ("day", width),
  ("year", width) or the literal digits it always shows.
  """
  renderings = [format_date(day, format, locale=_locale(locale)) for day in days]
  texts = {_DIGIT_RUN.sub(_FIELD, rendering) for rendering in renderings}
  if len(texts) != 1:
    raise ValueError(f"{locale} {format!r}: text other than digits changes with the day: "
                     f"{renderings}")
  roles = []
  for runs in zip(*(_DIGIT_RUN.findall(rendering) for rendering in renderings)):
    width = len(runs[0])
    fields = [(field, width) for field in ("day", "year")
              if all(run == _digits(getattr(day, field), width) for run, day in zip(runs, days))]
    if not fields and len(set(runs)) > 1:
      raise ValueError(f"{locale} {format!r}: digits {runs} are no day or year in {renderings}")
    roles.append(fields[0] if fields else runs[0])
  if not {"day", "year"} <= {role[0] for role in roles if isinstance(role, tuple)}:
    raise ValueError(f"{locale} {format!r} does not write the day and the year: {renderings}")
  return texts.pop(), tuple(roles)


def _fill(text: str, roles: tuple, day: datetime.date) -> str:
  pieces = text.split(_FIELD)
  values = [role if isinstance(role, str) else _digits(getattr(day, role[0]), role[1])
            for role in roles]
  return pieces[0] + "".join(value + piece for value, piece in zip(values, pieces[1:]))


def _field(role: str | tuple[str, int]) -> str:
  """"day" or "year" for a field run, the digits themselves for a literal run."""
  return role if isinstance(role, str) else role[0]


@functools.cache
def _run_values(role: str | tuple[str, int]) -> frozenset[str]:
  """Every digit run that a template role shows over FIRST_DAY..LAST_DAY."""
  if isinstance(role, str):
    return frozenset([role])
  field, width = role
  values = range(1, 32) if field == "day" else range(FIRST_DAY.year, LAST_DAY.year + 1)
  return frozenset(_digits(value, width) for value in values)


def _conflicts(text: str, writers: dict, days_by_class: dict) -> set[frozenset]:
  """Pairs of combinations (one alone: in conflict with itself) writing a string of `text`
  for two different days.

  writers: (roles, month, weekday) -> combinations that write this class with this text.
  Readings (roles, month) that take the day and year from the same runs give equal days;
  readings whose runs never match give different strings; the rest are written out.
  """
  readings = {(roles, month) for roles, month, _ in writers}
  suspects = set()
  for (roles_a, month_a), (roles_b, month_b) in itertools.combinations(readings, 2):
    same_day = month_a == month_b and all(_field(x) == _field(y) for x, y in zip(roles_a, roles_b))
    if not same_day and all(_run_values(x) & _run_values(y) for x, y in zip(roles_a, roles_b)):
      suspects.update(((roles_a, month_a), (roles_b, month_b)))
  days_by_string = collections.defaultdict(lambda: collections.defaultdict(set))
  for (roles, month, weekday), combinations in writers.items():
    if (roles, month) in suspects:
      for day in days_by_class[month, weekday]:
        days_by_string[_fill(text, roles, day)][day].update(combinations)
  return {frozenset(pair) for by_day in days_by_string.values()
          for a, b in itertools.combinations(by_day.values(), 2)
          for pair in itertools.product(a, b)}


def ambiguous_combinations(locales: Sequence[str] = LOCALES,
                           formats: Sequence[str] = FORMATS) -> tuple[tuple[str, str], ...]:
  """The (locale, format) combinations dropped so that every source names one day.

  A source must determine its target, yet numeric short forms of different locales read the
  same digits differently (en "M/d/yy" and es "d/M/yy" both write "1/2/24"). A conflict is a
  source string that two combinations give to two different days, found over all days
  FIRST_DAY..LAST_DAY; the combination in most conflicts (the later in locales x formats on a
  tie) is dropped until none is left. With all LOCALES only en "short" goes (babel 2.18).
  Takes about a second; the result is cached.
  """
  _check_locales(locales)
  return _ambiguous_combinations(tuple(locales), tuple(formats))


@functools.cache
def _ambiguous_combinations(locales: tuple[str, ...],
                            formats: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
  days_by_class = collections.defaultdict(list)
  for day in all_days():
    days_by_class[day.month, day.weekday()].append(day)
  # text -> (roles, month, weekday) -> combinations that write that class so
  classes = collections.defaultdict(lambda: collections.defaultdict(set))
  for month, first in itertools.product(range(1, 13), range(1, 8)):
    day = datetime.date(1978, month, first)  # 1978 and 2006 share a calendar
    probes = (day, day + datetime.timedelta(days=7), day.replace(year=2006))
    for combination in itertools.product(locales, formats):
      text, roles = _template(*combination, probes)
      classes[text][roles, month, day.weekday()].add(combination)
  conflicts = set().union(*(_conflicts(text, writers, days_by_class)
                             for text, writers in classes.items()))
  order = {c: i for i, c in enumerate(itertools.product(locales, formats))}
  dropped = []
  while conflicts:
    degree = collections.Counter(c for pair in conflicts for c in pair)
    worst = max(degree, key=lambda c: (degree[c], order[c]))
    dropped.append(worst)
    conflicts = {pair for pair in conflicts if worst not in pair}
  return tuple(sorted(dropped, key=order.get))


def usable_formats(locales: Sequence[str] = LOCALES) -> dict[str, tuple[str, ...]]:
  """FORMATS of each locale minus the ambiguous combinations among `locales`."""
  dropped = set(ambiguous_combinations(locales))
  return {locale: tuple(f for f in FORMATS if (locale, f) not in dropped) for locale in locales}


def _check_locales(locales: Sequence[str]) -> None:
  if not locales:
    raise ValueError(f"no locales given; expected a subset of {list(LOCALES)}")
  unknown = [locale for locale in locales if locale not in LOCALES]
  if unknown:
    raise ValueError(f"unknown locales {unknown}; expected a subset of {list(LOCALES)}")


# --- sampling -----------------------------------------------------------------------------


def date_records(split: str, num_examples: int, seed: int,
                 locales: Sequence[str] = LOCALES) -> list[DatePair]:
  """num_examples DatePairs of one split, a pure function of (split, num_examples, seed).

  An example draws a day of its split, then a locale, then one of that locale's usable
  formats, all from np.random.default_rng([seed, split index]). Sources are babel's strings
  untouched, invisible marks included: U+200F in Arabic numeric forms, U+202F before the
  Russian and Ukrainian "г." / "р.".
  """
  _check_locales(locales)
  if num_examples < 0:
    raise ValueError(f"num_examples must be >= 0, got {num_examples}")
  days = split_days(split)
  formats = usable_formats(locales)
  locales = list(formats)
  rng = np.random.default_rng([seed, list(SPLITS).index(split)])
  day_index = rng.integers(len(days), size=num_examples)
  locale_index = rng.integers(len(locales), size=num_examples)
  format_index = rng.integers(np.array([len(formats[name]) for name in locales])[locale_index])
  records = []
  for ordinal, i, j in zip(days[day_index].tolist(), locale_index.tolist(), format_index.tolist()):
    day, locale = datetime.date.fromordinal(ordinal), locales[i]
    format = formats[locale][j]
    records.append(DatePair(format_date(day, format, locale=_locale(locale)), day.isoformat(),
                            locale, format))
  return records


def date_pairs(split: str, num_examples: int, seed: int,
               locales: Sequence[str] = LOCALES) -> list[tuple[str, str]]:
  """(source, ISO target) pairs: `date_records` without the locale and format."""
  return [(r.source, r.target) for r in date_records(split, num_examples, seed, locales)]
