"""The arguments every collector shares, checked in one place.

:class:`CollectorSettings` validates (and normalizes) the arguments of
:class:`~splice.Collector` that shape the data and the run; the multi-process and Ray
collectors take the same arguments and check them with the same code. Each error names the
argument.

Examples:
    >>> settings = CollectorSettings.check(frames_per_batch=100, total_frames=None)
    >>> settings.total_frames, settings.traj_format
    (-1, 'padded')
    >>> CollectorSettings.check(frames_per_batch=0)
    Traceback (most recent call last):
    ...
    ValueError: frames_per_batch must be a positive int, got 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CollectorSettings", "positive_int"]

TrajFormat = Literal["padded", "cat"]


def positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int ``>= 1`` (not a bool), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class CollectorSettings:
    """The checked run and data arguments of a collector (see :class:`~splice.Collector`);
    build it with :meth:`check`."""

    frames_per_batch: int
    total_frames: int  # -1: no limit
    max_frames_per_traj: int | None
    init_random_frames: int
    reset_at_each_iter: bool
    split_trajs: bool
    set_truncated: bool
    trajs_per_batch: int | None
    traj_format: TrajFormat
    drop_incomplete: bool

    @classmethod
    def check(
        cls,
        *,
        frames_per_batch: int,
        total_frames: int | None = -1,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        set_truncated: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: TrajFormat | None = None,
        drop_incomplete: bool = False,
        replay_buffer: Any = None,
        policy: Any = None,
    ) -> CollectorSettings:
        """Check the arguments (``replay_buffer`` and ``policy`` too, which are not kept) and
        normalize them: ``total_frames=None`` becomes ``-1`` (no limit),
        ``init_random_frames=None`` becomes 0 and ``traj_format=None`` becomes ``"padded"``.

        Raises:
            ValueError: a bad value, or arguments that cannot be combined (the message names
                them).
            TypeError: a ``replay_buffer`` without ``extend``, or a ``policy`` that is not
                callable.
        """
        positive_int("frames_per_batch", frames_per_batch)
        total = -1 if total_frames is None else total_frames
        if isinstance(total, bool) or not isinstance(total, int) or (total < 1 and total != -1):
            raise ValueError(
                f"total_frames must be a positive int, or -1/None for no limit; got {total!r}"
            )
        if max_frames_per_traj is not None:
            positive_int("max_frames_per_traj", max_frames_per_traj)
        random_frames = 0 if init_random_frames is None else init_random_frames
        if (
            isinstance(random_frames, bool)
            or not isinstance(random_frames, int)
            or random_frames < 0
        ):
            raise ValueError(
                f"init_random_frames must be a non-negative int or None, got {init_random_frames!r}"
            )
        if trajs_per_batch is not None:
            positive_int("trajs_per_batch", trajs_per_batch)
            if split_trajs:
                raise ValueError(
                    "split_trajs and trajs_per_batch are exclusive: trajs_per_batch already "
                    "yields one episode per row"
                )
            if reset_at_each_iter:
                raise ValueError(
                    "reset_at_each_iter cannot be combined with trajs_per_batch: episodes longer "
                    "than one batch would never complete (only short episodes would be emitted)"
                )
        if traj_format is not None:
            if trajs_per_batch is None:
                raise ValueError(
                    "traj_format only applies with trajs_per_batch; set trajs_per_batch=N"
                )
            if traj_format not in ("padded", "cat"):
                raise ValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}")
        if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
            raise TypeError(
                "replay_buffer must have an extend(batch) method; "
                f"got {type(replay_buffer).__name__}"
            )
        if policy is not None and not callable(policy):
            raise TypeError(
                f"policy must be a callable td -> td or None, got {type(policy).__name__}"
            )
        return cls(
            frames_per_batch=frames_per_batch,
            total_frames=total,
            max_frames_per_traj=max_frames_per_traj,
            init_random_frames=random_frames,
            reset_at_each_iter=reset_at_each_iter,
            split_trajs=split_trajs,
            set_truncated=set_truncated,
            trajs_per_batch=trajs_per_batch,
            traj_format=traj_format or "padded",
            drop_incomplete=drop_incomplete,
        )
