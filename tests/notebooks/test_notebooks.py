"""Notebooks stay paired with their percent-format scripts and run (quick mode) in CI."""

import os

import jupytext
import nbclient
import pytest

pytestmark = pytest.mark.slow

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "notebooks")
NAMES = sorted(n[:-6] for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))
PROBE = "## Restore a run and ask it something new"   # every notebook's section after its results


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_paired_with_its_script(name):
  notebook = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"))
  script = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.py"))
  cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]
  assert cells(notebook) == cells(script), "run: jupytext --sync notebooks/*.ipynb"


@pytest.mark.long
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_quick_mode(name, monkeypatch):
  monkeypatch.setenv("NOTEBOOK_QUICK", "1")
  notebook = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"))
  nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": NOTEBOOKS}}).execute()
  outputs = code_outputs(notebook.cells)
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert has_table(outputs)                                       # a results table
  assert any("image/png" in o.get("data", {}) for o in outputs)
  # The section probing a restored run drew its own table and figure.
  probe = [i for i, c in enumerate(notebook.cells)
           if c.cell_type == "markdown" and c.source.startswith(PROBE)]
  assert len(probe) == 1, f"{name} has {len(probe)} sections {PROBE!r}"
  probed = code_outputs(notebook.cells[probe[0]:])
  assert has_table(probed)
  assert any("image/png" in o.get("data", {}) for o in probed)


def code_outputs(cells) -> list[dict]:
  return [o for c in cells if c.cell_type == "code" for o in c.get("outputs", [])]


def has_table(outputs) -> bool:
  """Whether a markdown output holds a table."""
  return any("|---|" in o["data"]["text/markdown"] for o in outputs
             if "text/markdown" in o.get("data", {}))
