"""Recurrent DQN (R2D2-style) on a partially observed task, built from splice's parts.

The default task is velocity-masked CartPole; any gymnasium env with discrete actions works
(``R2D2Config(env_id=...)``, see :func:`splice.examples.tasks.make_task`).

* **Collection**: :class:`splice.Collector` runs an epsilon-greedy recurrent policy on 16
  vectorised envs **in the background** (``collector.start()``), carrying the
  LSTM state from step to step, zeroing it at episode starts and storing the state entering
  every step; it writes into a :class:`splice.ReplayBuffer`.
* **Replay**: a :class:`splice.SliceSampler` draws ``[32, burn_in + seq_len]`` sequences that
  never cross an episode end, left-aligned with a mask (burn-in / training / padding), and the
  stored state at each sequence's first step (R2D2's "stored state" with burn-in).
* **Learning**: n-step double DQN on the sequences (Huber loss, hard target updates,
  targets from :func:`splice.targets.n_step_return`), one gradient step per
  ``frames_per_update`` collected frames. The collector's thread keeps that ratio: it waits
  before a batch while it is two batches ahead of the learner (a sample-to-insert rate limiter,
  ``Collector.start(gate=...)``).

Three agents share everything but how they use memory:

* ``"recurrent"``: the above.
* ``"mlp"``: a memoryless MLP Q-network on the same masked observations and sequences.
* ``"naive"``: the recurrent network trained on fixed windows cut from each env's raw stream
  regardless of episode ends (zero initial state, no burn-in): the hidden state runs across
  episode boundaries inside a window, and the bootstrap value at an episode's last step comes
  from the next episode's first observation.

Examples:
    A (very) short run, to show the moving parts:

    >>> from splice.examples.r2d2 import R2D2Config, train
    >>> result = train(R2D2Config(total_frames=2_000, learning_starts=500, eval_every=1_000,
    ...                           eval_episodes=2, eval_every_episodes=2, seed=0))
    >>> result.updates > 0, len(result.curve) >= 1, len(result.final_returns)
    (True, True, 2)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import Tensor, nn

from splice.collectors import Collector
from splice.examples.qnets import ENV_INDEX_KEY, STATE_KEY, EpsilonGreedy, MLPQNet, RecurrentQNet
from splice.examples.tasks import MASKABLE, make_task, task_dims
from splice.layout import MASK, NEXT_OBSERVATION, OBSERVATION, REWARD
from splice.replay import BURN_IN, LazyTensorStorage, ReplayBuffer, SliceSampler
from splice.targets import TargetKeys, n_step_return

__all__ = ["AGENTS", "R2D2Config", "TrainResult", "evaluate", "make_sampler", "train"]

#: Where the learner puts ``reward * reward_scale`` for the targets (with a scale != 1).
SCALED_REWARD_KEY = ("next", "scaled_reward")

Agent = Literal["recurrent", "mlp", "naive"]
#: The agents ``train`` can run (see the module docs).
AGENTS: tuple[Agent, ...] = ("recurrent", "mlp", "naive")


@dataclass
class R2D2Config:
    """Every knob of a training run (defaults: the recipe that solves the task).

    Attributes:
        agent: ``"recurrent"``, ``"mlp"`` or ``"naive"`` (see the module docs).
        env_id: the gymnasium env (discrete actions; see :func:`~splice.examples.tasks.make_task`).
        mask_velocity: remove CartPole's velocities; ``None`` (default): yes for
            ``CartPole-v1``, no for any other env.
        max_episode_steps: time limit of training and evaluation episodes; ``None`` keeps the
            env's own.
        seed: seeds the envs, the policy's exploration, the network and the sampler.
        total_frames: environment steps to collect (dead autoreset steps are not counted).
        time_limit: stop training after this many seconds even if frames remain.
        num_envs: vectorised envs collecting in parallel.
        steps_per_batch: collector batch length ``T`` (batches are ``[num_envs, T]``).
        hidden: width of the encoder, the LSTM and the head.
        cell: ``"lstm"`` or ``"gru"``.
        capacity: replay buffer size, in steps.
        burn_in: steps before each training sequence that only warm up the state.
        seq_len: training steps per sequence.
        batch_size: sequences per gradient step.
        learning_starts: frames collected before the first gradient step.
        frames_per_update: collected frames per gradient step (the replay ratio).
        n_step: steps of the n-step return.
        gamma: discount.
        reward_scale: rewards are multiplied by this in the learning targets (returns are
            reported unscaled); popgym's per-step rewards are ~1/episode length.
        lr: Adam learning rate at the start.
        lr_end: learning rate at ``total_frames``, reached linearly from ``lr_decay_start``
            frames on (``None``: constant ``lr``).
        lr_decay_start: frames collected when the learning rate starts to decay.
        grad_clip: gradient-norm clip.
        target_update: gradient steps between target-network copies.
        eps_start: initial exploration rate.
        eps_end: final exploration rate.
        eps_decay_frames: frames over which epsilon decays linearly.
        eval_every: frames between periodic greedy evaluations (the learning curve).
        eval_every_episodes: episodes per periodic evaluation.
        eval_episodes: episodes of the final evaluation (on seeds not used before).
        keep_best: evaluate the final policy from the checkpoint with the best periodic
            evaluation (model selection on held-out episodes), rather than the last weights.
        threads: torch intra-op threads (1 is fastest for these small networks).
    """

    agent: Agent = "recurrent"
    env_id: str = MASKABLE
    mask_velocity: bool | None = None
    max_episode_steps: int | None = None
    seed: int = 0
    total_frames: int = 150_000
    time_limit: float = 480.0
    num_envs: int = 16
    steps_per_batch: int = 8
    hidden: int = 64
    cell: str = "lstm"
    capacity: int = 100_000
    burn_in: int = 10
    seq_len: int = 30
    batch_size: int = 32
    learning_starts: int = 5_000
    frames_per_update: int = 8
    n_step: int = 5
    gamma: float = 0.995
    reward_scale: float = 1.0
    lr: float = 5e-4
    lr_end: float | None = None
    lr_decay_start: int = 0
    grad_clip: float = 10.0
    target_update: int = 500
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_frames: int = 50_000
    eval_every: int = 5_000
    eval_every_episodes: int = 20
    eval_episodes: int = 20
    keep_best: bool = True
    threads: int = 1

    def __post_init__(self) -> None:
        if self.agent not in AGENTS:
            raise ValueError(f"agent must be one of {AGENTS}, got {self.agent!r}")
        for name in ("total_frames", "num_envs", "steps_per_batch", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale must be > 0, got {self.reward_scale}")

    @property
    def masked(self) -> bool:
        """Whether CartPole's velocities are removed (``mask_velocity`` resolved)."""
        return self.env_id == MASKABLE if self.mask_velocity is None else self.mask_velocity

    def make_env(self, num_envs: int) -> gym.vector.VectorEnv:
        """``num_envs`` envs of the run's task."""
        return make_task(
            self.env_id,
            num_envs,
            mask_velocity=self.masked,
            max_episode_steps=self.max_episode_steps,
        )

    def learning_rate(self, frames: int) -> float:
        """``lr``, then from ``lr_decay_start`` frames on linear down to ``lr_end`` at
        ``total_frames`` (constant ``lr`` without ``lr_end``)."""
        if self.lr_end is None or frames <= self.lr_decay_start:
            return self.lr
        span = max(1, self.total_frames - self.lr_decay_start)
        frac = min(1.0, (frames - self.lr_decay_start) / span)
        return self.lr + frac * (self.lr_end - self.lr)

    def epsilon(self, frames: int) -> float:
        """Linear decay from ``eps_start`` to ``eps_end`` over ``eps_decay_frames``."""
        frac = min(1.0, frames / max(1, self.eps_decay_frames))
        return self.eps_start + frac * (self.eps_end - self.eps_start)


