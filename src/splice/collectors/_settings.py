"""The arguments every collector shares, checked in one place.

:class:`CollectorSettings` validates (and normalizes) the arguments of
:class:`~splice.Collector` that shape the data and the run; the multi-process and Ray
collectors take the same arguments and check them with the same code. Each error names the
argument: a ``TypeError`` for a value that is not an integer where a count is meant (a bool
included: ``True`` is not a count), a ``ValueError`` for an integer out of range.

The options of the collection loop itself (what each step and batch of one
:class:`~splice.collectors.RolloutLoop` holds) travel together as one :class:`LoopOptions`
(``settings.loop``): from the check to the loop in this process, or in each worker's spec to
the loop in the worker.

Examples:
    >>> settings = CollectorSettings.check(frames_per_batch=100, total_frames=None)
    >>> settings.total_frames, settings.traj_format
    (-1, 'padded')
    >>> loop = CollectorSettings.check(frames_per_batch=100, progress=True, device="cpu").loop
    >>> loop.track_episodes, loop.device, loop.max_frames_per_traj
    (True, device(type='cpu'), None)
    >>> CollectorSettings.check(frames_per_batch=0)
    Traceback (most recent call last):
    ...
    ValueError: frames_per_batch must be a positive int, got 0
    >>> CollectorSettings.check(frames_per_batch=True)
    Traceback (most recent call last):
    ...
    TypeError: frames_per_batch must be an int, got bool True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.utils import NestedKey

from splice._args import non_negative_int, positive_int, require_int
from splice.envs.infos import InfoKey, InfoKeysLike, parse_info_keys
from splice.layout import OBSERVATION, TRAJ_FORMATS, TrajFormat, as_key_tuple
from splice.policies import as_policy

__all__ = ["CollectorSettings", "LoopOptions", "positive_int", "require_int"]


@dataclass(frozen=True)
class LoopOptions:
    """The options of one collection loop (:class:`~splice.collectors.RolloutLoop`): what
    its steps and batches hold and where its policy runs. :meth:`CollectorSettings.check`
    builds them (as :attr:`CollectorSettings.loop`) from a collector's arguments, which
    document each option; a multi-worker collector sends them to every worker in its spec.

    Args:
        max_frames_per_traj: truncate episodes at this many steps (``truncated=True``, the env
            is reset, a new id starts); needs an env that can reset a subset of its envs.
        set_truncated: also set ``truncated`` and ``done`` on the cut last step of each row
            (TorchRL's ``set_truncated``); ``("collector", "cut")`` stays True there.
        reset_at_each_iter: reset every env before each batch but the first (the episodes in
            flight end with a cut).
        track_episodes: compute the returns and lengths of the episodes that end in each
            batch (:attr:`RolloutLoop.episodes <splice.collectors.RolloutLoop.episodes>`).
        info_keys: the ``info`` entries to store (and show the policy), see
            :mod:`splice.envs.infos`.
        exclude_keys: observation keys (full key tuples) to leave out of the data and the
            policy input.
        device: where the policy runs (``None``: CPU).
        storing_device: where batches are returned (``None``: CPU). The multi-worker
            collectors move their batches there in the caller's process: their workers'
            loops get ``None``.

    Examples:
        >>> LoopOptions(max_frames_per_traj=10).set_truncated
        False
    """

    max_frames_per_traj: int | None = None
    set_truncated: bool = False
    reset_at_each_iter: bool = False
    track_episodes: bool = False
    info_keys: tuple[InfoKey, ...] = ()
    exclude_keys: tuple[tuple[str, ...], ...] = ()
    device: torch.device | None = None
    storing_device: torch.device | None = None


@dataclass(frozen=True)
class CollectorSettings:
    """The checked run and data arguments of a collector (see :class:`~splice.Collector`);
    build it with :meth:`check`."""

    frames_per_batch: int
    total_frames: int  # -1: no limit
    init_random_frames: int
    split_trajs: bool
    trajs_per_batch: int | None
    traj_format: TrajFormat
    drop_incomplete: bool
    progress: bool
    #: The options of the collection loop.
    loop: LoopOptions

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
        info_keys: InfoKeysLike | None = None,
        exclude_keys: Sequence[NestedKey] | None = None,
        seed: int | None = None,
        progress: bool = False,
        track_episodes: bool = False,
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
    ) -> CollectorSettings:
        """Check the arguments (``replay_buffer``, ``policy`` and ``seed`` too, which are not
        kept) and normalize them: ``total_frames=None`` becomes ``-1`` (no limit),
        ``init_random_frames=None`` becomes 0, ``traj_format=None`` becomes ``"padded"``;
        the loop's options (:attr:`loop`) get ``info_keys`` as a tuple of
        :class:`~splice.envs.infos.InfoKey`, ``exclude_keys`` as a tuple of key tuples, the
        devices as ``torch.device`` and ``track_episodes`` set by ``progress`` too.

        Raises:
            ValueError: a bad value, or arguments that cannot be combined (the message names
                them).
            TypeError: a count that is not an int (a bool included), a ``replay_buffer``
                without ``extend``, a ``policy`` that :func:`~splice.policies.as_policy` does
                not accept, or malformed ``info_keys``/``exclude_keys``.
        """
        frames_per_batch = positive_int("frames_per_batch", frames_per_batch)
        total = -1 if total_frames is None else require_int("total_frames", total_frames)
        if total < 1 and total != -1:
            raise ValueError(
                f"total_frames must be a positive int, or -1/None for no limit; got {total!r}"
            )
        if max_frames_per_traj is not None:
            max_frames_per_traj = positive_int("max_frames_per_traj", max_frames_per_traj)
        random_frames = (
            0
            if init_random_frames is None
            else require_int("init_random_frames", init_random_frames)
        )
        if random_frames < 0:
            raise ValueError(
                f"init_random_frames must be a non-negative int or None, got {init_random_frames!r}"
            )
        if seed is not None:
            non_negative_int("seed", seed)
        if trajs_per_batch is not None:
            trajs_per_batch = positive_int("trajs_per_batch", trajs_per_batch)
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
            if traj_format not in TRAJ_FORMATS:
                raise ValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}")
        if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
            raise TypeError(
                "replay_buffer must have an extend(batch) method; "
                f"got {type(replay_buffer).__name__}"
            )
        as_policy(policy)  # raises the TypeError that lists what is accepted
        loop = LoopOptions(
            max_frames_per_traj=max_frames_per_traj,
            set_truncated=set_truncated,
            reset_at_each_iter=reset_at_each_iter,
            track_episodes=progress or track_episodes,
            info_keys=tuple(parse_info_keys(info_keys)),
            exclude_keys=_exclude_keys(exclude_keys),
            device=None if device is None else torch.device(device),
            storing_device=None if storing_device is None else torch.device(storing_device),
        )
        return cls(
            frames_per_batch=frames_per_batch,
            total_frames=total,
            init_random_frames=random_frames,
            split_trajs=split_trajs,
            trajs_per_batch=trajs_per_batch,
            traj_format=traj_format or "padded",
            drop_incomplete=drop_incomplete,
            progress=progress,
            loop=loop,
        )


def _exclude_keys(keys: Sequence[NestedKey] | None) -> tuple[tuple[str, ...], ...]:
    if keys is None:
        return ()
    if isinstance(keys, str | tuple):
        raise TypeError(
            f"exclude_keys must be a list of keys, got {keys!r}; e.g. "
            "exclude_keys=[('observation', 'mission')]"
        )
    out = []
    for key in keys:
        if not isinstance(key, str | tuple):
            raise TypeError(f"exclude_keys entries must be str or tuples of str, got {key!r}")
        full = as_key_tuple(key)
        if full[0] != OBSERVATION:
            raise ValueError(
                f"exclude_keys entry {key!r} is not an observation key: observation keys start "
                f"with {OBSERVATION!r}, e.g. ('observation', 'mission')"
            )
        out.append(full)
    return tuple(out)
