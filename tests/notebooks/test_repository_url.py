"""The repository's address is pyproject.toml's `[project.urls] Repository`, and every Colab
badge and clone command in the README, the docs/ pages and the notebooks repeats exactly it;
tools/set_repository.py moves all of them to a fork's address at once."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BADGE = re.compile(r"https://colab\.research\.google\.com/github/([^/\s)\"]+/[^/\s)\"]+)/blob/"
                   r"[^/\s)\"]+/([^\s)\"]+)")
CLONE = re.compile(r"git\", \"clone\"|git clone")                 # a command or an argument list
URL = re.compile(r"https://github\.com/[^\s)\"'\\]+")
ASSIGNED = re.compile(r"^REPOSITORY = \"([^\"]*)\"", re.M)        # the install cell's


def repository(root: str) -> str:
  with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["urls"]["Repository"]


def notebooks(root: str) -> list[str]:
  return [*sorted(glob.glob(os.path.join(root, "notebooks", "*.py"))),
          *sorted(glob.glob(os.path.join(root, "notebooks", "*.ipynb")))]


def documents(root: str) -> list[str]:
  return [os.path.join(root, "README.md"),
          *sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)),
          *notebooks(root)]


def read(path: str) -> str:
  """The text of a document; of a notebook (.ipynb), its cells' sources."""
  with open(path, encoding="utf-8") as f:
    if not path.endswith(".ipynb"):
      return f.read()
    return "\n".join("".join(cell["source"]) for cell in json.load(f)["cells"])


def addresses(root: str) -> dict[str, list[str]]:
  """Per document: the repository addresses its badges, clone commands and install cell
  name (a badge's `github/OWNER/NAME` read as https://github.com/OWNER/NAME)."""
  found = {}
  for path in documents(root):
    text = read(path)
    urls = [f"https://github.com/{m.group(1)}" for m in BADGE.finditer(text)]
    urls += [u for line in text.splitlines() if CLONE.search(line) for u in URL.findall(line)]
    urls += ASSIGNED.findall(text)
    found[os.path.relpath(path, root)] = urls
  return found


def check(root: str) -> None:
  expected = repository(root)
  assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+(?<!\.git)", expected), expected
  found = addresses(root)
  wrong = {path: [u for u in urls if u != expected] for path, urls in found.items()}
  assert not any(wrong.values()), f"not pyproject.toml's {expected}: {wrong}"
  # Every notebook (both forms) has its badge and install cell; the README its badges, the
  # accelerators page its clone command.
  for path in ["README.md", os.path.join("docs", "accelerators.md"),
               *(os.path.relpath(p, root) for p in notebooks(root))]:
    assert found[path], f"{path} names no repository address"
  for path in notebooks(root):
    text = read(path)
    badges = [m.group(2) for m in BADGE.finditer(text)]
    assert badges == [f"notebooks/{os.path.splitext(os.path.basename(path))[0]}.ipynb"], badges
    assert len(ASSIGNED.findall(text)) == 1, f"{path}: no install cell naming REPOSITORY"


def test_badges_and_clone_urls_are_pyprojects():
  check(ROOT)


def test_set_repository_moves_every_address_and_keeps_the_rest(tmp_path):
  for name in ("pyproject.toml", "README.md", "docs", "tools", "notebooks"):
    source = os.path.join(ROOT, name)
    (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, tmp_path / name)
  fork = "https://github.com/someone/a-fork"
  subprocess.run([sys.executable, str(tmp_path / "tools" / "set_repository.py"), fork],
                 check=True, capture_output=True)
  assert repository(tmp_path) == fork
  check(tmp_path)
  # Only the addresses changed: put the old one back and every file is as it was.
  old = repository(ROOT)
  for path in documents(ROOT):
    with open(path, encoding="utf-8") as f:
      original = f.read()
    with open(tmp_path / os.path.relpath(path, ROOT), encoding="utf-8") as f:
      moved = f.read()
    assert moved.replace("someone/a-fork", old.removeprefix("https://github.com/")) == original


def test_set_repository_refuses_an_address_colab_cannot_open(tmp_path):
  result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "set_repository.py"),
                           "git@github.com:someone/a-fork.git"], capture_output=True, text=True)
  assert result.returncode == 2
  assert "https://github.com/OWNER/NAME" in result.stderr
  result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "set_repository.py"),
                           "https://github.com/someone/a-fork.git"], capture_output=True)
  assert result.returncode == 2
