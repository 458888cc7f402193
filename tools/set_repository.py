"""Sets the repository's address: pyproject.toml's `[project.urls] Repository`, and from it
every copy, which cannot read pyproject.toml (a notebook opened from its badge has no checkout
yet): the Colab badges and clone commands of the README, docs/ and the notebooks (.py and
.ipynb), and each notebook's first cell (`REPOSITORY = ...`).

    python3 tools/set_repository.py OWNER/NAME      # or https://github.com/OWNER/NAME

Colab opens notebooks from GitHub, so the address is a GitHub repository's. Only the addresses
are rewritten, as text: the notebooks' committed outputs stay as they are.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAME = r"[\w.-]+/[\w.-]+?"                                   # OWNER/NAME
GITHUB = re.compile(rf"(?:https://github\.com/)?({NAME})(?:\.git)?/?")
# Each copy: (a pattern whose group 1 and 3 stay, group 2 is the address or OWNER/NAME)
COPIES = [
    (re.compile(r'^(Repository = ")([^"]*)(")', re.M), "url"),                  # pyproject
    (re.compile(rf"(colab\.research\.google\.com/github/)({NAME})(/blob/)"), "name"),
    (re.compile(r'(REPOSITORY = \\?")([^"\\]*)(\\?")'), "url"),           # a first cell (.ipynb: \")
    (re.compile(r"(git clone [^\n]*?)(https://github\.com/[\w.-]+/[\w.-]+)(\s|$)", re.M), "url"),
]


def files(root: pathlib.Path) -> list[pathlib.Path]:
  """Where the address is written: pyproject.toml, the README, docs/ and the notebooks."""
  notebooks = sorted((root / "notebooks").glob("*.ipynb"))
  return [root / "pyproject.toml", root / "README.md", *sorted((root / "docs").rglob("*.md")),
          *(path.with_suffix(".py") for path in notebooks), *notebooks]


def rewrite(text: str, name: str) -> str:
  """`text` with every copy of the address set to github.com/`name`."""
  value = {"url": f"https://github.com/{name}", "name": name}
  for pattern, kind in COPIES:
    text = pattern.sub(lambda m, kind=kind: m.group(1) + value[kind] + m.group(3), text)
  return text


def main(argv: list[str]) -> int:
  match = GITHUB.fullmatch(argv[0]) if len(argv) == 1 else None
  if match is None:
    print(__doc__.strip(), file=sys.stderr)
    print("\nerror: give one GitHub repository: OWNER/NAME or https://github.com/OWNER/NAME",
          file=sys.stderr)
    return 2
  paths = files(ROOT)
  for path in paths:
    text = path.read_text(encoding="utf-8")
    path.write_text(rewrite(text, match.group(1)), encoding="utf-8")
  print(f"repository: https://github.com/{match.group(1)} in {len(paths)} files")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
