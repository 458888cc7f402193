"""The docs' result tables are the notebooks' committed outputs, figure for figure.

Each block of README.md or of a docs/ page between `<!-- from notebooks/NAME.ipynb -->` and
`<!-- /from -->` must appear, line for line, in one output of NAME.ipynb as committed (a
markdown table or printed text). Nothing is trained: both files are read as they are in the
repository.
"""

import json
import os
import re

import pytest
from docs_pages import ROOT, pages, read

NOTEBOOKS = os.path.join(ROOT, "notebooks")
BLOCK = re.compile(r"<!-- from notebooks/([\w.-]+\.ipynb) -->\n(.*?)<!-- /from -->", re.S)


def lines(text: str) -> list[str]:
  """Non-blank lines without trailing spaces; a code fence around printed text dropped."""
  return [line.rstrip() for line in text.splitlines()
          if line.strip() and not line.startswith("```")]


def committed_outputs(name: str) -> list[str]:
  """Every markdown and printed-text output of the notebook as committed."""
  with open(os.path.join(NOTEBOOKS, name), encoding="utf-8") as f:
    cells = json.load(f)["cells"]
  texts = []
  for output in (o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])):
    text = output.get("text") or output.get("data", {}).get("text/markdown")
    if text is not None:
      texts.append("".join(text) if isinstance(text, list) else text)
  return texts


def contains(output: list[str], block: list[str]) -> bool:
  return any(output[i:i + len(block)] == block for i in range(len(output) - len(block) + 1))


BLOCKS = [(page, name, block) for page in pages() for name, block in BLOCK.findall(read(page))]


def test_every_notebook_with_a_results_table_is_quoted_in_the_docs():
  quoted = {name for _, name, _ in BLOCKS}
  with_tables = {name for name in os.listdir(NOTEBOOKS) if name.endswith(".ipynb")
                 and any("|---" in text for text in committed_outputs(name))}
  assert with_tables and with_tables <= quoted, f"quoted in no page: {with_tables - quoted}"


@pytest.mark.parametrize("page,name,block", BLOCKS,
                         ids=[f"{page}:{name}:{i}" for i, (page, name, _) in enumerate(BLOCKS)])
def test_quoted_block_is_a_committed_output_of_its_notebook(page, name, block):
  block = lines(block)
  assert block, f"an empty block of {page} quoting {name}"
  outputs = [lines(text) for text in committed_outputs(name)]
  if not any(contains(output, block) for output in outputs):
    nearest = max(outputs, key=lambda o: len(set(o) & set(block)), default=[])
    differing = [line for line in block if line not in nearest]
    pytest.fail(f"{page} quotes {name}, but these lines are in none of its committed "
                f"outputs:\n" + "\n".join(differing))
