"""The repository's address is pyproject.toml's `[project.urls] Repository`, and every Colab
badge and clone command in the README, the docs/ pages and the notebooks, and each notebook's
first cell, repeats exactly it; tools/set_repository.py writes all of them from one argument."""

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
  """Both forms of every notebook (not notebooks/colab.py, which is no notebook)."""
  paired = sorted(glob.glob(os.path.join(root, "notebooks", "*.ipynb")))
  return [*(path[:-len(".ipynb")] + ".py" for path in paired), *paired]


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


def copy_of_the_checkout(tmp_path) -> str:
  for name in ("pyproject.toml", "README.md", "docs", "tools", "notebooks"):
    source = os.path.join(ROOT, name)
    (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, tmp_path / name)
  return str(tmp_path)


def set_repository(root: str, *arguments: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, os.path.join(root, "tools", "set_repository.py"),
                         *arguments], capture_output=True, text=True)


def test_set_repository_moves_every_address_and_keeps_the_rest(tmp_path):
  root = copy_of_the_checkout(tmp_path)
  assert set_repository(root, "https://github.com/someone/a-fork").returncode == 0
  assert repository(root) == "https://github.com/someone/a-fork"
  check(root)
  # Only the addresses changed: put the old one back and every file is as it was.
  old = repository(ROOT)
  for path in documents(ROOT):
    with open(path, encoding="utf-8") as f:
      original = f.read()
    with open(os.path.join(root, os.path.relpath(path, ROOT)), encoding="utf-8") as f:
      moved = f.read()
    assert moved.replace("someone/a-fork", old.removeprefix("https://github.com/")) == original


def test_set_repository_writes_every_copy_from_its_argument_alone(tmp_path):
  """A copy that differs (a badge edited by hand) is written anew too, from OWNER/NAME."""
  root = copy_of_the_checkout(tmp_path)
  readme = os.path.join(root, "README.md")
  with open(readme, encoding="utf-8") as f:
    text = f.read()
  drifted = re.sub(r"colab\.research\.google\.com/github/[^/]+/[^/]+/",
                   "colab.research.google.com/github/an/old-one/", text, count=1)
  assert drifted != text
  with open(readme, "w", encoding="utf-8") as f:
    f.write(drifted)
  assert set_repository(root, "someone/a-fork").returncode == 0
  check(root)
  assert repository(root) == "https://github.com/someone/a-fork"


def test_set_repository_refuses_what_colab_cannot_open(tmp_path):
  root = copy_of_the_checkout(tmp_path)
  for argument in ("https://gitlab.com/someone/a-fork", "a-fork", "file:///srv/git/repo"):
    refused = set_repository(root, argument)
    assert refused.returncode == 2 and "OWNER/NAME" in refused.stderr.splitlines()[-1]
  check(root)
  assert repository(root) == repository(ROOT)
