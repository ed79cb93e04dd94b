"""TorchRL's C++ extension (its segment trees), rebuilt when the wheel's does not load.

TorchRL's ``PrioritizedSampler`` needs ``torchrl._torchrl``. The 0.14.1 wheel's build does
not load with torch 2.13 (``undefined symbol: torch::autograd::_wrap_outputs``), which
disables TorchRL's prioritized samplers. To compare with them anyway, the extension can be
rebuilt from TorchRL's own sources for the installed torch (TorchRL's code, unchanged):

* ``TORCHRL_EXT=/path/to/_torchrl*.so`` — an extension built before;
* ``TORCHRL_SRC=/path/to/pytorch-rl`` — a checkout of pytorch/rl (0.14 line): its
  ``torchrl/csrc/pybind.cpp`` and ``utils.cpp`` are compiled with
  ``torch.utils.cpp_extension`` (CPU only, a few minutes) into ``~/.cache/splice-bench``.

Call :func:`load_torchrl_extension` before anything imports ``torchrl``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["load_torchrl_extension"]


def _load_so(path: Path) -> None:
    spec = importlib.util.spec_from_file_location("torchrl._torchrl", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["torchrl._torchrl"] = module


def load_torchrl_extension(*, build: bool = True) -> str | None:
    """Make ``torchrl._torchrl`` importable; None on success, else why it is unavailable.

    Args:
        build: compile from ``TORCHRL_SRC`` when needed (``--quick`` runs do not).
    """
    try:
        import torchrl._torchrl  # noqa: F401

        return None
    except ImportError as err:
        wheel_error = str(err).split(":")[-1].strip()[:80]
    ext = os.environ.get("TORCHRL_EXT")
    if ext:
        _load_so(Path(ext))
        return None
    src = os.environ.get("TORCHRL_SRC")
    cache = Path.home() / ".cache" / "splice-bench" / "torchrl_ext"
    built = sorted(cache.glob("_torchrl*.so"))
    if built:
        _load_so(built[-1])
        return None
    if not src or not build:
        return (
            f"TorchRL's C++ extension does not load ({wheel_error}); set TORCHRL_SRC to a "
            "pytorch/rl checkout (or TORCHRL_EXT to a built extension) to rebuild it"
        )
    from torch.utils.cpp_extension import load

    csrc = Path(src) / "torchrl" / "csrc"
    cache.mkdir(parents=True, exist_ok=True)
    module = load(
        name="_torchrl",
        sources=[str(csrc / "pybind.cpp"), str(csrc / "utils.cpp")],
        build_directory=str(cache),
        extra_cflags=["-O3"],
    )
    sys.modules["torchrl._torchrl"] = module
    return None
