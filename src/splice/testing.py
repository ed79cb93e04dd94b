"""Test data for splice's tests, benchmarks and docs: collector-like batches and a counting env.

Everything here carries a *counting payload*, so that any lost, repeated, reordered, mixed or
stale step is visible in the data itself:

* :class:`SyntheticStream` plays ``B`` envs running episodes of random (geometric) length back
  to back and returns the next ``[B, T]`` collector-like batch at every
  :meth:`~SyntheticStream.chunk` call: an episode cut at the batch edge continues in the next
  chunk under the same id, ids are numbered as a collector numbers them (in order of episode
  start, env row breaking ties), and
  ``observation[..., 0]`` is the step's global index (env-major within a chunk, counting on
  across chunks). :func:`synthetic_rollout` is its first chunk.
* :class:`CountingEnv` is a gymnasium env whose observation counts the env's real steps, and
  :func:`counting_vec` vectorizes it in any autoreset mode; :class:`FaultyEnv` is one that
  raises or blocks at a chosen step (a worker fault).
* :func:`assert_slices_contiguous` checks sampled ``[S, L]`` slices against the payload, and
  :func:`assert_worker_streams` checks the batches of one or more collector workers.
* :func:`descendant_processes`, :func:`is_ray_service` and :func:`is_ray_process` let tests
  check that no worker process or Ray actor they started is left running.

Examples:
    >>> from splice.testing import SyntheticStream, synthetic_rollout
    >>> batch = synthetic_rollout(n_env=2, n_steps=5, mean_len=3.0, seed=0)
    >>> batch.batch_size
    torch.Size([2, 5])
    >>> batch["observation"][..., 0]
    tensor([[0., 1., 2., 3., 4.],
            [5., 6., 7., 8., 9.]])
    >>> stream = SyntheticStream(n_env=2, mean_len=3.0, seed=0)
    >>> first, second = stream.chunk(5), stream.chunk(5)
    >>> second["observation"][:, 0, 0]  # the count goes on across chunks
    tensor([10., 15.])
"""

from __future__ import annotations

import importlib
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from tensordict import TensorDict, TensorDictBase

from splice.collectors.ids import worker_of
from splice.envs.infos import EPISODE_STATISTICS
from splice.layout import (
    ACTION,
    CUT,
    DONE,
    IS_INIT,
    MASK,
    NEXT,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRAJ_IDS,
    TRUNCATED,
)

__all__ = [
    "ENV_ZOO",
    "ConstantPolicy",
    "CountingEnv",
    "EnvFamily",
    "FaultyEnv",
    "SyntheticStream",
    "assert_slices_contiguous",
    "assert_worker_streams",
    "atari_wrappers",
    "counting_vec",
    "descendant_processes",
    "episode_lengths",
    "is_ray_process",
    "is_ray_service",
    "synthetic_rollout",
    "threshold_policy",
]


def episode_lengths(n_steps: int, mean_len: float, rng: np.random.Generator) -> np.ndarray:
    """Geometric episode lengths (mean ``mean_len``) that exactly tile ``n_steps`` steps.

    Examples:
        >>> import numpy as np
        >>> int(episode_lengths(100, 7.0, np.random.default_rng(0)).sum())
        100
    """
    lengths: list[int] = []
    total = 0
    while total < n_steps:
        length = int(rng.geometric(1.0 / max(mean_len, 1.0)))
        length = min(length, n_steps - total)
        lengths.append(length)
        total += length
    return np.asarray(lengths, dtype=np.int64)


