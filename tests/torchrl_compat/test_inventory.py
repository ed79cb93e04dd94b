"""The ported suite is complete and its counts are the ones the docs quote.

Every TorchRL test function is ported or listed as TorchRL-only, every documented difference
a case is marked with is one of :mod:`tests.torchrl_compat.differences` and is listed word for
word on the "Coming from TorchRL" page, and the page quotes the current counts (the README,
a short pitch, links to the page and quotes no counts that could go stale).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.torchrl_compat import differences
from tests.torchrl_compat.inventory import HERE, SESSION_CASES, Counts, collect_ported, count

ROOT = HERE.parent.parent
PAGE = ROOT / "docs" / "coming_from_torchrl.rst"
README = ROOT / "README.md"

#: The sentence the page quotes the counts in (markup and wrapping aside).
COUNTS = re.compile(
    r"Of the ([\d,]+) cases of TorchRL's own tests of these APIs, ([\d,]+) pass with the "
    r"imports changed, ([\d,]+) exercise a documented difference \(([\d,]+) adapted to "
    r"splice's way and passing, ([\d,]+) unchanged and expected to fail\), and ([\d,]+) test "
    r"TorchRL-only features"
)


def _whole_suite(config: pytest.Config) -> bool:
    """Whether this session collected every ported file, unfiltered."""
    cases = config.stash.get(SESSION_CASES, None)
    if not cases or config.option.keyword or config.option.markexpr:
        return False
    if any("::" in str(arg) for arg in config.args):
        return False
    files = {str(case["function"]).split("::", 1)[0] for case in cases}
    return files == {p.relative_to(HERE).as_posix() for p in HERE.rglob("test_*.py")} - {
        "test_inventory.py"
    }


@pytest.fixture(scope="module")
def counts(request: pytest.FixtureRequest) -> Counts:
    config = request.config
    # A whole-suite run already classified its cases; otherwise collect them once.
    items = config.stash[SESSION_CASES] if _whole_suite(config) else collect_ported()
    return count(items)


def _text(path: Path) -> str:
    """The file's text with markup dropped and whitespace collapsed."""
    text = path.read_text().replace("**", "").replace("``", "")
    return re.sub(r"\s+", " ", text)


def _reasons() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(differences).items()
        if name.isupper() and isinstance(value, str)
    }


def test_every_torchrl_test_is_ported_or_listed(counts: Counts) -> None:
    assert not counts.problems, "\n".join(counts.problems)
    assert counts.passing + counts.differences + counts.torchrl_only == counts.total


def test_cases_are_marked_with_the_listed_reasons_only(counts: Counts) -> None:
    listed = set(_reasons().values())
    assert set(counts.by_reason) <= listed, set(counts.by_reason) - listed


def test_every_reason_is_on_the_coming_from_torchrl_page() -> None:
    page = _text(PAGE)
    missing = [name for name, reason in _reasons().items() if reason not in page]
    assert not missing, f"reasons not on {PAGE.name}: {missing}"


@pytest.mark.parametrize("path", [PAGE], ids=lambda p: p.name)
def test_the_docs_quote_the_current_counts(counts: Counts, path: Path) -> None:
    match = COUNTS.search(_text(path))
    assert match, f"{path.name} does not quote the counts"
    quoted = [int(x.replace(",", "")) for x in match.groups()]
    actual = [
        counts.total,
        counts.passing,
        counts.differences,
        counts.adapted,
        counts.failing,
        counts.torchrl_only,
    ]
    assert quoted == actual, f"{path.name} quotes {quoted}, the suite counts {actual}"


def test_the_readme_points_to_the_counts_without_quoting_them() -> None:
    readme = _text(README)
    assert COUNTS.search(readme) is None  # no second copy to keep in step
    assert "docs/coming_from_torchrl.rst" in README.read_text()
