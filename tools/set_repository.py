"""Sets the repository's address everywhere it is written, from a fork's URL.

    python3 tools/set_repository.py https://github.com/you/your-fork

pyproject.toml's `[project.urls] Repository` is the one source; the Colab badges and clone
commands of the README, the docs/ pages and the notebooks (.py and .ipynb) repeat it, and are
rewritten as text, so the notebooks' committed outputs stay as they are.
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Colab opens notebooks from GitHub, by OWNER/NAME (no .git)
GITHUB = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+)(?<!\.git)")


def repository(root: pathlib.Path) -> str:
  """pyproject.toml's [project.urls] Repository."""
  return tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def main(argv: list[str]) -> int:
  if len(argv) != 1 or not GITHUB.fullmatch(argv[0]):
    print(__doc__.strip(), file=sys.stderr)
    print("\nerror: give one URL of the form https://github.com/OWNER/NAME (no .git)",
          file=sys.stderr)
    return 2
  old, new = repository(ROOT), argv[0]
  old_path, new_path = GITHUB.fullmatch(old).group(1), GITHUB.fullmatch(new).group(1)
  colab = "colab.research.google.com/github/{}/"       # a badge: Colab's address of a notebook
  replace = {old: new, colab.format(old_path): colab.format(new_path)}
  pattern = re.compile(re.escape(old) + r"(?![\w.-])|" + re.escape(colab.format(old_path)))
  files = [ROOT / "pyproject.toml", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
           *sorted((ROOT / "notebooks").glob("*.py")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]
  for path in files:
    text = path.read_text(encoding="utf-8")
    path.write_text(pattern.sub(lambda m: replace[m.group(0)], text), encoding="utf-8")
  print(f"repository: {old} -> {new} in {len(files)} files")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
