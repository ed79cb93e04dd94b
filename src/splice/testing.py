"""Synthetic collector batches for tests and benchmarks (no environment needed).

:func:`synthetic_rollout` builds a ``[B, T]`` batch that looks exactly like collector output:
episodes of random (geometric) length laid end to end in each env row, the first one already
running when the batch starts and the last one cut at the batch edge, trajectory ids numbered
as a collector numbers them (in order of episode start, env row breaking ties), and a
*counting payload* — ``observation[..., 0]`` is the step's global index ``b * T + t`` — so that
any reordering is visible in the data.

Examples:
    >>> from splice.testing import synthetic_rollout
    >>> batch = synthetic_rollout(n_env=2, n_steps=5, mean_len=3.0, seed=0)
    >>> batch.batch_size
    torch.Size([2, 5])
    >>> batch["observation"][..., 0]
    tensor([[0., 1., 2., 3., 4.],
            [5., 6., 7., 8., 9.]])
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from splice.layout import ACTION, CUT, DONE, IS_INIT, OBSERVATION, TERMINATED, TRAJ_IDS, TRUNCATED

__all__ = ["episode_lengths", "synthetic_rollout"]


def episode_lengths(n_steps: int, mean_len: float, rng: np.random.Generator) -> np.ndarray:
    """Geometric episode lengths (mean ``mean_len``) that exactly tile ``n_steps`` steps."""
    lengths: list[int] = []
    total = 0
    while total < n_steps:
        length = int(rng.geometric(1.0 / max(mean_len, 1.0)))
        length = min(length, n_steps - total)
        lengths.append(length)
        total += length
    return np.asarray(lengths, dtype=np.int64)


def synthetic_rollout(
    n_env: int,
    n_steps: int,
    mean_len: float,
    *,
    obs_shape: tuple[int, ...] = (4,),
    obs_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    first_id: int = 0,
    truncated_fraction: float = 0.2,
    first_is_init: bool = False,
) -> TensorDict:
    """A ``[n_env, n_steps]`` collector-like batch with the full data contract.

    Args:
        n_env: env rows ``B``.
        n_steps: steps per row ``T``.
        mean_len: mean episode length.
        obs_shape: per-step observation shape; ``(84, 84)`` with ``torch.uint8`` for pixels.
        obs_dtype: observation dtype.
        seed: numpy seed.
        first_id: the smallest trajectory id (ids are ``first_id, first_id + 1, ...``).
        truncated_fraction: fraction of episode ends that are time-limit truncations.
        first_is_init: the first episode of every row starts at ``t = 0`` (``is_init`` True)
            instead of being already under way.

    The last episode of every row is cut at the batch edge (``("collector", "cut")`` True on
    its last step, done False) and, unless ``first_is_init``, the first episode of every row was
    already running when the batch starts (``is_init`` False on its first step).
    """
    rng = np.random.default_rng(seed)
    starts: list[tuple[int, int]] = []  # (t_start, env) of each episode
    ends: list[np.ndarray] = []
    for env in range(n_env):
        lengths = episode_lengths(n_steps, mean_len, rng)
        begin = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        starts.extend((int(t), env) for t in begin)
        ends.append(np.cumsum(lengths) - 1)
    # A collector hands out ids in order of episode start, env row breaking ties.
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    ids = np.empty((n_env, n_steps), dtype=np.int64)
    for new_id, i in enumerate(order):
        t, env = starts[i]
        ids[env, t:] = first_id + new_id  # later episodes of the row overwrite the tail
    done = np.zeros((n_env, n_steps), dtype=bool)
    for env, row_ends in enumerate(ends):
        done[env, row_ends[:-1]] = True  # the last episode of each row is cut, not done
    truncated = done & (rng.random((n_env, n_steps)) < truncated_fraction)
    is_init = np.zeros((n_env, n_steps), dtype=bool)
    is_init[:, 1:] = done[:, :-1]
    is_init[:, 0] = first_is_init
    cut = np.zeros((n_env, n_steps), dtype=bool)
    cut[:, -1] = ~done[:, -1]

    shape = (n_env, n_steps)
    step = torch.arange(n_env * n_steps, dtype=torch.float64).reshape(shape)
    obs = torch.zeros(*shape, *obs_shape, dtype=obs_dtype)
    if obs_dtype.is_floating_point:
        obs.view(*shape, -1)[..., 0] = step.to(obs_dtype)
        next_obs = obs.clone()
        next_obs.view(*shape, -1)[..., 0] += 0.5
    else:
        obs.view(*shape, -1)[..., 0] = (step % 251).to(obs_dtype)
        next_obs = obs.clone()
    action = torch.zeros(*shape, 2, dtype=torch.int64)
    action.scatter_(-1, torch.from_numpy(rng.integers(0, 2, size=(*shape, 1))), 1)
    flag = lambda a: torch.from_numpy(a).unsqueeze(-1)  # noqa: E731
    return TensorDict(
        {
            OBSERVATION: obs,
            ACTION: action,
            IS_INIT: flag(is_init),
            ("next", OBSERVATION): next_obs,
            ("next", "reward"): torch.ones(*shape, 1),
            DONE: flag(done),
            TERMINATED: flag(done & ~truncated),
            TRUNCATED: flag(truncated),
            TRAJ_IDS: torch.from_numpy(ids),
            CUT: torch.from_numpy(cut),
        },
        batch_size=[n_env, n_steps],
    )
