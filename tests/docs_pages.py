"""The documentation's pages, for the tests that check them: README.md and every docs/ page,
as paths relative to the repository."""

import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def docs_pages() -> list[str]:
  """Every page under docs/, sorted."""
  return sorted(os.path.relpath(path, ROOT)
                for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def pages() -> list[str]:
  """README.md, then every docs/ page."""
  return ["README.md", *docs_pages()]


def read(page: str) -> str:
  """The text of the page at `page`, relative to the repository."""
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    return f.read()