@dataclass
class TrainResult:
    """What a run produced: the learning curve, the final evaluations and timings.

    ``final_returns`` are the greedy returns of the model the run keeps: the checkpoint with
    the best periodic evaluation (taken at ``kept_frames``, where it scored
    ``kept_eval_return``) when ``keep_best`` is set, else the last weights.
    ``last_returns`` are those of the last weights, on the same episodes.
    """

    config: dict[str, Any]
    curve: list[dict[str, float]] = field(default_factory=list)
    episodes: list[tuple[int, float]] = field(default_factory=list)
    final_returns: list[float] = field(default_factory=list)
    last_returns: list[float] = field(default_factory=list)
    kept_frames: int | None = None
    kept_eval_return: float | None = None
    frames: int = 0
    updates: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def final_mean(self) -> float:
        """Mean greedy return of the final evaluation."""
        return float(np.mean(self.final_returns)) if self.final_returns else float("nan")

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (everything but the per-episode log)."""
        out = asdict(self)
        out.pop("episodes")
        out["final_mean"] = self.final_mean
        out["last_mean"] = float(np.mean(self.last_returns)) if self.last_returns else None
        return out


def make_network(config: R2D2Config, obs_dim: int, n_actions: int) -> RecurrentQNet | MLPQNet:
    """The Q-network of ``config.agent``."""
    if config.agent == "mlp":
        return MLPQNet(obs_dim, n_actions, config.hidden)
    return RecurrentQNet(obs_dim, n_actions, config.hidden, config.cell)


def make_sampler(config: R2D2Config) -> tuple[SliceSampler, int]:
    """The sampler of ``config.agent`` and the steps of one sample (a replay buffer's
    ``batch_size``): what :func:`make_replay` builds its buffer with, and what a buffer of
    another kind (e.g. the :class:`~splice.RayReplayBuffer` of tutorial 4) takes to train the
    same way.

    Examples:
        >>> sampler, steps = make_sampler(R2D2Config(seq_len=8, batch_size=4))
        >>> type(sampler).__name__, sampler.slice_len, steps
        ('SliceSampler', 8, 32)
    """
    if config.agent == "naive":
        # Each env's raw stream is one "trajectory": windows cross episode ends.
        sampler = SliceSampler(
            slice_len=config.burn_in + config.seq_len,
            traj_key=ENV_INDEX_KEY,
            as_sequences=True,
            seed=config.seed,
        )
        return sampler, config.batch_size * (config.burn_in + config.seq_len)
    sampler = SliceSampler(
        slice_len=config.seq_len,
        burn_in=config.burn_in,
        strict_length=False,
        weighting="transition",
        as_sequences=True,
        state_keys=[STATE_KEY] if config.agent == "recurrent" else [],
        seed=config.seed,
    )
    return sampler, config.batch_size * config.seq_len


def make_replay(config: R2D2Config) -> ReplayBuffer:
    """The replay buffer of ``config.agent``: ``config.capacity`` steps in memory, sampled by
    :func:`make_sampler`'s sampler."""
    sampler, batch = make_sampler(config)
    return ReplayBuffer(
        storage=LazyTensorStorage(config.capacity), sampler=sampler, batch_size=batch
    )


