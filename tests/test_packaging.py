"""pyproject.toml tells the truth: the Python range and each dependency minimum are what the
code needs (read from the dependencies' own metadata, or the first release that has an API
we call), the license is shipped, and the package reports the version it is installed as."""

import importlib
import importlib.metadata
import pathlib
import re
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# APIs we call that appeared late, with the first release that has them (release notes).
FIRST_RELEASE_WITH = {
    "optax": ("0.2.5", ["optax.tree.norm"]),
}


def version_tuple(text: str) -> tuple[int, ...]:
  return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def declared_minimum(distribution: str) -> tuple[int, ...]:
  """The `>=` bound of `distribution` in [project] dependencies."""
  for requirement in PROJECT["dependencies"]:
    match = re.match(rf"{re.escape(distribution)}(\[[^\]]*\])?\s*>=\s*([\d.]+)", requirement)
    if match:
      return version_tuple(match.group(2))
  raise AssertionError(f"{distribution} has no >= bound in [project] dependencies")


def test_python_range_is_the_one_our_jax_minimum_needs():
  """jax declares its own Requires-Python: ours may not promise an older Python."""
  ours = version_tuple(PROJECT["requires-python"])
  jax_needs = version_tuple(importlib.metadata.metadata("jax")["Requires-Python"])
  assert ours >= jax_needs, f"requires-python {PROJECT['requires-python']} < jax's {jax_needs}"


def test_shared_dependencies_are_not_older_than_what_jax_itself_requires():
  for requirement in importlib.metadata.requires("jax"):
    match = re.match(r"(numpy|ml_dtypes)\s*>=\s*([\d.]+)$", requirement)
    if match and any(r.startswith(match.group(1)) for r in PROJECT["dependencies"]):
      assert declared_minimum(match.group(1)) >= version_tuple(match.group(2)), requirement


@pytest.mark.parametrize("distribution", sorted(FIRST_RELEASE_WITH))
def test_minimums_have_every_api_we_call(distribution):
  first, apis = FIRST_RELEASE_WITH[distribution]
  assert declared_minimum(distribution) >= version_tuple(first)
  for api in apis:                                     # and the API is still there
    module, _, rest = api.partition(".")
    value = importlib.import_module(module)
    for name in rest.split("."):
      value = getattr(value, name)


def test_every_api_in_the_table_is_one_the_code_calls():
  """The table above is about this code: each API it lists is called under research/."""
  code = "\n".join(p.read_text() for p in (ROOT / "research").rglob("*.py"))
  for _, apis in FIRST_RELEASE_WITH.values():
    for api in apis:
      assert api in code, f"{api} is no longer called: drop it from FIRST_RELEASE_WITH"


def test_the_version_is_the_changelogs_latest_release():
  """research.__version__ is the newest numbered section of CHANGELOG.md (a release bumps
  both; what comes after it gathers under Unreleased)."""
  import research  # noqa: PLC0415
  releases = re.findall(r"^## (\d+\.\d+\.\d+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
  assert releases and releases[0] == research.__version__, (releases[:2], research.__version__)


def test_license_build_backend_and_version():
  """A plain SPDX `license` string needs setuptools 77 (PEP 639); the LICENSE file is the
  license named; the installed distribution's version is the one the package reports."""
  backend = PYPROJECT["build-system"]["requires"][0]
  if isinstance(PROJECT["license"], str):
    assert version_tuple(backend) >= (77,), backend
  assert PROJECT["license"] == "Apache-2.0"
  assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
  assert PROJECT["license-files"] == ["LICENSE"]
  import research
  assert importlib.metadata.version(PROJECT["name"]) == research.__version__
