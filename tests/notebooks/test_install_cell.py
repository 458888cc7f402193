"""A notebook's first cell as Colab runs it: in a fresh environment where JAX was installed
first and this package was not, it clones the repository from the address typed into its form
(here a local git address), installs it keeping that JAX, and `research` imports in the
running kernel without a restart; with the address unset it stops in one line.

The environment, and why so: a new virtual environment (no packages, no pip) whose
site-packages holds one `.pth` line naming a directory of links to every entry of this
interpreter's site-packages except this project's own distribution. So jax (the pinned one),
flax, pip and setuptools import and `research` does not, and pip sees the project as not
installed; the network is not needed (no index, no build isolation: every dependency is
present). A plain `--system-site-packages` venv would see the base interpreter's packages,
not this one's. The linked directory lies outside the environment, so a pip that wanted
another JAX would install it into the environment (where the test sees it) and could not
remove the linked one. The cells run in IPython's shell, as in a kernel.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv

import pytest
from tiers import long_cases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = sorted(n for n in os.listdir(os.path.join(ROOT, "notebooks")) if n.endswith(".ipynb"))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
  DISTRIBUTION = re.sub(r"[-_.]+", "_", tomllib.load(f)["project"]["name"]).lower()
FORM_ADDRESS = re.compile(r'^REPOSITORY = "[^"]*"', re.M)     # the form's text field

# Runs the cells in files argv[1:] in order in one IPython shell, as a kernel would; exits 3
# at the first that fails.
RUN_CELL = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for path in sys.argv[1:]:
  if not shell.run_cell(open(path).read()).success:
    sys.exit(3)
"""
# The same in a fresh environment, then what the next cells see.
RUN_FIRST_CELL = """
import importlib.metadata, importlib.util, json, sys
before = importlib.metadata.version("jax"), importlib.util.find_spec("jax").origin
assert importlib.util.find_spec("research") is None, "research importable before the cell"
""" + RUN_CELL + """
import colab, research
root = shell.user_ns["root"]
sys.path.remove(root)                                   # without the cell's entry:
for name in [n for n in sys.modules if n == "research" or n.startswith("research.")]:
  del sys.modules[name]
importlib.invalidate_caches()
print(json.dumps({"root": root, "research": research.__file__, "colab": colab.__file__,
                  "jax_before": before,
                  "without_the_entry": importlib.util.find_spec("research") is not None}))
"""