class SyntheticStream:
    """``n_env`` envs running episodes back to back; :meth:`chunk` returns the next batch.

    Args:
        n_env: env rows ``B``.
        mean_len: mean episode length (geometric lengths).
        seed: numpy seed.
        obs_shape: per-step observation shape; ``(84, 84)`` with ``torch.uint8`` for pixels.
        obs_dtype: observation dtype. Float observations count exactly; integer ones count
            modulo 251.
        first_id: the smallest trajectory id.
        first_step: the global index (payload) of the first step.
        truncated_fraction: fraction of episode ends that are time-limit truncations.
        first_is_init: the first episode of every row starts at the first step of the first
            chunk (``is_init`` True). ``False``: it was already under way.
        set_truncated: mark collector cuts with ``truncated``/``done`` too (TorchRL's
            ``set_truncated``); ``("collector", "cut")`` is set either way.
        labels: add ``"g"`` (global step index), ``"ep"`` (the episode's id) and ``"t"``
            (the step within the episode, counted from the episode's first step), int64.
            (Not ``"episode"``: TorchRL's trajectory-id key, which replay buffers detect.)

    Examples:
        >>> stream = SyntheticStream(n_env=3, mean_len=4.0, seed=1, labels=True)
        >>> a, b = stream.chunk(6), stream.chunk(6)
        >>> bool((b["ep"][:, 0] == a["ep"][:, -1])[~a["next", "done"][:, -1, 0]].all())
        True
    """

    def __init__(
        self,
        n_env: int,
        mean_len: float,
        *,
        seed: int = 0,
        obs_shape: tuple[int, ...] = (4,),
        obs_dtype: torch.dtype = torch.float32,
        first_id: int = 0,
        first_step: int = 0,
        truncated_fraction: float = 0.2,
        first_is_init: bool = True,
        set_truncated: bool = False,
        labels: bool = False,
    ) -> None:
        self.n_env = n_env
        self.mean_len = mean_len
        self.obs_shape = obs_shape
        self.obs_dtype = obs_dtype
        self.truncated_fraction = truncated_fraction
        self.set_truncated = set_truncated
        self.labels = labels
        self._rng = np.random.default_rng(seed)
        self._g = first_step  # global index of the next step of env row 0
        self._next_id = first_id + n_env
        self._episode = first_id + np.arange(n_env, dtype=np.int64)  # the running episodes
        self._t = np.full(n_env, 0 if first_is_init else 1, np.int64)  # their step counts
        self._left = self._lengths(n_env)  # steps each running episode has left

    def _lengths(self, k: int) -> np.ndarray:
        return self._rng.geometric(1.0 / max(self.mean_len, 1.0), size=k).astype(np.int64)

    def chunk(self, n_steps: int) -> TensorDict:
        """The next ``[B, n_steps]`` batch of the stream (see the class docstring)."""
        b, steps = self.n_env, n_steps
        done = np.zeros((b, steps), dtype=bool)
        t = np.empty((b, steps), dtype=np.int64)
        starts: list[tuple[int, int]] = []  # (time, env) of each episode starting in the chunk
        for env in range(b):
            lengths = np.array([self._left[env]], np.int64)
            while lengths.sum() < steps:  # draw more episodes until the row is covered
                need = steps - int(lengths.sum())
                lengths = np.concatenate([lengths, self._lengths(1 + int(need / self.mean_len))])
            ends = np.cumsum(lengths)
            lengths = lengths[: int(np.searchsorted(ends, steps)) + 1]  # drop unused draws
            ends = ends[: lengths.size]  # one past the last step of each episode
            begins = np.concatenate([[0], ends[:-1]])
            done[env, ends[ends <= steps] - 1] = True
            starts.extend((int(s), env) for s in begins[1:])
            row_t = np.arange(steps) - np.repeat(begins, lengths)[:steps]
            row_t[: min(lengths[0], steps)] += self._t[env]
            t[env] = row_t
            self._left[env] = int(ends[-1]) - steps
            self._t[env] = int(row_t[-1]) + 1
        ended = self._left == 0  # the last episode of these rows ended on the last step
        self._left[ended] = self._lengths(int(ended.sum()))
        self._t[ended] = 0
        # A collector hands out ids in order of episode start, env row breaking ties.
        ids = np.repeat(self._episode[:, None], steps, axis=1)
        starts.sort()
        fresh = self._next_id + np.arange(len(starts), dtype=np.int64)
        self._next_id += len(starts)
        for new_id, (s, env) in zip(fresh, starts, strict=True):
            ids[env, s:] = new_id  # later episodes of a row overwrite the tail
        self._episode = ids[:, -1].copy()
        self._episode[ended] = self._next_id + np.arange(int(ended.sum()))
        self._next_id += int(ended.sum())

        truncated = done & (self._rng.random((b, steps)) < self.truncated_fraction)
        cut = np.zeros((b, steps), dtype=bool)
        cut[:, -1] = ~done[:, -1]
        mark = cut if self.set_truncated else np.zeros_like(cut)
        g = self._g + np.arange(b * steps, dtype=np.int64).reshape(b, steps)
        self._g += b * steps
        obs = torch.zeros(b, steps, *self.obs_shape, dtype=self.obs_dtype)
        gt = torch.from_numpy(g)
        if self.obs_dtype.is_floating_point:
            obs.view(b, steps, -1)[..., 0] = gt.to(self.obs_dtype)
            next_obs = obs.clone()
            next_obs.view(b, steps, -1)[..., 0] += 0.5
        else:
            obs.view(b, steps, -1)[..., 0] = (gt % 251).to(self.obs_dtype)
            next_obs = obs.clone()
        action = torch.zeros(b, steps, 2, dtype=torch.int64)
        action.scatter_(-1, torch.from_numpy(self._rng.integers(0, 2, size=(b, steps, 1))), 1)
        flag = lambda a: torch.from_numpy(a).unsqueeze(-1)  # noqa: E731
        entries: dict[Any, torch.Tensor] = {
            OBSERVATION: obs,
            ACTION: action,
            IS_INIT: flag(t == 0),
            (NEXT, OBSERVATION): next_obs,
            REWARD: torch.ones(b, steps, 1),
            DONE: flag(done | mark),
            TERMINATED: flag(done & ~truncated),
            TRUNCATED: flag(truncated | mark),
            TRAJ_IDS: torch.from_numpy(ids),
            CUT: torch.from_numpy(cut),
        }
        if self.labels:
            entries["g"] = gt
            entries["ep"] = torch.from_numpy(ids.copy())
            entries["t"] = torch.from_numpy(t)
        return TensorDict(entries, batch_size=[b, steps])


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
    """A ``[n_env, n_steps]`` collector-like batch: the first chunk of a :class:`SyntheticStream`.

    The last episode of every row is cut at the batch edge (``("collector", "cut")`` True on
    its last step, done False) unless it happens to end there, and, unless ``first_is_init``,
    the first episode of every row was already running when the batch starts (``is_init``
    False on its first step). The arguments are :class:`SyntheticStream`'s.

    Examples:
        >>> batch = synthetic_rollout(4, 50, mean_len=10.0, seed=0, first_is_init=True)
        >>> bool(batch["is_init"][:, 0].all()), batch["collector", "traj_ids"].dtype
        (True, torch.int64)
    """
    stream = SyntheticStream(
        n_env,
        mean_len,
        seed=seed,
        obs_shape=obs_shape,
        obs_dtype=obs_dtype,
        first_id=first_id,
        truncated_fraction=truncated_fraction,
        first_is_init=first_is_init,
    )
    return stream.chunk(n_steps)


