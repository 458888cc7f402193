"""The docs' tables quoted from committed runs (results/) are those runs, figure for figure.

A block of README.md or of a docs/ page between `<!-- from results/PATH -->` and
`<!-- /from -->` is a markdown table whose columns are some of the columns of the file at
results/PATH: a markdown table (a sweep's summary.md, a benchmark's output), a csv file or a
run's final_metrics.json (one row, its keys the columns). Every row of the block must be some
row of the file restricted to the block's columns. A cell matches its figure when the two
read the same, or when the page's number is the file's (5.4e-05 reads 0.000054) within half
the page's last digit, with the same unit after it; "37.25%" reads the fraction 0.3725.
Nothing is trained or run: both files are read as committed. results/exploratory/ is never
quoted, and every run kept in results/ outside it has finished.
"""

import csv
import json
import os
import re

import pytest
from docs_pages import ROOT, pages, read

BLOCK = re.compile(r"<!-- from (results/[\w./=,-]+) -->\n(.*?)<!-- /from -->", re.S)
NUMBER = re.compile(r"^(-?\d+(?:\.(\d+))?(?:[eE][-+]?\d+)?)\s*(.*)$")
EXPLORATORY = "results/exploratory/"


def cells(line: str) -> list[str]:
  return [cell.strip() for cell in line.strip().strip("|").split("|")]


def markdown_tables(text: str) -> list[list[dict]]:
  """Every table of a markdown text as a list of {column: cell} rows."""
  tables, lines = [], text.splitlines()
  for i in range(len(lines) - 1):
    if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
      header, rows = cells(lines[i]), []
      for line in lines[i + 2:]:
        if not line.startswith("|"):
          break
        rows.append(dict(zip(header, cells(line), strict=True)))
      tables.append(rows)
  return tables


def source_tables(path: str) -> list[list[dict]]:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    if path.endswith(".json"):
      return [[{key: str(value) for key, value in json.load(f).items()}]]
    if path.endswith(".csv"):
      return [list(csv.DictReader(f))]
    return markdown_tables(f.read())


def matches(shown: str, figure: str) -> bool:
  """Whether the page's cell `shown` reads the file's cell `figure`."""
  if shown == figure:
    return True
  quoted, actual = NUMBER.match(shown), NUMBER.match(figure)
  if not quoted or not actual:
    return False
  value, unit = float(actual.group(1)), actual.group(3)
  if quoted.group(3) == "%" and unit == "":
    value, unit = 100 * value, "%"
  half_a_digit = 0.5 * 10 ** -len(quoted.group(2) or "")
  return quoted.group(3) == unit and abs(float(quoted.group(1)) - value) <= half_a_digit * 1.0001


BLOCKS = [(page, path, block) for page in pages() for path, block in BLOCK.findall(read(page))]


def test_the_docs_quote_results():
  assert {page for page, _, _ in BLOCKS} >= {"docs/results/listops.md",
                                             "docs/results/benchmarks.md"}


@pytest.mark.parametrize("page,path,block", BLOCKS,
                         ids=[f"{page}:{path}:{i}" for i, (page, path, _) in enumerate(BLOCKS)])
def test_quoted_table_is_a_committed_result(page, path, block):
  assert not path.startswith(EXPLORATORY), f"{page} quotes the exploratory {path} as a result"
  assert os.path.exists(os.path.join(ROOT, path)), f"{page} quotes {path}, not committed"
  quoted = markdown_tables(block)
  assert len(quoted) == 1 and quoted[0], f"the block of {page} quoting {path} is not one table"
  rows = [row for table in source_tables(path) for row in table]
  for row in quoted[0]:
    missing = [column for column in row if all(column not in r for r in rows)]
    assert not missing, f"{path} has no column {missing}"
    assert any(all(matches(cell, r.get(column, "")) for column, cell in row.items())
               for r in rows), f"{page}'s row {row} is no row of {path}"


def run_directories(root: str) -> list[str]:
  """Directories under root holding a run's files (config.json or metrics.jsonl)."""
  return sorted(d for d, _, names in os.walk(root)
                if {"config.json", "metrics.jsonl"} & set(names))


def test_every_run_in_results_has_finished_and_is_listed():
  results = os.path.join(ROOT, "results")
  exploratory = os.path.join(ROOT, EXPLORATORY)
  runs = [d for d in run_directories(results) if not d.startswith(exploratory)]
  assert runs
  unfinished = [d for d in runs if not os.path.exists(os.path.join(d, "final_metrics.json"))]
  assert not unfinished, f"stopped runs belong in {EXPLORATORY}: {unfinished}"
  for folder, readme in ((results, "results/README.md"), (exploratory, f"{EXPLORATORY}README.md")):
    listed = read(readme)
    for name in sorted(os.listdir(folder)):
      if name != "README.md" and os.path.join(folder, name) != exploratory.rstrip("/"):
        assert f"`{name}" in listed, f"{readme} does not list {name}"


@pytest.mark.parametrize("shown,figure,expected", [
    ("37.25%", "0.3725", True), ("37.3%", "0.3725", True), ("37.1%", "0.3725", False),
    ("13.2", "13.160409659957303", True), ("13", "13.16", True), ("13.16", "13.2", False),
    ("2.04×", "2.04×", True), ("2.0×", "2.04×", True), ("2.0", "2.04×", False),
    ("1.69 GiB", "1.694 GiB", True), ("linear", "linear", True), ("linear", "full", False),
    ("0.00005", "5.487e-05", True), ("0.00006", "5.487e-05", False)])
def test_cells_match_by_rounding_to_the_page_decimals(shown, figure, expected):
  assert matches(shown, figure) is expected
