"""Seeds drawn from torch's global RNG: what an object built without an explicit seed uses.

PyTorch's convention (``torch.utils.data`` samplers, ``nn.init``) is that an object without a
seed follows torch's global RNG, so ``torch.manual_seed(0)`` at the top of a script reproduces
a run. splice's own random streams (samplers' generators, the collector's random actions,
worker processes' torch seeds) are seeded from it, once, when they are created.

Examples:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> first = seed_from_torch()
    >>> _ = torch.manual_seed(0)
    >>> seed_from_torch() == first
    True
"""

from __future__ import annotations

import torch

__all__ = ["seed_from_torch"]


def seed_from_torch() -> int:
    """A non-negative 62-bit seed drawn from torch's global RNG (advancing it by one draw)."""
    return int(torch.randint(0, 2**62, ()).item())
