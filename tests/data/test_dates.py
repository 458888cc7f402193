"""Generated date pairs, checked against babel itself and the calendar."""

import collections
import datetime
import itertools

import numpy as np
import pytest
from babel import Locale
from babel.dates import format_date

from research.data import dates


def test_locales_and_formats():
  assert len(set(dates.LOCALES)) == len(dates.LOCALES) >= 20
  assert {"zh", "fr", "de", "es", "ja", "ru", "en"} <= set(dates.LOCALES)
  for name in dates.LOCALES:
    assert str(Locale.parse(name)) == name
  assert {"short", "medium", "long", "full"} < set(dates.FORMATS)


@pytest.mark.slow
@pytest.mark.parametrize("split", list(dates.SPLITS))
def test_source_is_babel_rendering_of_target(split):
  dropped = set(dates.ambiguous_combinations())
  for source, target, locale, format in dates.date_records(split, 300, seed=1):
    day = datetime.date.fromisoformat(target)
    assert target == f"{day.year:04d}-{day.month:02d}-{day.day:02d}"
    assert datetime.date(1950, 1, 1) <= day <= datetime.date(2049, 12, 31)
    assert format_date(day, format, locale=locale) == source
    assert (locale, format) not in dropped


def test_records_cover_locales_and_formats():
  records = dates.date_records("train", 5000, seed=0)
  assert {r.locale for r in records} == set(dates.LOCALES)
  assert {r.format for r in records} == set(dates.FORMATS)
  assert {(r.locale, r.format) for r in records} == {
    (locale, format) for locale, formats in dates.usable_formats().items() for format in formats}
  assert {"dimanche 14 janvier 2024", "2024年1月14日星期日", "Jan 14, 2024"} <= {
    format_date(datetime.date(2024, 1, 14), format, locale=locale)
    for locale, format in itertools.product(dates.LOCALES, dates.FORMATS)}


def test_splits_partition_the_century_by_day():
  first, last = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)
  century = range(first.toordinal(), last.toordinal() + 1)
  splits = {name: set(dates.split_days(name).tolist()) for name in dates.SPLITS}
  assert sum(map(len, splits.values())) == len(century) == 36525
  assert set().union(*splits.values()) == set(century)
  assert abs(len(splits["train"]) / len(century) - 0.9) < 1e-3
  for name in dates.SPLITS:
    targets = {datetime.date.fromisoformat(t).toordinal()
               for _, t in dates.date_pairs(name, 2000, seed=3)}
    assert targets <= splits[name]


def test_splits_do_not_depend_on_the_sampling_seed():
  test_days = set(dates.split_days("test").tolist())
  for seed in (0, 1):
    train_days = {datetime.date.fromisoformat(t).toordinal()
                  for _, t in dates.date_pairs("train", 3000, seed=seed)}
    assert not train_days & test_days


def test_deterministic_for_a_seed_and_different_for_another():
  assert dates.date_pairs("train", 200, seed=7) == dates.date_pairs("train", 200, seed=7)
  assert dates.date_pairs("train", 200, seed=7) != dates.date_pairs("train", 200, seed=8)
  assert dates.date_pairs("test", 200, seed=7) != dates.date_pairs("validation", 200, seed=7)


def test_every_source_names_one_day():
  """Brute force with babel over the first twelve days of every month of a few years whose
  two-digit forms are also days and months (so day, month and year can trade places) and
  over random days."""
  rng = np.random.default_rng(0)
  days = [d for d in dates.all_days() if d.year in (2001, 2003, 2007, 2012) and d.day <= 12]
  days += [dates.all_days()[i] for i in rng.choice(36525, 400, replace=False)]
  writers = collections.defaultdict(lambda: collections.defaultdict(set))  # source -> day -> ...
  for locale, format in itertools.product(dates.LOCALES, dates.FORMATS):
    babel_locale = Locale.parse(locale)
    for day in days:
      writers[format_date(day, format, locale=babel_locale)][day].add((locale, format))
  collisions = [by_day for by_day in writers.values() if len(by_day) > 1]
  dropped = set(dates.ambiguous_combinations())
  for by_day in collisions:
    assert sum(1 for combos in by_day.values() if combos - dropped) <= 1, dict(by_day)
  in_collisions = {c for by_day in collisions for combos in by_day.values() for c in combos}
  assert dropped and dropped <= in_collisions


def test_ambiguity_depends_on_the_locales_chosen():
  assert dates.ambiguous_combinations(("en",)) == ()
  assert dates.ambiguous_combinations(("en", "fr")) == ()
  assert dates.ambiguous_combinations(("en", "es")) in ((("en", "short"),), (("es", "short"),))
  assert {r.format for r in dates.date_records("train", 300, seed=0, locales=["en"])} == set(
    dates.FORMATS)


def test_format_without_year_is_refused():
  with pytest.raises(ValueError, match="does not write the day and the year"):
    dates.ambiguous_combinations(["en"], ["d MMM"])


def test_bad_arguments():
  with pytest.raises(ValueError, match=r"unknown split 'dev'.*'train', 'validation', 'test'"):
    dates.date_pairs("dev", 10, seed=0)
  with pytest.raises(ValueError, match=r"unknown locales \['xx'\].*'zh'"):
    dates.date_pairs("train", 10, seed=0, locales=["en", "xx"])
  with pytest.raises(ValueError, match="no locales"):
    dates.date_pairs("train", 10, seed=0, locales=[])
  with pytest.raises(ValueError, match="num_examples"):
    dates.date_pairs("train", -1, seed=0)