def assert_slices_contiguous(
    sample: TensorDict, *, live: set[int] | None = None, labels: bool = True
) -> None:
    """Assert that every row of a ``[S, L]`` sample of :class:`SyntheticStream` data (with
    ``labels=True``) is one episode's consecutive steps followed by padding only.

    Args:
        sample: ``[S, L]`` slices with the ``"g"``, ``"ep"`` and ``"t"`` labels; real steps
            are marked by ``("collector", "mask")`` (all real if absent).
        live: the global steps still stored; a step outside it (overwritten data) fails.
        labels: kept for symmetry with :class:`SyntheticStream`; must be True.

    Examples:
        >>> from splice import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(500),
        ...     sampler=SliceSampler(slice_len=4, as_sequences=True, seed=0),
        ...     batch_size=32,
        ... )
        >>> _ = rb.extend(SyntheticStream(4, 10.0, labels=True).chunk(50))
        >>> assert_slices_contiguous(rb.sample())
    """
    assert labels, "the check needs SyntheticStream(labels=True) data"
    valid = sample.get(MASK, None)
    if valid is None:
        valid = torch.ones(sample.batch_size, dtype=torch.bool)
    g, episode, t = sample["g"], sample["ep"], sample["t"]
    for i in range(sample.batch_size[0]):
        v = valid[i]
        n = int(v.sum())
        assert bool(v[:n].all()) and not bool(v[n:].any()), f"padding inside slice {i}"
        assert n >= 1, f"slice {i} is empty"
        ep = episode[i, :n]
        assert bool((ep == ep[0]).all()), f"slice {i} mixes episodes {ep.tolist()}"
        steps = t[i, :n]
        assert bool((steps[1:] - steps[:-1] == 1).all()), f"slice {i} not contiguous {steps}"
        if live is not None:
            gs = set(g[i, :n].tolist())
            assert gs <= live, f"slice {i} holds overwritten steps {sorted(gs - live)[:5]}"


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """``obs = [real steps taken by this env so far, step in the episode, env tag]``.

    Episodes end (terminated) after ``length`` steps, or truncated after ``trunc`` steps.
    Resets never count as steps, so along an env row the first obs entry counts 0, 1, 2, ...
    across episodes and batches: a dead step, a lost step or a repeated step shows up as a
    jump. The reward is the action, so data from two runs can be compared step by step.
    Every info (reset and step) repeats the counts: ``{"total": ..., "t": ...}``.

    Examples:
        >>> env = CountingEnv(length=2)
        >>> obs, _ = env.reset()
        >>> env.step(1)[:3]
        (array([1., 1., 0.], dtype=float32), 1.0, False)
    """

    metadata: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, length: int = 5, tag: int = 0, trunc: int | None = None) -> None:
        self.length, self.tag, self.trunc = length, tag, trunc
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.total = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.total, self.t, self.tag], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode (not a step: the total count does not move)."""
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"total": self.total, "t": self.t}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step; the reward is the action."""
        self.total += 1
        self.t += 1
        terminated = self.t >= self.length
        truncated = self.trunc is not None and self.t >= self.trunc and not terminated
        info = {"total": self.total, "t": self.t}
        return self._obs(), float(action), terminated, truncated, info


