"""docs/architecture.md is the code map: every module under research/ is named in it, and no
module imports from a layer above its own (the layers as the page lists them)."""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "architecture.md")


def _page() -> str:
  with open(PAGE, encoding="utf-8") as f:
    return f.read()


def _modules() -> list[str]:
  """research/**/*.py, relative to the repository."""
  found = []
  for directory, _, names in os.walk(os.path.join(ROOT, "research")):
    found += [os.path.relpath(os.path.join(directory, name), ROOT) for name in names
              if name.endswith(".py")]
  return sorted(found)


def _named_in_map(page: str) -> set[str]:
  """The module paths the page's map names: a path written whole (research/files.py), or a
  file name on the lines under a package's heading (`research/training/` then `  loop.py`)."""
  block = page.split("```")[1]
  named, package = set(re.findall(r"research/[\w/]+\.py", block)), None
  for line in block.splitlines():
    heading = re.match(r"(research/[\w/]+/)", line)
    if heading:
      package = heading.group(1)
    elif not line.startswith(" "):
      package = None
    if package:
      named |= {package + name for name in re.findall(r"\b(\w+\.py)\b", line)}
  return named


def _layers(page: str) -> dict[str, int]:
  """{package: its layer, 0 the top} from the page's line `Layers, top to bottom: a → b, c → …`."""
  line = re.search(r"^Layers, top to bottom: (.+)$", page, re.MULTILINE)
  assert line, "docs/architecture.md has no line 'Layers, top to bottom: …'"
  return {name.strip(): depth for depth, group in enumerate(line.group(1).split("→"))
          for name in group.split(",")}


def _package(module: str) -> str:
  """research.training.loop -> training; research.files -> files."""
  return module.split(".")[1]


def _imports(path: str, root: str = ROOT) -> set[str]:
  """The research.* modules `path` (under `root`) imports, at any depth of the file."""
  with open(os.path.join(root, path), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("research."):
      found.add(node.module)
    elif isinstance(node, ast.ImportFrom) and node.module == "research":
      found |= {f"research.{alias.name}" for alias in node.names}
    elif isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names if alias.name.startswith("research.")}
  return found


def test_every_module_under_research_is_named_in_the_map():
  named = _named_in_map(_page())
  missing = [module for module in _modules() if module not in named
             and not module.endswith("__init__.py")]
  assert not missing, f"docs/architecture.md does not name {missing}"
  gone = sorted(path for path in named if not os.path.exists(os.path.join(ROOT, path)))
  assert not gone, f"docs/architecture.md names modules that are not there: {gone}"


def test_the_layers_cover_every_package():
  layers = _layers(_page())
  packages = {module.split(os.sep)[1].removesuffix(".py") for module in _modules()
              if module != os.path.join("research", "__init__.py")}
  assert packages == set(layers), (packages ^ set(layers))


@pytest.mark.parametrize("module", _modules())
def test_no_module_imports_from_a_layer_above_its_own(module):
  layers = _layers(_page())
  own = module.split(os.sep)[1].removesuffix(".py")
  bottom = max(layers.values())   # research/__init__.py runs first in every import of research
  upward = sorted(imported for imported in _imports(module)
                  if layers[_package(imported)] < layers.get(own, bottom))
  assert not upward, f"{module} imports {upward}, from a layer above its own ({own})"


def test_the_layer_check_sees_an_upward_import(tmp_path):
  """The check itself: a training module importing an experiment (inside a function too)
  is caught."""
  fake = tmp_path / "research" / "training"
  fake.mkdir(parents=True)
  (fake / "bad.py").write_text("def f():\n  from research import experiments\n")
  (imported,) = _imports(os.path.join("research", "training", "bad.py"), str(tmp_path))
  assert _layers(_page())[_package(imported)] < _layers(_page())["training"]


# launch.py with the model raising inside the train step: the frames of our own files between
# the command and the model, printed one per line (the model's own frame left out)
TRAIN_STEP_FAILS = """
import os, sys, traceback
import launch
from research.models import seq2seq

def fail(self, *args, **kwargs):
  if any(frame.name == "step" and frame.filename.endswith("train_step.py")
         for frame in traceback.extract_stack()):
    raise RuntimeError("the model fails in the train step")
  return call(self, *args, **kwargs)

call, seq2seq.Seq2Seq.__call__ = seq2seq.Seq2Seq.__call__, fail
try:
  launch.run(["launch.py", "--workdir", sys.argv[1], "--config.train.num_steps=2",
              "--config.model.hidden_size=8", "--config.train.batch_size=4"])
except RuntimeError as error:
  for frame in traceback.extract_tb(error.__traceback__)[:-1]:
    path = os.path.abspath(frame.filename)
    if path.startswith(os.getcwd()) and "site-packages" not in path and frame.filename[0] != "<":
      print(os.path.relpath(path), frame.name)
"""


@pytest.mark.slow
def test_a_traceback_from_launch_to_the_model_in_the_train_step_holds_ten_frames_of_ours(
    tmp_path):
  """The runtime's depth as a reader of a traceback meets it: at most 10 frames of our own
  from launch.py to the model's __call__ in the train step (`python launch.py` adds the
  module's frame to those printed here, from launch.run to the experiment's loss)."""
  done = subprocess.run([sys.executable, "-c", TRAIN_STEP_FAILS, str(tmp_path / "run")],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  frames = done.stdout.splitlines()
  assert frames[0] == "launch.py run" and frames[-1].startswith("research/experiments/"), (
      done.stdout + done.stderr[-3000:])
  assert 1 + len(frames) <= 10, "\n".join(frames)
