"""Notebooks stay paired with their percent-format scripts and run (quick mode) in CI."""

import os

import jupytext
import nbclient
import pytest

pytestmark = pytest.mark.slow

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "notebooks")
NAMES = sorted(n[:-6] for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_paired_with_its_script(name):
  notebook = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"))
  script = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.py"))
  cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]
  assert cells(notebook) == cells(script), "run: jupytext --sync notebooks/*.py"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_quick_mode(name, monkeypatch):
  monkeypatch.setenv("NOTEBOOK_QUICK", "1")
  notebook = jupytext.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"))
  nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": NOTEBOOKS}}).execute()
  outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
  assert any("|---|" in m for m in markdown)                      # a results table
  assert any("image/png" in o.get("data", {}) for o in outputs)
