"""Collector-like test data with a counting payload, and slice checkers.

Every step carries ``observation[..., 0] = g``, its unique global step number, plus
``"episode"`` (its episode) and ``"t"`` (its step within the episode), so that any reordering,
mixing, padding or stale data shows up in a sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict

from splice.layout import CUT, DONE, IS_INIT, MASK, TERMINATED, TRAJ_IDS, TRUNCATED


@dataclass
class Stream:
    """``n_env`` envs running episodes back to back; :meth:`chunk` yields ``[B, T]`` batches.

    Episode ids are unique across envs and continue across chunks (a cut episode keeps its
    id), as a splice collector numbers them.
    """

    n_env: int
    mean_len: float
    seed: int = 0
    set_truncated: bool = False
    rng: np.random.Generator = field(init=False)
    g: int = 0
    next_id: int = 0
    ep: np.ndarray = field(init=False)
    t: np.ndarray = field(init=False)
    left: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.ep = np.arange(self.n_env)
        self.next_id = self.n_env
        self.t = np.zeros(self.n_env, dtype=np.int64)
        self.left = self._lengths(self.n_env)

    def _lengths(self, k: int) -> np.ndarray:
        return self.rng.geometric(1.0 / max(self.mean_len, 1.0), size=k).astype(np.int64)

    def chunk(self, T: int) -> TensorDict:
        B = self.n_env
        ids = np.zeros((B, T), dtype=np.int64)
        ts = np.zeros((B, T), dtype=np.int64)
        done = np.zeros((B, T), dtype=bool)
        for t in range(T):
            ids[:, t] = self.ep
            ts[:, t] = self.t
            self.left -= 1
            self.t += 1
            ended = self.left == 0
            done[:, t] = ended
            k = int(ended.sum())
            if k:
                self.ep[ended] = self.next_id + np.arange(k)
                self.next_id += k
                self.t[ended] = 0
                self.left[ended] = self._lengths(k)
        g = self.g + np.arange(B * T).reshape(B, T)
        self.g += B * T
        trunc = done & (self.rng.random((B, T)) < 0.3)
        cut = np.zeros((B, T), dtype=bool)
        cut[:, -1] = ~done[:, -1]
        mark = cut if self.set_truncated else np.zeros_like(cut)
        obs = torch.zeros(B, T, 3)
        obs[..., 0] = torch.from_numpy(g).float()
        flag = lambda a: torch.from_numpy(a).unsqueeze(-1)  # noqa: E731
        return TensorDict(
            {
                "observation": obs,
                "g": torch.from_numpy(g),
                "episode": torch.from_numpy(ids),
                "t": torch.from_numpy(ts),
                IS_INIT: flag(ts == 0),
                ("next", "observation"): obs + 0.5,
                ("next", "reward"): torch.ones(B, T, 1),
                DONE: flag(done | mark),
                TERMINATED: flag(done & ~trunc),
                TRUNCATED: flag(trunc | mark),
                TRAJ_IDS: torch.from_numpy(ids.copy()),
                CUT: torch.from_numpy(cut),
            },
            batch_size=[B, T],
        )


def flat(td: TensorDict) -> TensorDict:
    return td.reshape(-1)


def padded(td: TensorDict) -> TensorDict:
    """``[B, T]`` -> padded ``[n_fragments, max_len]`` + mask (one episode fragment per row)."""
    from splice import split_trajectories

    return split_trajectories(td)


def check_slices(
    rows: torch.Tensor,
    g: torch.Tensor,
    episode: torch.Tensor,
    t: torch.Tensor,
    valid: torch.Tensor,
    *,
    live: set[int] | None = None,
) -> None:
    """Every slice (row of ``[S, W]``) is contiguous in one episode, with no padding inside.

    ``valid`` marks real steps; they must form a prefix of each row. ``live``: the global
    steps that are still stored (nothing overwritten may appear).
    """
    for i in range(rows.shape[0]):
        v = valid[i]
        n = int(v.sum())
        assert bool(v[:n].all()) and not bool(v[n:].any()), "padding inside a slice"
        assert n >= 1
        ep = episode[i, :n]
        assert bool((ep == ep[0]).all()), f"slice {i} mixes episodes {ep.tolist()}"
        steps = t[i, :n]
        assert bool((steps[1:] - steps[:-1] == 1).all()), f"slice {i} not contiguous {steps}"
        if live is not None:
            gs = set(g[i, :n].tolist())
            assert gs <= live, f"slice {i} holds overwritten steps {sorted(gs - live)[:5]}"


def valid_of(sample: TensorDict) -> torch.Tensor:
    mask = sample.get(MASK, None)
    return mask if mask is not None else torch.ones(sample.batch_size, dtype=torch.bool)
