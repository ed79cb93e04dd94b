"""The package's metadata agrees with itself: one name, one version, the license, the Python
versions CI runs, and install lines that name the real distribution and existing extras.

The wheel itself is built, installed into a fresh environment and run by
``.ci/check_wheel.py`` (``make test`` runs it after the test suite).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import splice

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
#: The Python versions CI runs (.ci/run runs `make test` with the interpreter of .venv).
CI_PYTHONS = ["3.11"]


def _user_texts() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst"))]
    paths += sorted((ROOT / "tutorials").glob("*.py")) + sorted((ROOT / "src").rglob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def test_install_lines_name_the_distribution_and_an_existing_extra() -> None:
    lines = {
        (where, match.group(0))
        for where, text in _user_texts().items()
        for match in re.finditer(r"pip install '?([\w.-]+)(\[[\w,-]+\])?'?", text)
        if match.group(1).startswith("splice")
    }
    assert any("splice-rl[" in line for _, line in lines)  # the scan finds the hints
    extras = set(PROJECT["optional-dependencies"])
    for where, line in lines:
        name, wanted = re.match(r"pip install '?([\w.-]+)(?:\[([\w,-]+)\])?", line).groups()  # type: ignore[union-attr]
        assert name == PROJECT["name"] == "splice-rl", f"{where}: {line!r}"
        assert set((wanted or "").split(",")) - {""} <= extras, f"{where}: {line!r}"


def test_one_version_source() -> None:
    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "splice.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d[^\]]*)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    assert released and released[0] == splice.__version__  # the newest entry is this version
    assert "## [Unreleased]" in changelog and "Keep a Changelog" in changelog


def test_license_file_matches_the_metadata() -> None:
    assert PROJECT["license"] == "BSD-3-Clause" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License\n")
    assert "Neither the name of the copyright holder" in text


def test_python_versions_are_the_ones_ci_runs() -> None:
    classifiers = PROJECT["classifiers"]
    listed = [c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert listed == CI_PYTHONS
    assert PROJECT["requires-python"] == f">={CI_PYTHONS[0]}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + CI_PYTHONS[0].replace(".", "")
    assert PYPROJECT["tool"]["mypy"]["python_version"] == CI_PYTHONS[0]
    readme = (ROOT / "README.md").read_text()
    assert f"Python {CI_PYTHONS[0]}" in readme and "3.10" not in readme


def test_runtime_dependencies_are_ranges() -> None:
    for requirement in PROJECT["dependencies"]:
        assert "==" not in requirement and ">=" in requirement, requirement
    names = {re.match(r"[\w-]+", r).group(0) for r in PROJECT["dependencies"]}  # type: ignore[union-attr]
    assert {"torch", "tensordict", "gymnasium", "numpy"} <= names


def test_readme_starts_with_the_install_line() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|console)?\n(.*?)```", readme, re.S)
    assert first_block and first_block.group(1).strip() == "pip install splice-rl"
    before = readme[: first_block.start()]
    assert "```" not in before and len(before.splitlines()) <= 8  # the title, a line or two