def code_cells(name: str) -> list[str]:
  with open(os.path.join(ROOT, "notebooks", name), encoding="utf-8") as f:
    return ["".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code"]


def test_every_notebook_starts_with_the_same_first_cell():
  """What the tests below run for one notebook holds for all of them."""
  first = {name: code_cells(name)[0] for name in NAMES}
  assert len(set(first.values())) == 1, "the notebooks' first code cells differ"
  assert "colab.install(root, RUNS_ON_DRIVE)" in first[NAMES[0]]
  assert len(FORM_ADDRESS.findall(first[NAMES[0]])) == 1
  assert all("colab.setup(root" in code_cells(name)[1] for name in NAMES)


def test_an_unset_address_stops_the_first_cell_in_one_line(tmp_path):
  """Where no checkout is around it (Colab's /content) and the form holds the placeholder."""
  content = tmp_path / "content"
  content.mkdir()
  cell = tmp_path / "cell.py"
  cell.write_text(code_cells(NAMES[0])[0])
  result = subprocess.run([sys.executable, "-c", RUN_CELL, str(cell)], cwd=content,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 3, result.stderr[-2000:]
  lines = (result.stdout + result.stderr).strip().splitlines()
  assert len(lines) == 1 and "python3 tools/set_repository.py OWNER/NAME" in lines[0], lines
  assert not os.listdir(content)                         # nothing cloned


def environment_with_jax_first(tmp_path) -> tuple[str, str, str, dict]:
  """(python, its site-packages, the linked directory, the process environment)."""
  installed = tmp_path / "installed_first"      # this interpreter's packages, less ours
  installed.mkdir()
  site = sysconfig.get_paths()["purelib"]
  for entry in os.listdir(site):
    if DISTRIBUTION not in re.sub(r"[-_.]+", "_", entry).lower():
      os.symlink(os.path.join(site, entry), installed / entry)
  env = tmp_path / "env"
  venv.create(env, with_pip=False)
  python = str(env / "bin" / "python")
  env_site = subprocess.run(
      [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(env_site, "installed_first.pth"), "w") as f:
    f.write(f"{installed}\n")
  environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
  environ |= {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PYTHONNOUSERSITE": "1",
              "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
  return python, env_site, str(installed), environ


def git_repository(tmp_path, notebook: str | None) -> str:
  """A git repository of this working tree (what a clone reads), as a file:// address: the
  package and `notebook` (None: every file git would commit here)."""
  origin = tmp_path / "origin"
  origin.mkdir()
  if notebook is None:
    names = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
  else:
    names = ["pyproject.toml", "README.md", "LICENSE", "notebooks/colab.py",
             f"notebooks/{notebook}"]
    names += [os.path.relpath(os.path.join(d, f), ROOT)
              for d, _, files in os.walk(os.path.join(ROOT, "research"))
              if "__pycache__" not in d for f in files]
  for name in names:
    if os.path.isfile(os.path.join(ROOT, name)):
      os.makedirs(origin / os.path.dirname(name), exist_ok=True)
      shutil.copy(os.path.join(ROOT, name), origin / name)
  git = ["git", "-C", str(origin), "-c", "user.name=test", "-c", "user.email=test@localhost"]
  for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "the working tree"]):
    subprocess.run(git + command, check=True, capture_output=True)
  return f"file://{origin}"


@pytest.mark.slow      # a real pip install (about 10 s a notebook): one in the suite
@pytest.mark.parametrize("notebook", long_cases(NAMES, NAMES[1:]))
def test_first_cell_installs_from_a_git_address_and_keeps_the_pinned_jax(tmp_path, notebook):
  python, env_site, installed, environ = environment_with_jax_first(tmp_path)
  address = git_repository(tmp_path, notebook)
  cell = tmp_path / "cell.py"                             # the form's field, typed in
  cell.write_text(FORM_ADDRESS.sub(f'REPOSITORY = "{address}"', code_cells(notebook)[0]))
  content = tmp_path / "content"
  content.mkdir()
  result = subprocess.run([python, "-c", RUN_FIRST_CELL, str(cell)], cwd=content, env=environ,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  seen = json.loads(result.stdout.strip().splitlines()[-1])
  clone = content / "research-repo"
  assert seen["root"] == str(clone)
  assert seen["research"] == str(clone / "research" / "__init__.py")
  assert seen["colab"] == str(clone / "notebooks" / "colab.py")
  # pip's .pth file is not read by the process that ran pip (Colab's kernel): only the
  # cell's sys.path entry made `import research` work there ...
  assert not seen["without_the_entry"]
  # ... while pip did install the clone, and kept the JAX it found: a new process of the
  # environment imports research from the clone and jax, at its version, from where it was.
  assert any(entry.startswith(DISTRIBUTION) and entry.endswith(".dist-info")
             for entry in os.listdir(env_site))
  after = subprocess.run(
      [python, "-c", "import importlib.metadata as m, importlib.util as u, json, research; "
       "print(json.dumps([research.__file__, m.version('jax'), u.find_spec('jax').origin]))"],
      cwd=tmp_path, env=environ, capture_output=True, text=True)
  research_file, *jax_after = json.loads(after.stdout)
  assert research_file == str(clone / "research" / "__init__.py"), after.stderr
  assert jax_after == seen["jax_before"]
  assert jax_after[1].startswith(installed)



@pytest.mark.slow      # a pip install and the notebook in quick mode (10-20 s): one in the suite
@pytest.mark.parametrize("notebook", long_cases(NAMES, NAMES[1:]))
def test_a_notebook_installed_by_its_first_cell_runs_to_its_end_in_quick_mode(tmp_path,
                                                                             notebook):
  """As a new user would on Colab: the first cell clones the repository (every file of this
  working tree) into the fresh environment holding a pinned JAX and installs it; then every
  other cell runs in the same shell, in quick mode, and the pinned JAX is still the one."""
  python, _, installed, environ = environment_with_jax_first(tmp_path)
  cells = code_cells(notebook)
  cells[0] = FORM_ADDRESS.sub(f'REPOSITORY = "{git_repository(tmp_path, None)}"', cells[0])
  paths = [tmp_path / f"cell{number}.py" for number in range(len(cells))]
  for path, source in zip(paths, cells):
    path.write_text(source)
  content = tmp_path / "content"
  content.mkdir()
  result = subprocess.run([python, "-c", RUN_CELL, *map(str, paths)], cwd=content,
                          env=environ | {"NOTEBOOK_QUICK": "1", "MPLBACKEND": "Agg"},
                          capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  after = subprocess.run([python, "-c", "import importlib.util as u; "
                          "print(u.find_spec('jax').origin)"], cwd=tmp_path, env=environ,
                         capture_output=True, text=True, check=True)
  assert after.stdout.strip().startswith(installed)
