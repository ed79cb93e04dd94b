"""Build the sdist and the wheel, install the wheel into a fresh virtual environment with only
its runtime dependencies (plus a CPU torch), and run the README's quick start there.

What a user gets from ``pip install splice-rl``, checked on every CI run (``make test``):

1. ``python -m build`` makes the sdist, then the wheel from the sdist (so the sdist is
   complete); both carry the license, the wheel ``py.typed`` and the ``splice`` command.
2. A fresh virtual environment gets torch first (``SPLICE_CI_TORCH``, default
   ``torch==2.13.0``: the CPU wheel on this machine's disk), then the wheel, resolved from the
   ranges in ``pyproject.toml`` with torch held where it is (an unconstrained resolve could
   replace it by a CUDA build). No package of an extra may be installed.
3. Outside the repository, with no ``PYTHONPATH``: ``import splice`` from the environment,
   ``splice --version`` equal to the distribution's version, the README's quick start as
   written, and ``splice train`` refusing with the install line of the ``train`` extra.

pip's cache is reused (after the first run nothing is downloaded), pip does not compile the
installed files (the first import compiles what it imports), and the environment lives in
``/dev/shm`` when there is room, so the check costs the build, unpacking torch and three
interpreter starts. Usage: ``python .ci/check_wheel.py [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
TORCH = os.environ.get("SPLICE_CI_TORCH", "torch==2.13.0")


def readme_quickstart(readme: str) -> str:
    """The first ``python`` block under the README's ``## Quick start`` heading."""
    section = readme.split("## Quick start", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under '## Quick start' in README.md"
    return match.group(1)


def extras_only_packages(pyproject: dict) -> set[str]:
    """Names required by some extra and not by the runtime dependencies (the build tools
    left out: torch itself requires setuptools)."""
    project = pyproject["project"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {
        canonicalize_name(Requirement(r).name)
        for reqs in project["optional-dependencies"].values()
        for r in reqs
    }
    return extras - runtime - {"setuptools", "build"}


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run(cmd, text=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0 and kwargs.get("check", True) is not False:
        sys.exit(f"failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def build(out: Path, dist_name: str, version: str) -> Path:
    egg_info = ROOT / "src" / f"{canonicalize_name(dist_name).replace('-', '_')}.egg-info"
    left_before = egg_info.exists()
    try:
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)])
    finally:
        if not left_before:  # the sdist step writes it into the source tree
            shutil.rmtree(egg_info, ignore_errors=True)
    stem = f"{canonicalize_name(dist_name).replace('-', '_')}-{version}"
    sdist, wheel = out / f"{stem}.tar.gz", out / f"{stem}-py3-none-any.whl"
    assert sdist.is_file() and wheel.is_file(), sorted(p.name for p in out.iterdir())
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for name in ["LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "src/splice/py.typed"]:
        assert name in in_sdist, f"{name} missing from the sdist"
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
        metadata = whl.read(f"{stem}.dist-info/METADATA").decode()
        entry_points = whl.read(f"{stem}.dist-info/entry_points.txt").decode()
    for name in ["splice/__init__.py", "splice/py.typed", f"{stem}.dist-info/licenses/LICENSE"]:
        assert name in in_wheel, f"{name} missing from the wheel"
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in in_wheel)
    assert "splice = splice.cli:main" in entry_points
    assert f"Name: {dist_name}\n" in metadata and "License-Expression: BSD-3-Clause" in metadata
    pinned = [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line and "==" in line
    ]
    assert not pinned, f"runtime dependencies must be ranges, not pins: {pinned}"
    return wheel


def install(venv: Path, wheel: Path, work: Path) -> None:
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    run([*pip, "--quiet", "--no-compile", TORCH])
    hold = work / "hold-torch.txt"
    hold.write_text(TORCH + "\n")
    run([*pip, "--quiet", "--no-compile", "-c", str(hold), str(wheel)])


def check_installed(venv: Path, work: Path, dist_name: str, version: str) -> None:
    python, env = str(venv / "bin" / "python"), clean_env()
    listed = run([sys.executable, "-m", "pip", "--python", python, "list", "--format=json"])
    names = {canonicalize_name(p["name"]) for p in json.loads(listed.stdout)}
    extras = extras_only_packages(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert not names & extras, f"packages of extras installed: {sorted(names & extras)}"
    probe = (  # one interpreter start (torch's import is most of the time): version, origin,
        # and `splice train` refused with the install line of the train extra
        "import contextlib, io, importlib.metadata as m, splice, splice.cli\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):\n"
        "    splice.cli.main(['train', '--frames', '64', '--output', 'out'])\n"
        f"print(splice.__version__, m.version({dist_name!r}), splice.__file__)\n"
        "print(err.getvalue())\n"
    )
    lines = run([python, "-c", probe], cwd=work, env=env).stdout.splitlines()
    got, dist_version, where = lines[0].split()
    assert got == dist_version == version, (got, dist_version, version)
    assert Path(where).resolve().is_relative_to(venv.resolve()), f"splice imported from {where}"
    refusal = "\n".join(lines[1:])
    assert "pip install 'splice-rl[train]'" in refusal, refusal
    assert not (work / "out").exists()
    shown = run([str(venv / "bin" / "splice"), "--version"], cwd=work, env=env).stdout
    assert shown == f"splice {version}\n", shown
    script = work / "quickstart.py"
    script.write_text(readme_quickstart((ROOT / "README.md").read_text()))
    out = run([python, str(script)], cwd=work, env=env, timeout=300).stdout
    print(out, end="")


def clean_env() -> dict[str, str]:
    """The caller's environment without what would import another splice, and with bytecode
    written: pip installs with ``--no-compile``, so the first import compiles only the modules
    it imports (about a third of the time of compiling all of torch at install)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(MPLBACKEND="Agg")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temp dir)")
    args = parser.parse_args()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dist_name = pyproject["project"]["name"]
    init = (ROOT / "src" / "splice" / "__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', init, re.M).group(1)  # type: ignore[union-attr]
    # in memory where there is room: the environment is ~0.9 GB of small files, which a
    # disk-backed /tmp on this machine takes a minute to delete
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and shutil.disk_usage(shm).free > 4e9
    temp = tempfile.mkdtemp(prefix="splice-wheel-", dir=shm if in_memory else None)
    work = args.keep or Path(temp)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    times: dict[str, float] = {}

    def timed(name: str, step: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        out = step()
        times[name] = time.perf_counter() - t0
        return out

    try:
        wheel = timed("build sdist + wheel", lambda: build(work / "dist", dist_name, version))
        assert isinstance(wheel, Path)
        timed("fresh venv: torch, then the wheel", lambda: install(work / "venv", wheel, work))
        timed(
            "import, --version, quick start",
            lambda: check_installed(work / "venv", work, dist_name, version),
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    summary = ", ".join(f"{name} {t:.0f} s" for name, t in times.items())
    total = time.perf_counter() - started
    print(f"wheel check passed: {dist_name} {version} ({summary}; total {total:.0f} s)")


if __name__ == "__main__":
    main()