class Learner:
    """Double DQN with n-step returns on sampled sequences."""

    def __init__(self, net: RecurrentQNet | MLPQNet, config: R2D2Config) -> None:
        self.net, self.config = net, config
        self.target = copy.deepcopy(net).requires_grad_(False)
        self.optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
        self.updates = 0

    def set_learning_rate(self, lr: float) -> None:
        """Use ``lr`` from the next gradient step on."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def update(self, data: TensorDictBase, info: dict[str, Any]) -> float:
        """One gradient step on a ``[S, L]`` sample; returns the loss."""
        cfg = self.config
        s, length = data.shape
        obs, next_obs = data[OBSERVATION], data[NEXT_OBSERVATION]
        if cfg.agent == "naive":
            # The raw stream: obs[j] then the last next_obs (crosses episode ends).
            inputs = torch.cat([obs, next_obs[:, -1:]], 1)
            state = self.net.initial_state(s)
        else:
            # obs[0], then next_obs[j]: within an episode next_obs[j] == obs[j + 1], and at an
            # episode's end it is the true final observation, the one to bootstrap from.
            inputs = torch.cat([obs[:, :1], next_obs], 1)
            stored = info.get("initial_state", {}).get(STATE_KEY)
            state = stored if stored is not None else self.net.initial_state(s)
        q_all, _ = self.net(inputs, state)
        with torch.no_grad():
            q_target, _ = self.target(inputs, state)
            best = q_all[:, 1:].argmax(-1, keepdim=True)  # double DQN: online picks
            next_value = q_target[:, 1:].gather(-1, best).squeeze(-1)
            # Up to n rewards, then next_value of the last step used (none if terminated):
            # stops at episode ends and at each sequence's end (the sampler marks it).
            keys = None
            if cfg.reward_scale != 1.0:
                data.set(SCALED_REWARD_KEY, data[REWARD] * cfg.reward_scale)
                keys = TargetKeys(reward=SCALED_REWARD_KEY)
            targets = n_step_return(data, next_value, n=cfg.n_step, gamma=cfg.gamma, keys=keys)
            targets = targets.squeeze(-1)
        action = data["action"].long()
        q = q_all[:, :length].gather(-1, action.unsqueeze(-1)).squeeze(-1)
        mask = data[MASK]
        train = mask & ~data[BURN_IN] if BURN_IN in data.keys(True) else mask
        weight = train.float()
        loss = (F.smooth_l1_loss(q, targets, reduction="none") * weight).sum() / weight.sum().clamp(
            min=1.0
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.updates += 1
        if self.updates % cfg.target_update == 0:
            self.target.load_state_dict(self.net.state_dict())
        return float(loss.detach())


@torch.no_grad()
def evaluate(
    net: RecurrentQNet | MLPQNet,
    env: gym.vector.VectorEnv,
    seed: int,
    *,
    max_steps: int = 100_000,
) -> np.ndarray:
    """Greedy returns of one episode per env of ``env`` (stopped after ``max_steps`` steps).

    Examples:
        >>> from splice.examples.tasks import make_task
        >>> env = make_task("CartPole-v1", num_envs=3, mask_velocity=True)
        >>> evaluate(MLPQNet(2, 2, hidden=8), env, seed=0).shape
        (3,)
    """
    obs, _ = env.reset(seed=seed)
    episodes = env.num_envs
    state = net.initial_state(episodes)
    returns = np.zeros(episodes)
    alive = np.ones(episodes, dtype=bool)
    for _ in range(max_steps):
        q, state = net(torch.from_numpy(obs)[:, None], state)
        obs, reward, terminated, truncated, _ = env.step(q[:, 0].argmax(-1).numpy())
        returns += reward * alive
        alive &= ~(terminated | truncated)
        if not alive.any():
            break
    return returns


def _evaluate(
    config: R2D2Config, net: RecurrentQNet | MLPQNet, episodes: int, seed: int
) -> np.ndarray:
    env = config.make_env(episodes)
    try:
        return evaluate(net, env, seed)
    finally:
        env.close()


Progress = Callable[[dict[str, float]], None]


def train(config: R2D2Config, *, progress: Progress | None = None) -> TrainResult:
    """Train ``config.agent`` on ``config``'s task; evaluate it greedily at the end.

    Args:
        config: the run's settings.
        progress: called every half second or so with ``frames``, ``episodes``,
            ``recent_return`` (mean of the last 20 training episodes), ``loss`` and, after an
            evaluation, ``eval_return``.
    """
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    env = config.make_env(config.num_envs)
    obs_dim, n_actions = task_dims(env)
    net = make_network(config, obs_dim, n_actions)
    policy = EpsilonGreedy(
        net, n_actions, seed=config.seed, epsilon=config.eps_start,
        tag_env_index=config.agent == "naive",
    )  # fmt: skip
    replay = make_replay(config)
    learner = Learner(net, config)
    collector = Collector(
        env,
        policy,
        frames_per_batch=config.num_envs * config.steps_per_batch,
        total_frames=config.total_frames,
        replay_buffer=replay,
        seed=config.seed,
        track_episodes=True,
    )
    result = TrainResult(config=asdict(config))
    best: tuple[float, float, dict[str, Tensor] | None] = (-np.inf, 0.0, None)
    losses: list[float] = []
    next_eval = config.eval_every
    max_lag = 2 * config.num_envs * config.steps_per_batch // config.frames_per_update

    def updates_due(frames: int) -> int:
        return max(0, frames - config.learning_starts) // config.frames_per_update

    paused = False
    last_report = 0.0
    # Rate limiter: the collector runs ahead of the learner by two batches at most; the
    # collecting thread checks it before each batch (see Collector.start).
    collector.start(gate=lambda: updates_due(replay.write_count) - learner.updates <= max_lag)
    try:
        while True:
            # Read before the frames: once the collector has stopped, the frames read next
            # are all it wrote (read after, its last batch could land in between, unseen).
            collecting = collector.running
            frames = replay.write_count
            policy.epsilon = config.epsilon(frames)
            learner.set_learning_rate(config.learning_rate(frames))
            due = updates_due(frames)
            if time.perf_counter() - start_wall > config.time_limit:
                break
            if learner.updates < due:
                data, info = replay.sample(return_info=True)
                losses.append(learner.update(data, info))
            elif paused:
                collector.resume()
                paused = False
            elif not collecting:
                break
            else:
                time.sleep(0.0005)
            if frames >= next_eval:
                next_eval += config.eval_every
                if not paused and collector.running:  # no collection while evaluating
                    collector.pause()
                    paused = True
                returns = _evaluate(
                    config, net, config.eval_every_episodes, seed=10_000 + len(result.curve)
                )
                point = _curve_point(frames, returns, collector.episode_log, losses, start_wall)
                result.curve.append(point)
                if point["eval_return"] >= best[0]:
                    best = (point["eval_return"], frames, copy.deepcopy(net.state_dict()))
                if progress is not None:
                    progress(point)
            elif progress is not None and time.perf_counter() - last_report > 0.5:
                last_report = time.perf_counter()
                progress(_curve_point(frames, None, collector.episode_log, losses, start_wall))
    finally:
        if paused:
            collector.resume()
        collector.shutdown(timeout=60)
    result.train_seconds = time.perf_counter() - start_wall
    result.frames, result.updates = replay.write_count, learner.updates
    result.episodes = list(collector.episode_log)
    final_seed = 999_000 + config.seed
    result.last_returns = _evaluate(config, net, config.eval_episodes, final_seed).tolist()
    if config.keep_best and best[2] is not None:
        net.load_state_dict(best[2])
        result.kept_frames, result.kept_eval_return = int(best[1]), float(best[0])
        result.final_returns = _evaluate(config, net, config.eval_episodes, final_seed).tolist()
    else:
        result.final_returns = result.last_returns
    result.wall_seconds = time.perf_counter() - start_wall
    result.cpu_seconds = time.process_time() - start_cpu
    return result


def _curve_point(
    frames: int,
    returns: np.ndarray | None,
    episodes: list[tuple[int, float]],
    losses: list[float],
    start: float,
) -> dict[str, float]:
    recent = [r for _, r in episodes[-20:]]
    point = {
        "frames": float(frames),
        "seconds": time.perf_counter() - start,
        "episodes": float(len(episodes)),
        "recent_return": float(np.mean(recent)) if recent else float("nan"),
        "loss": float(np.mean(losses[-100:])) if losses else float("nan"),
    }
    if returns is not None:
        point["eval_return"] = float(returns.mean())
    return point
