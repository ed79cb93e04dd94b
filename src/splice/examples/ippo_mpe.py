"""Independent recurrent PPO with parameter sharing on MPE ``simple_spread`` (PettingZoo).

Three agents must cover three landmarks without colliding; each sees its own velocity and
position and the others' and the landmarks' relative positions, and picks one of 5 moves.
One network (:class:`~splice.examples.ppo.RecurrentActorCritic`, a GRU) is shared by every
agent, each with its own recurrent state and its own trajectory: the collector's rows are
agent slots (:mod:`splice.envs.pettingzoo`), so every piece of the single-agent recipe of
:mod:`splice.examples.ppo` applies unchanged per agent — GAE on the ``[S, T]`` chunk
(:func:`~splice.examples.ppo.add_advantages`; each agent's life ends truncated at the
episode's 25th step and bootstraps from its final observation), sequences that never cross
an agent's life (:func:`~splice.examples.ppo.training_sequences`), PPO's loss
(:func:`~splice.examples.ppo.ppo_loss`).

The return reported is an agent's mean episode return (the agents' rewards summed, over the
number of agents), greedy (argmax), on 50 held-out seeds. With the defaults
(``python -m splice.examples.ippo_mpe``: 750k agent steps, 16 env copies), a run on two
cores shared with other work (load 7-12) took 523 s and reached **-18.7** (the best periodic
checkpoint; its last weights -18.8), against **-25.5** for uniform random moves and **-14.8**
for a hand-written heuristic (each agent heads for "its" landmark, the larger coordinate
first) on the same seeds (:func:`reference_returns`): better than random, short of the
heuristic's fixed division of the landmarks, which independent learners do not find on this
budget.

Examples:
    A (very) short run, to show the moving parts:

    >>> from splice.examples.ippo_mpe import IPPOConfig, train
    >>> result = train(IPPOConfig(total_frames=3_000, num_envs=2, eval_every=1_500,
    ...                           eval_episodes=2, eval_every_episodes=2))
    >>> result.updates > 0, len(result.final_returns)
    (True, 2)
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from mpe2 import simple_spread_v3
from torch import Tensor, nn

from splice import Collector
from splice.envs.pettingzoo import PettingZooEnvs
from splice.examples.ppo import (
    STATE_KEY,
    TRAINING_KEYS,
    PPOConfig,
    PPOPolicy,
    PPOResult,
    RecurrentActorCritic,
    add_advantages,
    ppo_loss,
    training_sequences,
)
from splice.layout import MASK, OBSERVATION

__all__ = ["IPPOConfig", "evaluate", "make_env", "reference_returns", "train"]

OBS_DIM, N_ACTIONS, N_AGENTS, EPISODE = 18, 5, 3, 25


def make_env() -> Any:
    """MPE ``simple_spread_v3``: 3 agents, discrete moves, 25 steps per episode."""
    return simple_spread_v3.parallel_env(max_cycles=EPISODE)


@dataclass
class IPPOConfig(PPOConfig):
    """:class:`~splice.examples.ppo.PPOConfig` with this task's recipe (the fields not
    set here keep their meaning; ``stop_after_solved`` does not apply)."""

    total_frames: int = 750_000  # agent steps
    time_limit: float = 540.0
    num_envs: int = 16  # env copies (x 3 agent slots)
    steps_per_batch: int = 50  # two episodes per chunk row
    hidden: int = 64
    seq_len: int = 25
    epochs: int = 4
    minibatches: int = 4
    gamma: float = 0.95  # 25-step episodes
    lr: float = 1e-3
    ent_coef: float = 0.01
    reward_scale: float = 0.1
    normalize_obs: bool = False  # (running statistics slowed learning here)
    eval_every: int = 75_000
    eval_every_episodes: int = 20
    eval_episodes: int = 50
    agent: str = "ippo"


@torch.no_grad()
def evaluate(
    act: Callable[[str, np.ndarray, Any], int] | RecurrentActorCritic,
    episodes: int,
    seed: int,
) -> np.ndarray:
    """An agent's mean return (agents' rewards summed, over the number of agents) in each of
    ``episodes`` episodes (env seeds ``seed, seed + 1, ...``). ``act``: a network (greedy,
    one recurrent state per agent), or ``act(agent, obs, rng) -> action``.

    Examples:
        >>> evaluate(lambda agent, obs, rng: 0, episodes=2, seed=0).shape
        (2,)
    """
    returns = []
    for episode in range(episodes):
        env = make_env()
        obs, _ = env.reset(seed=seed + episode)
        rng = np.random.default_rng(seed + episode)
        state: dict[str, Tensor] = {}
        total = 0.0
        while env.agents:
            actions = {}
            for agent in env.agents:
                if isinstance(act, RecurrentActorCritic):
                    h = state.get(agent, act.initial_state(1))
                    logits, state[agent] = act.act(torch.from_numpy(obs[agent])[None], h)
                    actions[agent] = int(logits.argmax(-1))
                else:
                    actions[agent] = act(agent, obs[agent], rng)
            obs, reward, _, _, _ = env.step(actions)
            total += sum(reward.values()) / N_AGENTS
        env.close()
        returns.append(total)
    return np.array(returns)


def _heuristic(agent: str, obs: np.ndarray, rng: Any) -> int:
    """Agent ``i`` heads for landmark ``i``: the move along its larger relative coordinate
    (moves: 0 none, 1 left, 2 right, 3 down, 4 up)."""
    i = int(agent.rsplit("_", 1)[1])
    dx, dy = obs[4 + 2 * i], obs[5 + 2 * i]
    if abs(dx) > abs(dy):
        return 2 if dx > 0 else 1
    return 4 if dy > 0 else 3


def reference_returns(episodes: int = 50, seed: int = 999_000) -> dict[str, float]:
    """Mean returns of uniform random moves and of the heuristic, on the final evaluation's
    seeds.

    Examples:
        >>> sorted(reference_returns(episodes=2))
        ['heuristic', 'random']
    """
    return {
        "random": float(
            evaluate(lambda a, o, rng: int(rng.integers(N_ACTIONS)), episodes, seed).mean()
        ),
        "heuristic": float(evaluate(_heuristic, episodes, seed).mean()),
    }


def train(
    config: IPPOConfig, *, progress: Callable[[dict[str, float]], None] | None = None
) -> PPOResult:
    """Train the shared recurrent network; evaluate it greedily at the end (the best
    periodic checkpoint if ``keep_best``).

    Returns:
        A :class:`~splice.examples.ppo.PPOResult` (returns are an agent's mean episode
        return, see :func:`evaluate`).
    """
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    shuffle = torch.Generator().manual_seed(config.seed)
    net = RecurrentActorCritic(OBS_DIM, N_ACTIONS, config.hidden, config.cell)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr, eps=1e-5)
    slots = config.num_envs * N_AGENTS
    collector = Collector(
        PettingZooEnvs(make_env, config.num_envs),
        PPOPolicy(net, seed=config.seed),  # one policy for every agent: parameter sharing
        frames_per_batch=slots * config.steps_per_batch,
        total_frames=config.total_frames,
        seed=config.seed,
        track_episodes=True,
    )
    result = PPOResult(config=asdict(config))
    best: tuple[float, int, dict[str, Tensor] | None] = (-np.inf, 0, None)
    losses: list[float] = []
    next_eval, frames, eval_seconds = config.eval_every, 0, 0.0
    iterator = iter(collector)
    try:
        while True:
            t0 = time.perf_counter()
            batch = next(iterator, None)
            t1 = time.perf_counter()
            result.collect_seconds += t1 - t0
            if batch is None:
                break
            frames += batch.numel()
            remaining = max(0.0, 1.0 - (frames - batch.numel()) / config.total_frames)
            for group in optimizer.param_groups:
                group["lr"] = config.lr * (remaining if config.anneal_lr else 1.0)
            clip = config.clip * remaining if config.anneal_clip else config.clip
            add_advantages(net, batch, config)
            seqs = training_sequences(batch.select(*TRAINING_KEYS), config.seq_len)
            columns = {key: seqs.get(key) for key in (*TRAINING_KEYS[:-1], MASK)}
            columns[STATE_KEY] = columns[STATE_KEY][:, 0]  # the state entering each sequence
            for _ in range(config.epochs):
                order = torch.randperm(seqs.batch_size[0], generator=shuffle)
                for part in order.chunk(config.minibatches):
                    loss, _ = ppo_loss(net, {k: x[part] for k, x in columns.items()}, config, clip)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm)
                    optimizer.step()
                    losses.append(float(loss.detach()))
                    result.updates += 1
            if config.normalize_obs:
                net.obs_norm.update(batch[OBSERVATION].flatten(0, 1))
            result.update_seconds += time.perf_counter() - t1
            recent = [r for _, r in collector.episode_log[-60:]]
            point: dict[str, float] = {
                "frames": float(frames),
                "seconds": time.perf_counter() - start_wall,
                "recent_return": float(np.mean(recent)) if recent else float("nan"),
                "loss": float(np.mean(losses[-100:])),
            }
            if frames >= next_eval:
                next_eval += config.eval_every
                t2 = time.perf_counter()
                seed = 10_000 + 100 * len(result.curve)
                point["eval_return"] = float(evaluate(net, config.eval_every_episodes, seed).mean())
                point["load_1min"] = os.getloadavg()[0]
                if point["eval_return"] >= best[0]:
                    best = (point["eval_return"], frames, copy.deepcopy(net.state_dict()))
                result.curve.append(point)
                eval_seconds += time.perf_counter() - t2
            if progress is not None:
                progress(point)
            if time.perf_counter() - start_wall > config.time_limit:
                break
    finally:
        collector.shutdown()
    result.train_seconds = time.perf_counter() - start_wall
    result.eval_seconds = eval_seconds
    result.frames = frames
    result.episodes = list(collector.episode_log)
    final_seed = 999_000
    result.last_returns = evaluate(net, config.eval_episodes, final_seed).tolist()
    if config.keep_best and best[2] is not None:
        net.load_state_dict(best[2])
        result.kept_frames, result.kept_eval_return = int(best[1]), float(best[0])
        result.final_returns = evaluate(net, config.eval_episodes, final_seed).tolist()
    else:
        result.final_returns = result.last_returns
    result.wall_seconds = time.perf_counter() - start_wall
    result.cpu_seconds = time.process_time() - start_cpu
    return result


if __name__ == "__main__":
    config = IPPOConfig()
    print("references:", reference_returns(config.eval_episodes))

    def show(point: dict[str, float]) -> None:
        if "eval_return" in point:
            print({k: round(v, 2) for k, v in point.items()}, flush=True)

    out = train(config, progress=show)
    print(
        f"final greedy return {np.mean(out.final_returns):.2f} "
        f"(last weights {np.mean(out.last_returns):.2f}) after {out.frames} agent steps, "
        f"{out.wall_seconds:.0f} s wall, {out.cpu_seconds:.0f} s CPU"
    )
