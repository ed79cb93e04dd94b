"""Where trajectories begin and end: one int64 *trajectory key* per stored row.

Three modes, chosen once, from the first batch a buffer receives:

* ``"ids"`` — the batch carries trajectory ids: the sampler's ``traj_key``, else
  ``("collector", "traj_ids")``, else TorchRL's ``"episode"``. The id is the key.
  Trajectories continue across extends, envs and writers under their id, so interleaved
  writers need nothing special. A ``traj_key`` absent from the data falls back to the end
  flags, as in TorchRL.
* ``"flags"`` — no ids, but end-of-trajectory flags (the sampler's ``end_key``, default
  ``("next", "done")``): a new trajectory starts after every flagged step that is not a
  collector cut (``("collector", "cut")``), and keys are synthesised. The last trajectory of
  env row ``b`` continues in env row ``b`` of the next batch (same number of env rows), as a
  collector's next chunk does. Padded and flat batches never continue: a flat batch without
  ids may be one env's stream or several envs' chunks flattened, which flags cannot tell
  apart (pass ids, as splice's collectors do, or ``[B, T]`` batches).
* ``"stream"`` — neither (only allowed for samplers that ignore trajectories): every env row
  is one endless stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDictBase

from splice.layout import CUT, DONE, TRAJ_IDS, Key, LayoutError, as_key_tuple, fmt_key
from splice.replay._batch import FlatBatch
from splice.replay._state import as_int
from splice.replay._structures import I64

__all__ = ["Boundaries", "resolve_boundaries"]

#: TorchRL's episode counter key, detected after ``("collector", "traj_ids")``.
EPISODE = ("episode",)
_MODES = ("ids", "flags", "stream")


@dataclass
class Boundaries:
    """The boundary mode of a buffer and, for ``"flags"``, the in-flight state between batches.

    Attributes:
        mode: ``"ids"``, ``"flags"`` or ``"stream"``.
        key: the ids key (``"ids"``) or the end-flag key (``"flags"``).
        open_keys: per env row, the synthetic key of the trajectory still running at the end
            of the previous batch (-1: none).
        next_key: the next synthetic key to hand out.
    """

    mode: str
    key: Key | None
    open_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=I64))
    next_key: int = 0
    _doc: tuple[np.ndarray, int, dict[str, object]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def keys_for(self, batch: FlatBatch) -> tuple[np.ndarray, np.ndarray, int]:
        """The key of every row of ``batch``, and the state to commit once it is written.

        Pure: returns ``(keys, open_keys, next_key)`` without changing ``self``.
        """
        if self.mode == "ids":
            assert batch.ids is not None
            return batch.ids, self.open_keys, self.next_key
        n = batch.n
        ends, cut = _end_flags(batch, self.key, n)
        if batch.padded:
            assert batch.row_lengths is not None
            lengths = batch.row_lengths
            starts = np.zeros(n, dtype=bool)
            row_first = np.cumsum(lengths) - lengths
            starts[row_first[lengths > 0]] = True
            starts[1:] |= ends[:-1]
            keys = self.next_key + np.cumsum(starts) - 1
            return keys.astype(I64), np.empty(0, dtype=I64), self.next_key + int(starts.sum())
        n_env = batch.n_envs
        T = n // n_env
        ends2 = ends.reshape(n_env, T)
        cut2 = cut.reshape(n_env, T)
        # A flat batch has no env rows: it may be one env's stream or several envs' chunks
        # flattened ([done, done, cut] is either), so which fragment the next batch continues
        # is unknown and nothing continues across its edges; a collector cut before its last
        # step (several chunks for sure) also closes its fragment.
        flattened = batch.flat or bool(cut2[:, :-1].any())
        if flattened:
            ends2 = ends2 | cut2
        starts = np.zeros((n_env, T), dtype=bool)
        starts[:, 0] = True
        starts[:, 1:] = ends2[:, :-1]
        local = np.cumsum(starts.reshape(-1)) - 1  # local trajectory number, env-major
        n_local = int(local[-1]) + 1 if n else 0
        key_of = np.full(n_local, -1, dtype=I64)
        if self.open_keys.size == n_env and T > 0 and not flattened:
            cont = self.open_keys >= 0
            key_of[local.reshape(n_env, T)[cont, 0]] = self.open_keys[cont]
        fresh = key_of < 0
        key_of[fresh] = self.next_key + np.arange(int(fresh.sum()), dtype=I64)
        keys = key_of[local]
        if flattened:
            open_keys = np.full(n_env, -1, dtype=I64)
        elif T > 0:
            open_keys = np.where(ends2[:, -1], -1, keys.reshape(n_env, T)[:, -1]).astype(I64)
        else:
            open_keys = self.open_keys
        return keys, open_keys, self.next_key + int(fresh.sum())

    def commit(self, open_keys: np.ndarray, next_key: int) -> None:
        self.open_keys = open_keys
        self.next_key = next_key

    def reset(self) -> None:
        self.open_keys = np.empty(0, dtype=I64)
        self.next_key = 0

    def json_with(self, open_keys: np.ndarray, next_key: int) -> dict[str, object]:
        """:meth:`to_json` of this mode and key with the in-flight state ``open_keys``,
        ``next_key`` (what :meth:`keys_for` returned). The last document is reused when
        they are the same (always in ``"ids"`` mode): do not modify it."""
        doc = self._doc
        if doc is None or doc[0] is not open_keys or doc[1] != next_key:
            doc = (
                open_keys,
                next_key,
                Boundaries(self.mode, self.key, open_keys, next_key).to_json(),
            )
            self._doc = doc
        return doc[2]

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "key": None if self.key is None else list(self.key),
            "open_keys": self.open_keys.tolist(),
            "next_key": self.next_key,
        }

    @property
    def ids_key(self) -> Key | None:
        """The key of the ids when trajectories come from ids."""
        return self.key if self.mode == "ids" else None

    @staticmethod
    def from_json(state: object) -> Boundaries:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: not a document written by :meth:`to_json`.
        """
        if not isinstance(state, dict):
            raise ValueError(f"boundaries: expected an object, got {type(state).__name__}")
        mode, key, open_keys = state.get("mode"), state.get("key"), state.get("open_keys")
        if mode not in _MODES:
            raise ValueError(f"boundaries: unknown mode {mode!r}")
        if key is not None and not (
            isinstance(key, list) and key and all(isinstance(part, str) for part in key)
        ):
            raise ValueError(f"boundaries: bad key {key!r}")
        if (mode == "stream") != (key is None):
            raise ValueError(f"boundaries: mode {mode!r} with key {key!r}")
        if not isinstance(open_keys, list) or not all(
            not isinstance(k, bool) and isinstance(k, int) and -1 <= k < 1 << 62 for k in open_keys
        ):
            raise ValueError(
                f"boundaries: open_keys must be a list of ints >= -1, got {open_keys!r}"
            )
        next_key = as_int(state.get("next_key"), "boundaries: next_key")
        if not 0 <= next_key < 1 << 62:
            raise ValueError(f"boundaries: next_key {next_key} out of range")
        return Boundaries(
            mode=str(mode),
            key=None if key is None else tuple(key),
            open_keys=np.asarray(open_keys, dtype=I64),
            next_key=next_key,
        )


