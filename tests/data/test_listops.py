"""ListOps data against LRA's recipe, checked with a parser and evaluator written here
from the recipe's text (not from research.data.listops)."""

import collections
import os
import statistics

import pytest

from research.data import listops
from research.errors import InputError

SIZES = (300, 40, 40)
LENGTHS = (30, 200)


def parse(source: str):
  """LRA's left-nested source text -> (nodes, label): every operator node as (operator,
  argument count, depth), and the value, with a stack machine over its tokens."""
  stack, nodes = [[None, []]], []
  for token in source.split():
    if token == "(":
      continue
    if token.startswith("["):
      stack.append([token, []])
    elif token == "]":
      operator, values = stack.pop()
      nodes.append((operator, len(values), len(stack)))
      value = {"[MIN": min, "[MAX": max, "[SM": lambda xs: sum(xs) % 10,
               "[MED": lambda xs: int(statistics.median(xs))}[operator](values)
      stack[-1][1].append(value)
    elif token != ")":
      stack[-1][1].append(int(token))
  (root,) = stack
  (label,) = root[1]
  return nodes, label


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  directory = tmp_path_factory.mktemp("listops")
  named = tuple(zip(("train", "val", "test"), SIZES, strict=True))
  paths = listops.write_splits(directory, seed=3, splits=named, lengths=LENGTHS)
  return {name: listops.read_split(path) for name, path in paths.items()}


def test_the_files_hold_the_recipe(splits):
  assert {name: len(pairs) for name, pairs in splits.items()} == dict(
      zip(("train", "val", "test"), SIZES, strict=True))
  operators, arguments = collections.Counter(), collections.Counter()
  for pairs in splits.values():
    for source, label in pairs:
      nodes, value = parse(source)
      assert label == value
      length = sum(token not in "()" for token in source.split())   # digits, operators, ]
      assert LENGTHS[0] < length < LENGTHS[1]
      for operator, count, depth in nodes:
        assert 2 <= count <= 10 and depth <= listops.MAX_DEPTH - 1   # depth 10 is a digit
        operators[operator] += 1
        arguments[count] += 1
  assert set(operators) == {"[MIN", "[MAX", "[MED", "[SM"}
  assert set(arguments) == set(range(2, 11))
  labels = collections.Counter(label for pairs in splits.values() for _, label in pairs)
  assert set(labels) == set(range(10)) and max(labels.values()) / sum(labels.values()) < 0.3


def test_no_duplicates_and_splits_are_disjoint(splits):
  sources = [source for pairs in splits.values() for source, _ in pairs]
  assert len(set(sources)) == len(sources)


def test_a_seed_draws_the_same_trees_and_another_seed_others():
  first = listops.draw_split_trees(5, (20,), LENGTHS)
  assert first == listops.draw_split_trees(5, (20,), LENGTHS)
  assert first != listops.draw_split_trees(6, (20,), LENGTHS)


def test_the_source_text_is_lras():
  tree = ("[MAX", (2, 9, ("[MIN", (4, 7)), 0))
  assert listops.to_source(tree) == ("( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )")
  assert parse(listops.to_source(tree))[1] == listops.evaluate(tree) == 9
  assert listops.evaluate(("[MED", (1, 2, 4, 9))) == 3           # int(3.0)
  assert listops.evaluate(("[MED", (1, 2))) == 1                 # int(1.5)
  assert listops.evaluate(("[SM", (9, 8, 7))) == 4


def test_tokens_as_lra_reads_them_and_with_brackets():
  source = "( ( ( [SM 2 ) ( ( [MIN 4 ) 7 ) ] ) ) ] )"
  assert listops.tokenize(source) == ["SM", "2", "MIN", "4", "7"]
  assert listops.tokenize(source, brackets=True) == ["[SM", "2", "[MIN", "4", "7", "]", "]"]
  for brackets in (False, True):
    assert set(listops.tokenize(source, brackets)) <= set(listops.vocabulary(brackets))


def test_the_command_writes_three_files(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(listops, "LRA_SPLITS", (("train", 5), ("val", 2), ("test", 2)))
  monkeypatch.setattr(listops, "LRA_LENGTHS", LENGTHS)
  listops.main(["--output", str(tmp_path), "--seed", "1"])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["test.tsv", "train.tsv", "val.tsv"]
  assert (tmp_path / "train.tsv").read_text().startswith("Source\tTarget\n")
  assert "train.tsv" in capsys.readouterr().out


@pytest.mark.parametrize("content,message", [
    ("", "expected the header 'Source<TAB>Target', got an empty file"),
    ("Source\tTarget\n", "no examples after the header"),
    ("Source\tTarget\n( [MAX 1 ) ] )\t12\n", ":2: expected Source<TAB>Target with a target 0–9"),
    ("Source\tTarget\nno tab here\n", ":2: expected Source<TAB>Target"),
    ("text\tlabel\n1\t1\n", ":1: expected the header"),
])
def test_bad_files_name_file_and_line(tmp_path, content, message):
  path = tmp_path / "bad.tsv"
  path.write_text(content)
  with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
    listops.read_split(path)


def test_a_source_longer_than_the_csv_modules_field_limit_is_read(tmp_path):
  """LRA's files are read line by line: no csv field limit (131 072 characters) applies."""
  source = "( ( [SM " + "1 " * 100_000 + ") ] )"
  path = tmp_path / "long.tsv"
  path.write_text(f"Source\tTarget\n{source}\t0\n")
  assert listops.read_split(path) == [(source, 0)]


def test_a_file_that_cannot_be_read_is_named(tmp_path):
  path = tmp_path / "train.tsv"
  os.symlink("/proc/self/mem", path)                 # reading it fails even for root
  with pytest.raises(InputError, match=rf"{path}: cannot be read \(Input/output error\)"):
    listops.read_split(path)