class FaultyEnv(CountingEnv):
    """A :class:`CountingEnv` (episodes of ``length`` steps) that fails at its ``at``-th step
    (counted over its whole life, across episodes): a worker fault for tests.

    Args:
        at: the step (1-based: the env's steps are counted over its life) that fails.
        fault: ``"raise"`` (a ``ValueError`` naming the step) or ``"block"`` (the step sleeps
            for an hour: a worker stuck in its env, to be ended by a shutdown).
        marker: a file path, or ``None``. ``"block"`` creates the file before blocking (so a
            test can wait until the env is stuck); ``"raise"`` raises only if the file does
            not exist yet, and creates it (so the env of a replacement worker does not fail
            again).
        length: the episode length.

    Raises:
        ValueError: ``fault`` is neither ``"raise"`` nor ``"block"``, or ``at < 1``.
        TypeError: ``at`` is not an int.

    Examples:
        >>> env = FaultyEnv(at=2)
        >>> _ = env.reset()
        >>> _ = env.step(0)
        >>> env.step(0)
        Traceback (most recent call last):
        ...
        ValueError: env exploded at step 2
    """

    def __init__(
        self, at: int, fault: str = "raise", marker: str | None = None, length: int = 4
    ) -> None:
        if fault not in ("raise", "block"):
            raise ValueError(f"fault must be 'raise' or 'block', got {fault!r}")
        if isinstance(at, bool) or not isinstance(at, int):
            raise TypeError(f"at must be an int, got {type(at).__name__}")
        if at < 1:
            raise ValueError(f"at must be a step number >= 1, got {at}")
        super().__init__(length=length)
        self.at, self.fault, self.marker = at, fault, marker

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step of :class:`CountingEnv`, or the fault at step :attr:`at` and after."""
        if self.total + 1 >= self.at:
            if self.fault == "block":
                if self.marker is not None:
                    Path(self.marker).touch()
                time.sleep(3600)
            elif self.marker is None or not Path(self.marker).exists():
                if self.marker is not None:
                    Path(self.marker).touch()
                raise ValueError(f"env exploded at step {self.at}")
        return super().step(action)


def counting_vec(
    lengths: list[int],
    mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    *,
    asynchronous: bool = False,
    trunc: int | None = None,
) -> SyncVectorEnv | AsyncVectorEnv:
    """One :class:`CountingEnv` per entry of ``lengths`` (episode length), tagged ``0, 1, ...``,
    as a vector env in autoreset ``mode`` (``asynchronous``: an ``AsyncVectorEnv``, forked).

    Examples:
        >>> env = counting_vec([2, 3])
        >>> env.num_envs
        2
        >>> env.close()
    """
    fns = [lambda n=n, i=i: CountingEnv(n, tag=i, trunc=trunc) for i, n in enumerate(lengths)]
    if asynchronous:
        return AsyncVectorEnv(fns, autoreset_mode=mode, context="fork")
    return SyncVectorEnv(fns, autoreset_mode=mode)


def assert_worker_streams(batches: list[TensorDictBase]) -> dict[tuple[int, int], int]:
    """Check collector batches of :class:`CountingEnv` envs, made by one or more workers
    (``[B, T]`` or ``[T]``, in the order they were collected): every env of every worker,
    followed across the batches, counts its steps 0, 1, 2, ... (no step lost, repeated or
    reordered); its ids change exactly where an episode starts, and only to ids never seen
    before anywhere; no row mixes workers or envs. Returns the steps of each
    ``(worker id space, env tag)``.

    Examples:
        >>> from splice import Collector
        >>> with Collector(counting_vec([3, 4]), frames_per_batch=10, total_frames=20) as c:
        ...     batches = list(c)
        >>> sorted(assert_worker_streams(batches).values())
        [10, 10]
    """
    counts: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    ids: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    inits: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    for batch in batches:
        rows = batch if batch.ndim == 2 else batch.unsqueeze(0)
        for row in rows:
            traj = row[TRAJ_IDS].numpy()
            key = (int(worker_of(traj[0])), int(row[OBSERVATION][0, 2]))
            assert np.all(worker_of(traj) == key[0]), "a row mixes workers"
            assert (row[OBSERVATION][:, 2].numpy() == key[1]).all(), "a row mixes envs"
            counts[key].append(row[OBSERVATION][:, 0].numpy())
            ids[key].append(traj)
            inits[key].append(row[IS_INIT][:, 0].numpy())
    owner: dict[int, tuple[int, int]] = {}
    for key in counts:
        count = np.concatenate(counts[key])
        np.testing.assert_array_equal(count, np.arange(count.size), err_msg=f"stream {key}")
        traj, init = np.concatenate(ids[key]), np.concatenate(inits[key])
        assert init[0], "the first step of a stream starts an episode"
        changes = np.flatnonzero(np.diff(traj)) + 1
        np.testing.assert_array_equal(changes, np.flatnonzero(init)[1:])
        starts = traj[np.flatnonzero(init)]
        assert (np.diff(starts) > 0).all(), "ids are issued in increasing order"
        for t in np.unique(traj):
            assert owner.setdefault(int(t), key) == key, f"id {t} used by two envs"
    return {key: sum(c.size for c in chunks) for key, chunks in counts.items()}


def threshold_policy(td: TensorDictBase) -> TensorDictBase:
    """A deterministic TensorDict policy: action 1 where ``observation[..., 1] > 0``, else 0.

    On CartPole it pushes in the direction of the cart's velocity (short episodes); on a
    :class:`CountingEnv` it plays 0 on an episode's first step and 1 after, so runs can be
    compared step by step.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"observation": torch.tensor([[0.0, 1.0], [0.0, -1.0]])}, [2])
        >>> threshold_policy(td)["action"]
        tensor([1, 0])
    """
    td["action"] = (td["observation"][..., 1] > 0).long()
    return td


@dataclass(frozen=True)
class EnvFamily:
    """One real env family of the env zoo (``tests/envs/test_zoo.py``, ``bench_envs``): how a
    new user would make ONE env of it, and what to ask the collector for.

    Args:
        name: a short name (test ids, table rows).
        env_id: the gymnasium id.
        package: the optional package that registers it (extra ``envs``), or ``None``.
        make_kwargs: keyword arguments of ``gymnasium.make``.
        wrap: the standard wrappers to apply (e.g. Atari preprocessing), or ``None``.
        info_keys: ``Collector(info_keys=...)`` for this family.
        non_tensor: its observation keys without a tensor form.
        mode: the autoreset mode of its vector env (:meth:`make_vec`).

    Examples:
        >>> family = next(f for f in ENV_ZOO if f.name == "taxi")
        >>> env = family.make(max_episode_steps=5)
        >>> env.reset(seed=0)[1]["action_mask"]
        array([1, 1, 0, 0, 0, 0], dtype=int8)
        >>> family.make_vec(2).num_envs
        2
    """

    name: str
    env_id: str
    package: str | None = None
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    wrap: Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]] | None = None
    info_keys: Any = None
    non_tensor: tuple[tuple[str, ...], ...] = ()
    mode: AutoresetMode = AutoresetMode.NEXT_STEP

    def make(self, max_episode_steps: int | None = None) -> gym.Env[Any, Any]:
        """One env (episodes cut at ``max_episode_steps`` when given).

        Raises:
            ImportError: the family's package is not installed (its ``name`` says which).
        """
        if self.package is not None:
            module = importlib.import_module(self.package)
            if self.package == "ale_py":
                gym.register_envs(module)
        kwargs = dict(self.make_kwargs)
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        env = gym.make(self.env_id, **kwargs)
        return self.wrap(env) if self.wrap is not None else env

    def make_vec(self, num_envs: int, max_episode_steps: int | None = None) -> SyncVectorEnv:
        """``num_envs`` envs of :meth:`make` in a ``SyncVectorEnv`` (autoreset :attr:`mode`);
        env ``i`` is seeded with ``seed + i`` by ``reset(seed=seed)``."""
        self.make(max_episode_steps).close()  # raises ImportError before any worker starts
        return SyncVectorEnv(
            [lambda: self.make(max_episode_steps)] * num_envs, autoreset_mode=self.mode
        )


def atari_wrappers(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """gymnasium's standard Atari preprocessing: 84x84 greyscale, frame skip 4, 4 stacked
    frames (``[4, 84, 84]`` uint8); the env must be made with ``frameskip=1``."""
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, noop_max=0)
    return gym.wrappers.FrameStackObservation(env, 4)


#: The env families of issue 13, raw as their packages ship them (wrappers only where a user
#: would add the standard ones): MuJoCo, MiniGrid with its text mission, Atari, popgym, Taxi
#: with its ``action_mask``, and ``RecordEpisodeStatistics`` on Blackjack.
ENV_ZOO = [
    EnvFamily("pendulum", "Pendulum-v1", mode=AutoresetMode.SAME_STEP),
    EnvFamily("hopper", "Hopper-v5", package="mujoco", info_keys=["x_position"]),
    EnvFamily(
        "minigrid",
        "MiniGrid-MemoryS7-v0",
        package="minigrid",
        non_tensor=(("observation", "mission"),),
        mode=AutoresetMode.DISABLED,
    ),
    EnvFamily(
        "atari",
        "ALE/Pong-v5",
        package="ale_py",
        make_kwargs={"frameskip": 1},
        wrap=atari_wrappers,
        info_keys=["lives"],
    ),
    EnvFamily("popgym", "popgym-RepeatPreviousEasy-v0", package="popgym"),
    EnvFamily("taxi", "Taxi-v4", info_keys=["action_mask"], mode=AutoresetMode.SAME_STEP),
    EnvFamily("frozenlake", "FrozenLake-v1"),
    EnvFamily(
        "blackjack",
        "Blackjack-v1",
        wrap=gym.wrappers.RecordEpisodeStatistics,
        info_keys={"episode": EPISODE_STATISTICS},
        mode=AutoresetMode.DISABLED,
    ),
]


class ConstantPolicy(torch.nn.Module):
    """A TensorDict policy whose weights show in the data: every action is ``bias > 0`` (0 or
    1) for one parameter ``bias`` (0 at first), so which weights collected a batch can be read
    off its actions (weight updates, staleness).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> policy = ConstantPolicy()
        >>> policy(TensorDict({}, batch_size=[3]))["action"]
        tensor([0, 0, 0])
        >>> policy.load_state_dict({"bias": torch.tensor(1.0)})
        <All keys matched successfully>
        >>> policy(TensorDict({}, batch_size=[3]))["action"]
        tensor([1, 1, 1])
    """

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td["action"] = (self.bias > 0).long().expand(td.batch_size).clone()
        return td


# ------------------------------------------------------------------ leftover processes
def descendant_processes() -> dict[int, tuple[int, bytes]]:
    """Every live process below this one (zombies excluded): ``pid -> (parent pid, command
    line)``, the command line's NUL separators as spaces. For tests that check that nothing
    they started is left running (reads Linux's ``/proc``).

    Examples:
        >>> import subprocess, sys
        >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        >>> child.pid in descendant_processes()
        True
        >>> child.kill(); child.wait()
        -9
        >>> child.pid in descendant_processes()
        False
    """
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        states[int(entry.name)] = fields[0]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, tuple[int, bytes]] = {}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, []):
            todo.append(child)
            if states[child] == "Z":
                continue
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            found[child] = (parent, cmdline.strip())
    return found


#: Ray's own long-lived processes besides its binaries and scripts (which run from the ray
#: package's directory): agents and idle pooled workers. An actor's process is
#: ``ray::ClassName`` (``ray::ClassName.method`` while it runs one).
RAY_SERVICE_TITLES = (b"ray::IDLE", b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def is_ray_service(cmdline: bytes) -> bool:
    """Whether a command line is one of Ray's own processes (GCS, raylet, agents, monitors,
    idle workers), as opposed to an actor's or a driver's.

    Examples:
        >>> is_ray_service(b"/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet")
        True
        >>> is_ray_service(b"ray::IDLE"), is_ray_service(b"ray::RayWorker.collect")
        (True, False)
        >>> is_ray_service(b"python -u /venv/lib/python3.11/site-packages/ray/dashboard/agent.py")
        True
        >>> is_ray_service(b"python -B -c main(['/venv/lib/python3.11/site-packages/ray/x'])")
        False
    """
    if cmdline.startswith(b"ray::"):
        return cmdline.split()[0] in RAY_SERVICE_TITLES
    # The program or its script (``python [-u] .../ray/...py``), not any argument: a process
    # started after ``import ray`` may carry Ray's paths in its arguments (e.g. the fork
    # server of multiprocessing, given ``sys.path``).
    return any(
        b"/site-packages/ray/" in part or b"/ray/core/src/ray/" in part
        for part in cmdline.split()[:3]
    )


def is_ray_process(cmdline: bytes) -> bool:
    """Whether a command line is any Ray process: a service or an actor (``ray::...``).

    Examples:
        >>> is_ray_process(b"ray::RayWorker"), is_ray_process(b"python -m pytest")
        (True, False)
    """
    return cmdline.startswith(b"ray::") or is_ray_service(cmdline)