def _end_flags(batch: FlatBatch, key: Key | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ends, cuts)``: a collector cut is not an episode end, even when TorchRL's
    ``set_truncated`` flagged it done."""
    cut = batch.flags_array(CUT)
    cuts = np.zeros(n, dtype=bool) if cut is None else cut.reshape(n)
    if key is None:
        return np.zeros(n, dtype=bool), cuts
    flags = batch.flags_array(key)
    assert flags is not None
    return flags.reshape(n, -1).any(1) & ~cuts, cuts


def resolve_boundaries(
    td: TensorDictBase,
    *,
    traj_key: Key | None,
    end_key: Key | None,
    needs_trajectories: bool,
) -> Boundaries:
    """Choose the boundary mode from the first batch (see module docs).

    Raises:
        LayoutError: the sampler needs trajectories and the batch has neither ids nor end
            flags, or the end flag is not bool.
    """
    for key in (traj_key, TRAJ_IDS, EPISODE):
        if key is not None and td.get(key, None) is not None:
            return Boundaries("ids", as_key_tuple(key))
    flag = end_key if end_key is not None else as_key_tuple(DONE)
    value = td.get(flag, None)
    if value is not None:
        if value.dtype != torch.bool:
            raise LayoutError(
                f"end key {fmt_key(flag)}: expected dtype torch.bool, got {value.dtype}"
            )
        return Boundaries("flags", flag)
    if needs_trajectories or end_key is not None or traj_key is not None:
        where = f"{fmt_key(traj_key)}, " if traj_key is not None else ""
        raise LayoutError(
            f"cannot find trajectory boundaries: the batch has no trajectory ids at {where}"
            f"{fmt_key(TRAJ_IDS)} or {fmt_key(EPISODE)} and no end flags at {fmt_key(flag)} "
            "(pass traj_key= or end_key= to the sampler)"
        )
    return Boundaries("stream", None)
