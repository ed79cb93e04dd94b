"""TorchRL's own tests, ported to splice: the markers that classify each case.

* unmarked — ported by changing imports (and swapping TorchRL envs for the same gymnasium
  envs); must pass;
* ``torchrl_difference(reason)`` — the case exercises a documented difference (listed on the
  "Coming from TorchRL" page): the unchanged test is expected to fail, strictly
  (``xfail(strict=True)``, so a case that starts passing is noticed);
* ``torchrl_difference(reason, adapted=True)`` — the same, but the test was adapted to
  splice's way (the adaptation is in the test) and must pass.

Which TorchRL tests were not ported (TorchRL-only features) and why is listed in
:mod:`tests.torchrl_compat.inventory`, which also counts the cases.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.torchrl_compat.inventory import SESSION_CASES

HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "torchrl_difference(reason, adapted=False): a TorchRL test case that exercises a "
        "documented difference (xfail(strict=True) unless adapted)",
    )


def difference_reasons(item: pytest.Item) -> tuple[list[str], list[str]]:
    """``(reasons the unchanged test fails for, reasons it was adapted for)``."""
    failing, adapted = [], []
    for marker in item.iter_markers("torchrl_difference"):
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: torchrl_difference needs a reason")
        (adapted if marker.kwargs.get("adapted", False) else failing).append(reason)
    return failing, adapted


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    inventory = []
    for item in items:
        if HERE not in item.path.parents or item.path.name == "test_inventory.py":
            continue
        failing, adapted = difference_reasons(item)
        if failing:
            item.add_marker(pytest.mark.xfail(strict=True, reason="; ".join(failing)))
        function = item.path.relative_to(HERE).as_posix() + "::" + item.nodeid.split("::", 1)[1]
        inventory.append(
            {"function": function.split("[", 1)[0], "failing": failing, "adapted": adapted}
        )
    config.stash[SESSION_CASES] = inventory  # test_inventory.py reads a whole-suite run's
    target = os.environ.get("SPLICE_COMPAT_INVENTORY")
    if target:  # inventory.py asks for the classification of every case
        Path(target).write_text(json.dumps(inventory))
