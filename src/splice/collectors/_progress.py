"""The optional progress bar (tqdm, from the ``progress`` extra), imported lazily."""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import numpy as np

__all__ = ["ProgressBar", "make_bar", "require_tqdm"]

#: Seconds between two refreshes of a bar written to a terminal, and to anything else (a log
#: file or a pipe, where every refresh is a new line).
TERMINAL_INTERVAL, LOG_INTERVAL = 0.5, 20.0


def require_tqdm() -> Any:
    """The ``tqdm`` class, or an ImportError that says how to install it."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError(
            "progress=True needs tqdm, which is not installed: pip install 'splice-rl[progress]' "
            "(or pip install tqdm)"
        ) from None
    return tqdm


def make_bar(total: int | None, **kwargs: Any) -> Any:
    """A tqdm bar counting frames: live on a terminal, a line every 20 s on anything else.

    ``kwargs`` go to ``tqdm`` (``file`` defaults to ``sys.stderr``).

    Examples:
        >>> import io
        >>> make_bar(100, file=io.StringIO()).mininterval
        20.0
    """
    tqdm = require_tqdm()
    file = kwargs.setdefault("file", sys.stderr)
    terminal = bool(getattr(file, "isatty", lambda: False)())
    kwargs.setdefault("mininterval", TERMINAL_INTERVAL if terminal else LOG_INTERVAL)
    return tqdm(total=total, unit="frames", unit_scale=True, dynamic_ncols=True, **kwargs)


class ProgressBar:
    """Frames (with frames/s), episodes done and the mean return of the last 100 episodes.

    Args:
        total: the frame budget (``None`` for an endless run).
        **kwargs: passed to ``tqdm`` (e.g. ``file=``, ``disable=``).

    Examples:
        >>> import io, numpy as np
        >>> bar = ProgressBar(total=100, file=io.StringIO())
        >>> bar.update(50, np.array([10.0, 20.0]))
        >>> bar.episodes, bar.mean_return
        (2, 15.0)
        >>> bar.close()
    """

    def __init__(self, total: int | None, **kwargs: Any) -> None:
        self.bar = make_bar(total, **kwargs)
        self.episodes = 0
        self._recent: deque[float] = deque(maxlen=100)

    @property
    def mean_return(self) -> float:
        """Mean return of the last (up to) 100 finished episodes; NaN before the first."""
        return float(np.mean(self._recent)) if self._recent else float("nan")

    def update(self, frames: int, returns: np.ndarray) -> None:
        """Count ``frames`` more frames and the episodes that ended with ``returns``."""
        self.episodes += int(returns.size)
        self._recent.extend(float(r) for r in returns)
        self.bar.set_postfix(
            episodes=self.episodes, mean_return=f"{self.mean_return:.4g}", refresh=False
        )
        self.bar.update(frames)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
