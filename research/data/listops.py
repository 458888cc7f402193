"""ListOps (Nangia & Bowman 2018) as the Long Range Arena made it (Tay et al., ICLR 2021):
trees of MIN, MAX, MED and SM over digits, their value the label (10 classes), drawn with
LRA's recipe, written in LRA's text and TSV layout and tokenised as LRA's pipeline does.

  python -m research.data.listops --output DIR [--seed S]    # LRA's three files
"""

import argparse
import csv
import os
import random
import re
import statistics

from research.errors import InputError, excerpt
from research.files import atomic_write

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
OPERATOR_PROBABILITY = 0.25
MAX_DEPTH = 10
MAX_ARGS = 10
NUM_CLASSES = 10
LRA_SPLITS = (("train", 96_000), ("val", 2_000), ("test", 2_000))
LRA_LENGTHS = (500, 2000)            # exclusive bounds on a tree's length
CLASS_NAMES = tuple(str(label) for label in range(NUM_CLASSES))   # a TSV row's Target
HEADER = ("Source", "Target")

# A tree: an int digit, or (operator, (argument trees...)).
Tree = int | tuple[str, tuple["Tree", ...]]


def draw_tree(rng: random.Random, depth: int = 1) -> tuple[Tree, int]:
  """(tree, length) drawn with LRA's recipe from `depth` (the root is depth 1).

  A tree is a digit 0–9 or an operator applied to 2–10 trees; below depth 10 a node is an
  operator with probability 0.25 (at depth 10 always a digit). A tree's length counts its
  digits, operators and closing brackets.
  """
  if depth >= MAX_DEPTH or rng.random() > OPERATOR_PROBABILITY:
    return rng.choice(range(10)), 1
  arguments, length = [], 2                       # the operator and its closing bracket
  for _ in range(rng.randint(2, MAX_ARGS)):
    argument, argument_length = draw_tree(rng, depth + 1)
    arguments.append(argument)
    length += argument_length
  return (rng.choice(OPERATORS), tuple(arguments)), length


def evaluate(tree: Tree) -> int:
  """The value of a tree, 0–9:

    MIN, MAX   the smallest / largest argument
    MED        int(median) of the arguments (the mean of the middle two, truncated)
    SM         the sum of the arguments mod 10
  """
  if isinstance(tree, int):
    return tree
  operator, arguments = tree
  values = [evaluate(argument) for argument in arguments]
  if operator == "[MIN":
    return min(values)
  if operator == "[MAX":
    return max(values)
  if operator == "[MED":
    return int(statistics.median(values))
  return sum(values) % 10


def to_source(tree: Tree) -> str:
  """LRA's text of a tree: ( ( [OP a1 ) a2 ) … an ) ] ), recursively; every operator
  application left-nested in parentheses:

    [MAX 2 9 [MIN 4 7 ] 0 ]   is written   ( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )
  """
  if isinstance(tree, int):
    return str(tree)
  operator, arguments = tree
  opened = "( " * (len(arguments) + 1)
  applied = " ".join(f"{to_source(argument)} )" for argument in arguments)
  return f"{opened}{operator} {applied} {END} )"


def draw_split_trees(seed: int, sizes: tuple[int, ...], lengths: tuple[int, int] = LRA_LENGTHS
                     ) -> list[list[Tree]]:
  """Distinct trees with lengths[0] < length < lengths[1], cut into consecutive groups of
  `sizes` in the order they were drawn (so no tree is in two groups).

  LRA keeps trees with 500 < length < 2000, rejects duplicates, and splits 96 000 / 2 000 /
  2 000 (train / val / test) in the order they were drawn. Deterministic for a seed: trees are
  drawn with Python's `random.Random(seed)`, in LRA's order of calls.
  """
  rng, seen, trees = random.Random(seed), set(), []
  while len(trees) < sum(sizes):
    tree, length = draw_tree(rng)
    if lengths[0] < length < lengths[1]:
      source = to_source(tree)
      if source not in seen:
        seen.add(source)
        trees.append(tree)
  starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
  return [trees[start:stop] for start, stop in zip(starts, starts[1:], strict=False)]


