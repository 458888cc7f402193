"""The documentation holds together: README.md is a short front door from which every docs/
page is reachable by links, every relative link of README.md, docs/ and results/'s READMEs
names an existing file (and heading, where it names one), and each figure of the README's
headline table is one of the checked quoted tables of the page its row links to
(tests/test_docs_results.py and tests/test_docs_figures.py check those against
the committed results)."""

import os
import re
import urllib.parse

import pytest
from docs_pages import ROOT, docs_pages, read

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
HEADLINE = re.compile(r"<!-- headline\b[^>]*-->\n(.*?)<!-- /headline -->", re.S)
QUOTED = re.compile(r"<!-- from \S+ -->\n(.*?)<!-- /from -->", re.S)
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%|(?<![\w.])\d+\.\d+(?![\d.])")
README_MAX_LINES = 200


def prose(text: str) -> str:
  """The text without code blocks and inline code, where links are not links."""
  return CODE.sub("", FENCE.sub("", text))


def documents() -> list[str]:
  return ["README.md", "CHANGELOG.md", "results/README.md", "results/exploratory/README.md",
          *docs_pages()]


def relative_links(path: str) -> list[tuple[str, str]]:
  """(file, anchor) of each relative link of the document at path, file relative to ROOT
  (the document itself for a bare #anchor)."""
  links = []
  for target in LINK.findall(prose(read(path))):
    if urllib.parse.urlparse(target).scheme:
      continue
    file, _, anchor = target.partition("#")
    file = os.path.normpath(os.path.join(os.path.dirname(path), urllib.parse.unquote(file)))
    links.append((file if target[0] != "#" else path, anchor))
  return links


def anchors(path: str) -> set[str]:
  """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces
  as hyphens, a repeated heading numbered -1, -2, …"""
  seen, found = {}, set()
  for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", FENCE.sub("", read(path)), re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
    seen[slug] = seen.get(slug, 0) + 1
  return found


@pytest.mark.parametrize("path", documents())
def test_relative_links_name_existing_files_and_headings(path):
  for file, anchor in relative_links(path):
    assert os.path.exists(os.path.join(ROOT, file)), f"{path} links to {file}: no such file"
    if anchor and file.endswith(".md"):
      assert anchor in anchors(file), f"{path} links to {file}#{anchor}: no such heading"


def test_every_docs_page_is_reachable_from_the_readme():
  reached, todo = set(), ["README.md"]
  while todo:
    page = todo.pop()
    if page in reached or not os.path.exists(os.path.join(ROOT, page)):
      continue
    reached.add(page)
    todo += [file for file, _ in relative_links(page) if file.endswith(".md")]
  docs = set(docs_pages())
  assert docs and not docs - reached, f"not reachable from README.md: {sorted(docs - reached)}"


def test_the_readme_is_a_front_door():
  lines = read("README.md").splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_headline_figures_are_the_linked_pages_checked_figures():
  blocks = HEADLINE.findall(read("README.md"))
  assert len(blocks) == 1, "README.md has no headline table"
  rows = [line for line in blocks[0].splitlines()[2:] if line.startswith("|")]
  assert rows
  for row in rows:
    pages = [file for file, _ in relative_links_of(row) if file.startswith("docs/results/")]
    assert len(set(pages)) == 1, f"a headline row links to no one results page: {row}"
    quoted = "\n".join(QUOTED.findall(read(pages[0])))
    figures = FIGURE.findall(prose(LINK.sub("", row)))
    assert figures, f"a headline row without figures: {row}"
    for figure in figures:
      assert re.search(rf"(?<![\w.]){re.escape(figure)}(?![\d])", quoted), (
          f"README.md's headline figure {figure} is in no quoted table of {pages[0]}")


def relative_links_of(markdown: str) -> list[tuple[str, str]]:
  """relative_links of a snippet of README.md."""
  return [(os.path.normpath(urllib.parse.unquote(t.partition("#")[0])), t.partition("#")[2])
          for t in LINK.findall(markdown) if not urllib.parse.urlparse(t).scheme]


def test_figures_are_found_with_their_units():
  assert FIGURE.findall("100% exact, 1.693 bits, 5.86× speed, T = 100, v5e, 3.11.7") == [
      "100%", "1.693", "5.86"]
