"""A notebook's install cell makes `research` importable in the running kernel, without a
restart, in a fresh environment where JAX was installed first and the package was not: a
Colab runtime.

How the environment is made, and why: a new virtual environment (no packages, no pip)
whose site-packages holds one `.pth` line naming a directory of links to every entry of
this interpreter's site-packages except this project's own distribution (its dist-info and
editable-install files). So jax, flax, pip and setuptools import and `research` does not,
and pip sees the project as not installed. Hiding nothing (a plain
`--system-site-packages` venv) would leave `research` installed and test nothing; stubbing
pip would not show that a real editable install leaves the running process unable to
import. Here the cell runs as written: `pip install -e` of a copy of the checkout (offline:
no index, no build isolation, as every dependency is present) writes its `.pth` file, which
Python reads only at start-up, so the process that ran pip imports `research` only through
the checkout the cell put on `sys.path`; the test takes that entry out again to show the
import then fails, and starts a new process of the environment to show pip did install.
(The cells after it run in CI's quick-mode runs of every notebook: tests/notebooks.)
"""

import json
import os
import re
import shutil
import subprocess
import sysconfig
import textwrap
import tomllib
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = "nmt_attention_ablation.ipynb"

RUN_INSTALL_CELL = textwrap.dedent("""
  import importlib, importlib.util, json, os, sys
  assert importlib.util.find_spec("jax") is not None, "JAX must be installed first"
  assert importlib.util.find_spec("research") is None, "research importable before the cell"
  cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
  exec("".join(cells[0]["source"]))                          # the install cell
  import research
  from research import notebook as helper                    # what the next cell uses
  imported_from, helper_from = research.__file__, helper.__file__
  sys.path.remove(root)                                      # without the cell's entry:
  for name in [n for n in sys.modules if n == "research" or n.startswith("research.")]:
    del sys.modules[name]
  importlib.invalidate_caches()
  print(json.dumps({"root": root, "imported_from": imported_from, "helper_from": helper_from,
                    "without_the_entry": importlib.util.find_spec("research") is not None}))
""")


def normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "_", name).lower()


def code_cells(name: str) -> list[str]:
  with open(os.path.join(ROOT, "notebooks", name), encoding="utf-8") as f:
    return ["".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code"]


def test_every_notebook_starts_with_the_same_install_cell():
  """What the test below runs for one notebook holds for all of them."""
  first = {name: code_cells(name)[0] for name in os.listdir(os.path.join(ROOT, "notebooks"))
           if name.endswith(".ipynb")}
  assert len(set(first.values())) == 1, "the notebooks' first code cells differ"
  assert "notebook.install(root)" in first[NOTEBOOK]
  assert all("notebook.setup(root" in code_cells(name)[1] for name in first)


@pytest.mark.slow      # a real pip install (about 8 s): left out of quick runs
def test_install_cell_imports_without_a_restart_where_jax_came_first(tmp_path):
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    distribution = normalized(tomllib.load(f)["project"]["name"])
  checkout = tmp_path / "checkout"       # what `git clone` gives, less what the cells do not read
  checkout.mkdir()
  for name in ("pyproject.toml", "README.md", "LICENSE", "research"):
    source = os.path.join(ROOT, name)
    if os.path.isdir(source):
      shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy(source, checkout / name)
  (checkout / "notebooks").mkdir()
  shutil.copy(os.path.join(ROOT, "notebooks", NOTEBOOK), checkout / "notebooks")

  installed = tmp_path / "installed_first"      # this interpreter's packages, less ours
  installed.mkdir()
  site = sysconfig.get_paths()["purelib"]
  for entry in os.listdir(site):
    if distribution not in normalized(entry):
      os.symlink(os.path.join(site, entry), installed / entry)
  env = tmp_path / "env"
  venv.create(env, with_pip=False)
  python = str(env / "bin" / "python")
  env_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(env_site, "installed_first.pth"), "w") as f:
    f.write(f"{installed}\n")

  environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
  environ |= {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PYTHONNOUSERSITE": "1",
              "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
  result = subprocess.run([python, "-c", RUN_INSTALL_CELL, NOTEBOOK], cwd=checkout / "notebooks",
                          env=environ, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  seen = json.loads(result.stdout.strip().splitlines()[-1])
  assert seen["root"] == str(checkout)
  assert seen["imported_from"] == str(checkout / "research" / "__init__.py")
  assert seen["helper_from"] == str(checkout / "research" / "notebook.py")
  # pip's .pth file is not read by the process that ran pip (Colab's kernel): only the
  # cell's sys.path entry made `import research` work there ...
  assert not seen["without_the_entry"]
  # ... while pip did install the checkout: a new process of the environment imports it.
  assert any(entry.startswith(distribution) and entry.endswith(".dist-info")
             for entry in os.listdir(env_site))
  fresh = subprocess.run([python, "-c", "import research; print(research.__file__)"],
                         cwd=tmp_path, env=environ, capture_output=True, text=True)
  assert fresh.stdout.strip() == str(checkout / "research" / "__init__.py"), fresh.stderr