def write_splits(directory: str | os.PathLike, seed: int = 0, splits=LRA_SPLITS,
                 lengths: tuple[int, int] = LRA_LENGTHS) -> dict[str, str]:
  """Writes `<directory>/<split>.tsv` for each (split, size); returns split -> path.

  The files are LRA's TSV layout: `Source<TAB>Target` with that header, the source `to_source`.
  """
  os.makedirs(directory, exist_ok=True)
  groups = draw_split_trees(seed, tuple(size for _, size in splits), lengths)
  paths = {}
  for (name, _), trees in zip(splits, groups, strict=True):
    paths[name] = os.path.join(directory, f"{name}.tsv")
    with atomic_write(paths[name], "w", newline="", encoding="utf-8") as f:   # whole or absent
      writer = csv.writer(f, delimiter="\t", lineterminator="\n")
      writer.writerow(HEADER)
      writer.writerows((to_source(tree), evaluate(tree)) for tree in trees)
  return paths


def read_split(path: str | os.PathLike) -> list[tuple[str, int]]:
  """(source, label) pairs of an LRA ListOps TSV file (ours or LRA's own).

  Lines are split at tabs (LRA's sources hold no tab or quote, so no CSV quoting is read;
  a line may be as long as memory allows); pair i is on line i + 2. Raises InputError
  naming `path:line` for a file that cannot be read, is not UTF-8, lacks the header, or
  has a line that is not Source<TAB>Target with a target 0–9 (the message shows the
  target in full and the ends of the source).
  """
  pairs = []
  try:
    with open(path, "rb") as f:
      header = _text(f.readline(), f"{path}:1", "utf-8-sig")
      if _fields(header) != list(HEADER):
        got = excerpt(header.rstrip("\r\n")) if header else "an empty file"
        raise InputError(f"{path}:1: expected the header {'<TAB>'.join(HEADER)!r}, got {got}")
      for number, line in enumerate(f, start=2):
        where = f"{path}:{number}"
        pairs.append(_pair(_fields(_text(line, where)), where))
  except FileNotFoundError:
    raise InputError(f"{path}: no such ListOps file") from None
  except OSError as error:
    raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
  if not pairs:
    raise InputError(f"{path}: no examples after the header")
  return pairs


def _text(line: bytes, where: str, encoding: str = "utf-8") -> str:
  try:
    return line.decode(encoding)
  except UnicodeDecodeError as error:
    raise InputError(f"{where}: not UTF-8 text ({error.reason} at byte {error.start} of the "
                     "line); save the file as UTF-8") from None


def _fields(line: str) -> list[str]:
  """A TSV line's tab-separated fields, without its line ending."""
  return line.rstrip("\r\n").split("\t")


def _pair(row: list[str], where: str) -> tuple[str, int]:
  """A row's (source, label); InputError naming `where` and showing the fault."""
  if len(row) != 2:
    got = "an empty line" if row == [""] else (f"{len(row)} fields: "
                                                + " <TAB> ".join(map(excerpt, row)))
    raise InputError(f"{where}: expected Source<TAB>Target with a target 0–{NUM_CLASSES - 1}, "
                     f"got {got}")
  source, target = row
  if target.strip() not in CLASS_NAMES:
    raise InputError(f"{where}: expected Source<TAB>Target with a target 0–{NUM_CLASSES - 1}, "
                     f"got the target {excerpt(target, 200)} after the source {excerpt(source)}")
  return source, int(target)


def tokenize(source: str, brackets: bool = False) -> list[str]:
  """LRA's tokens of a source text: operator names and digits ("MAX", "7"); with
  `brackets`, "[MAX" and "]" too (the parentheses are always dropped).

  LRA's input pipeline keeps only alphanumeric tokens (`brackets=False`: "MAX 2 9 MIN 4 7 0",
  the brackets dropped, so the tree's shape is lost); `brackets=True` keeps "[MAX" and "]"
  (not the parentheses, which only restate them).
  """
  if brackets:
    return [token for token in source.split() if token not in "()"]
  return re.findall(r"[A-Za-z0-9]+", source)


def vocabulary(brackets: bool = False) -> tuple[str, ...]:
  """Every token `tokenize` can return, in a fixed order (id = index + the caller's offset)."""
  operators = OPERATORS + (END,) if brackets else tuple(op[1:] for op in OPERATORS)
  return tuple(str(d) for d in range(10)) + operators


def main(argv=None):
  parser = argparse.ArgumentParser(description="Write LRA's ListOps train/val/test TSV files.")
  parser.add_argument("--output", required=True, help="directory for train.tsv, val.tsv, test.tsv")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for name, path in write_splits(args.output, args.seed, LRA_SPLITS).items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  main()
