"""Recurrent PPO on velocity-masked CartPole, built from splice's public parts.

One file, read top to bottom:

* **Collection**: :class:`splice.Collector` steps ``num_envs`` vectorised masked-CartPole envs
  with a stochastic recurrent policy (:class:`RecurrentActorCritic`, a GRU by default, behind
  :class:`PPOPolicy`). The collector carries the recurrent state from step to step, zeroes it
  at episode starts and stores the state entering every step (and the one leaving it) in
  each ``[B, T]`` chunk.
* **Targets**: :func:`splice.targets.gae` on the chunk as it comes (:func:`add_advantages`).
  ``V(s_t)`` and ``V(s'_t)`` are one recurrent step each from the *stored* states, for all
  ``B * T`` steps in one batched call (no sequential pass): episodes that ended by the time
  limit bootstrap from their true final observation, episodes cut at the chunk's edge from
  the observation they continue from, terminated ones not at all.
* **Sequences** (:func:`training_sequences`): :func:`splice.split_trajectories` regroups the
  chunk into trajectory fragments, and each fragment is cut into sequences of ``seq_len``
  steps (its last one shorter) that start from the state stored at their first step. No
  sequence crosses an episode boundary, no state is recomputed, and the padding is decided
  once per chunk, only at the tail of each fragment — never per minibatch.
* **Update** (:func:`ppo_loss`): PPO's clipped surrogate, value regression on the GAE
  targets, entropy bonus; ``epochs`` passes over the chunk in shuffled minibatches of whole
  sequences, each run from its stored initial state in one recurrent call.

Observations are normalised by running statistics (:class:`RunningNorm`) and rewards scaled
by ``reward_scale`` for the targets. Evaluation is greedy (argmax), on 20 held-out episodes
(:func:`splice.examples.masked_cartpole.greedy_returns`).

Examples:
    A (very) short run, to show the moving parts:

    >>> from splice.examples.ppo import PPOConfig, train
    >>> result = train(PPOConfig(total_frames=2_048, eval_every=1_024, eval_episodes=2,
    ...                          eval_every_episodes=2, seed=0))
    >>> result.updates > 0, len(result.curve) >= 1, len(result.final_returns)
    (True, True, 2)
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
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import Tensor, nn

from splice import Collector, split_trajectories, targets
from splice.examples.masked_cartpole import KEPT, greedy_returns, make_masked_cartpole
from splice.examples.r2d2 import TrainResult
from splice.layout import ACTION, MASK, NEXT, NEXT_OBSERVATION, OBSERVATION

__all__ = [
    "LOG_PROB_KEY",
    "STATE_KEY",
    "PPOConfig",
    "PPOPolicy",
    "PPOResult",
    "RecurrentActorCritic",
    "RunningNorm",
    "add_advantages",
    "evaluate",
    "ppo_loss",
    "train",
    "training_sequences",
]

#: Where the policy keeps its recurrent state (``[B, state_dim]``).
STATE_KEY = "recurrent_state"
#: The log-probability of the action taken, written by the policy (TorchRL's name).
LOG_PROB_KEY = "sample_log_prob"
N_ACTIONS = 2
#: What the update reads from a chunk (the rest is not regrouped into sequences).
TRAINING_KEYS = (OBSERVATION, ACTION, LOG_PROB_KEY, STATE_KEY, "advantage", "value_target",
                 ("collector", "traj_ids"))  # fmt: skip


@dataclass
class PPOConfig:
    """Every knob of a training run (defaults: the recipe that solves the task).

    Attributes:
        seed: seeds the envs, the policy's sampling, the network and the minibatch shuffles.
        total_frames: environment steps to collect.
        time_limit: stop training after this many seconds even if frames remain.
        num_envs: vectorised envs collecting in parallel.
        steps_per_batch: chunk length ``T`` (chunks are ``[num_envs, T]``).
        hidden: width of the encoder and of the recurrent cell.
        cell: ``"gru"`` or ``"lstm"``.
        seq_len: longest training sequence (trajectory fragments are cut to this length).
        epochs: passes over each chunk.
        minibatches: minibatches per pass.
        gamma: discount.
        gae_lambda: GAE's lambda.
        lr: Adam learning rate (annealed linearly to 0 over ``total_frames`` if
            ``anneal_lr``).
        anneal_lr: anneal the learning rate.
        clip: PPO's ratio clip (annealed like the learning rate if ``anneal_clip``).
        anneal_clip: anneal the clip range.
        ent_coef: entropy bonus.
        reward_scale: rewards are multiplied by this for the targets, so that values stay
            near 1 and the value loss does not swamp the policy's gradient in the shared
            recurrent core.
        vf_coef: weight of the value loss.
        max_grad_norm: gradient-norm clip.
        normalize_obs: normalise observations by their running mean and variance (updated
            after each chunk's update, so a chunk is collected and trained on with the same
            statistics).
        eval_every: frames between periodic greedy evaluations (the learning curve).
        eval_every_episodes: episodes per periodic evaluation.
        eval_episodes: episodes of the final evaluation (on seeds not used before).
        keep_best: evaluate the final policy from the checkpoint with the best periodic
            evaluation (model selection on held-out episodes), rather than the last weights.
        stop_after_solved: stop once this many periodic evaluations in a row reach a mean of
            500 (the maximum); 0: never stop early.
        threads: torch intra-op threads (1 is fastest for these small networks).
    """

    seed: int = 0
    total_frames: int = 300_000
    time_limit: float = 280.0
    num_envs: int = 32
    steps_per_batch: int = 64
    hidden: int = 64
    cell: str = "gru"
    seq_len: int = 8
    epochs: int = 4
    minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 2e-3
    anneal_lr: bool = True
    clip: float = 0.2
    anneal_clip: bool = True
    ent_coef: float = 0.01
    reward_scale: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_obs: bool = True
    eval_every: int = 5_000
    eval_every_episodes: int = 20
    eval_episodes: int = 20
    keep_best: bool = True
    stop_after_solved: int = 0
    threads: int = 1

    #: The name ``splice train`` shows for this agent.
    agent: str = "ppo"

    def __post_init__(self) -> None:
        for name in (
            "total_frames",
            "num_envs",
            "steps_per_batch",
            "hidden",
            "seq_len",
            "epochs",
            "minibatches",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PPOResult(TrainResult):
    """:class:`~splice.examples.r2d2.TrainResult`, plus where the time went.

    Attributes:
        collect_seconds: time spent collecting (the collector's iteration).
        update_seconds: time spent on targets, sequences and gradient steps.
        eval_seconds: time spent in the periodic evaluations (part of ``train_seconds``).
        train_cpu_seconds: process CPU time of the training loop, evaluations excluded.
        padding_fraction: share of the training sequences' positions that were padding
            (fragment tails shorter than ``seq_len``).
    """

    collect_seconds: float = 0.0
    update_seconds: float = 0.0
    eval_seconds: float = 0.0
    train_cpu_seconds: float = 0.0
    padding_fraction: float = 0.0


class RunningNorm(nn.Module):
    """Normalise inputs by a running mean and variance (updated only by :meth:`update`).

    Examples:
        >>> norm = RunningNorm(2)
        >>> norm.update(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
        >>> norm(torch.tensor([[3.0, 30.0]])).round(decimals=2)  # one std above the mean
        tensor([[1., 1.]])
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold the rows of ``x [N, dim]`` into the statistics (Chan et al.'s merge)."""
        n = x.shape[0]
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.var.copy_(
            (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        )
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-self.clip, self.clip)


class RecurrentActorCritic(nn.Module):
    """Observation normaliser, Linear+tanh encoder, a GRU (or LSTM), and linear actor
    (logits) and critic (value) heads on the recurrent output.

    An LSTM's ``(h, c)`` travel as one ``[N, 2 * hidden]`` tensor so that the collector stores
    a single state key. :meth:`forward` runs ``[N, L]`` sequences, :meth:`act` one step of the
    actor (what the collector calls).

    Examples:
        >>> net = RecurrentActorCritic(obs_dim=2, n_actions=2, hidden=8)
        >>> logits, value, state = net(torch.zeros(3, 5, 2), net.initial_state(3))
        >>> logits.shape, value.shape, state.shape
        (torch.Size([3, 5, 2]), torch.Size([3, 5]), torch.Size([3, 8]))
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, cell: str = "gru"):
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"cell must be 'lstm' or 'gru', got {cell!r}")
        self.hidden = hidden
        self.state_dim = 2 * hidden if cell == "lstm" else hidden
        self.obs_norm = RunningNorm(obs_dim)
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.rnn: nn.LSTM | nn.GRU = (nn.LSTM if cell == "lstm" else nn.GRU)(
            hidden, hidden, batch_first=True
        )
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.actor.weight, gain=0.01)
        nn.init.zeros_(self.actor.bias)

    def initial_state(self, batch: int) -> Tensor:
        return torch.zeros(batch, self.state_dim)

    def _recur(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        if isinstance(self.rnn, nn.LSTM):
            h, c = state[:, : self.hidden], state[:, self.hidden :]
            y, (h, c) = self.rnn(x, (h[None].contiguous(), c[None].contiguous()))
            return y, torch.cat([h[0], c[0]], -1)
        y, h = self.rnn(x, state[None])
        return y, h[0]

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``obs [N, L, obs_dim]``, ``state [N, state_dim]`` -> logits ``[N, L, A]``,
        values ``[N, L]`` and the state after the last step."""
        y, state = self._recur(self.encoder(self.obs_norm(obs)), state)
        return self.actor(y), self.critic(y).squeeze(-1), state

    def act(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step of the actor: ``obs [N, obs_dim]`` -> logits ``[N, A]`` and the state."""
        y, state = self._recur(self.encoder(self.obs_norm(obs))[:, None], state)
        return self.actor(y[:, 0]), state


class PPOPolicy(nn.Module):
    """Collect with ``net``: sample an action from its logits, record its log-probability.

    Follows splice's collector protocol: reads ``"observation"`` and the state entering the
    step (absent on the very first call: zeros), writes ``"action"``,
    :data:`LOG_PROB_KEY` and the new state under ``("next", STATE_KEY)``. Samples (Gumbel-max)
    come from the policy's own generator.

    Examples:
        >>> from tensordict import TensorDict
        >>> policy = PPOPolicy(RecurrentActorCritic(2, 2, hidden=8), seed=0)
        >>> td = policy(TensorDict({"observation": torch.zeros(4, 2)}, batch_size=[4]))
        >>> td["action"].shape, td["sample_log_prob"].shape, td["next", "recurrent_state"].shape
        (torch.Size([4]), torch.Size([4]), torch.Size([4, 8]))
    """

    def __init__(self, net: RecurrentActorCritic, *, seed: int = 0) -> None:
        super().__init__()
        self.net = net
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td[OBSERVATION]
        state = td.get(STATE_KEY, None)
        if state is None:
            state = self.net.initial_state(obs.shape[0])
        logits, new_state = self.net.act(obs, state)
        log_probs = F.log_softmax(logits, -1)
        noise = torch.rand(log_probs.shape, generator=self.generator)
        action = (log_probs - (-noise.log()).log()).argmax(-1, keepdim=True)
        td[ACTION] = action.squeeze(-1)
        td[LOG_PROB_KEY] = log_probs.gather(-1, action).squeeze(-1)
        td[NEXT, STATE_KEY] = new_state
        return td


@torch.no_grad()
def evaluate(net: RecurrentActorCritic, episodes: int, seed: int) -> np.ndarray:
    """Greedy returns of ``episodes`` episodes (``masked_cartpole.greedy_returns``).

    Examples:
        >>> evaluate(RecurrentActorCritic(2, 2, hidden=8), episodes=3, seed=0).shape
        (3,)
    """
    state = net.initial_state(episodes)

    def act(obs: np.ndarray) -> np.ndarray:
        nonlocal state
        logits, state = net.act(torch.from_numpy(obs), state)
        return logits.argmax(-1).numpy()

    return greedy_returns(act, episodes, seed)


@torch.no_grad()
def add_advantages(net: RecurrentActorCritic, batch: TensorDictBase, config: PPOConfig) -> None:
    """Write GAE's ``"advantage"`` and ``"value_target"`` into a ``[B, T]`` chunk.

    ``V(observation)`` and ``V(("next", "observation"))`` are one recurrent step from the
    states the collector stored (entering and leaving each step), all steps in one call.
    The critic predicts returns of rewards scaled by ``config.reward_scale``; GAE being
    linear in rewards and values, the targets are computed on the batch's own rewards with
    the values unscaled, then scaled back.
    """
    obs = torch.cat([batch[OBSERVATION], batch[NEXT_OBSERVATION]]).flatten(0, 1)
    state = torch.cat([batch[STATE_KEY], batch[NEXT, STATE_KEY]]).flatten(0, 1)
    _, values, _ = net(obs[:, None], state)
    value, next_value = values.view(2, *batch.batch_size).unbind(0)
    scale = config.reward_scale
    advantage, value_target = targets.gae(
        batch, value / scale, next_value / scale, gamma=config.gamma, lmbda=config.gae_lambda
    )
    batch["advantage"], batch["value_target"] = advantage * scale, value_target * scale


def training_sequences(batch: TensorDictBase, seq_len: int) -> TensorDictBase:
    """``[N, seq_len]`` sequences cut from the chunk's trajectory fragments, left-aligned.

    Each fragment (:func:`splice.split_trajectories`) is cut into pieces of ``seq_len``
    steps (the last one shorter); a piece never crosses an episode boundary, and its first
    step holds the state the policy had there (stored by the collector).

    Examples:
        >>> from splice.testing import synthetic_rollout
        >>> chunk = synthetic_rollout(n_env=2, n_steps=10, mean_len=4.0, seed=0)
        >>> seqs = training_sequences(chunk, seq_len=3)
        >>> int(seqs["collector", "mask"].sum())  # every step exactly once
        20
        >>> bool(seqs["collector", "mask"][:, 0].all())  # every sequence starts with a real step
        True
    """
    rows = split_trajectories(batch)  # [n_fragments, longest], with a mask
    n, longest = rows.batch_size
    pieces = -(-longest // seq_len)
    width = pieces * seq_len
    if width > longest:
        rows = torch.cat([rows, rows[:, -1:].expand(n, width - longest).clone().zero_()], 1)
    cut = rows.reshape(n * pieces, seq_len)
    return cut[cut[MASK][:, 0]]


def ppo_loss(
    net: RecurrentActorCritic, seqs: dict[Any, Tensor], config: PPOConfig, clip: float
) -> tuple[Tensor, dict[str, float]]:
    """PPO's loss on ``[N, seq_len]`` sequences run from their stored initial states
    (``seqs[STATE_KEY]``: ``[N, state_dim]``); padding (``seqs[MASK]`` False) is left out."""
    logits, value, _ = net(seqs[OBSERVATION], seqs[STATE_KEY])
    mask = seqs[MASK]
    log_probs = F.log_softmax(logits[mask], -1)
    log_prob = log_probs.gather(-1, seqs[ACTION][mask][:, None]).squeeze(-1)
    advantage = seqs["advantage"][mask].squeeze(-1)
    advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    ratio = (log_prob - seqs[LOG_PROB_KEY][mask]).exp()
    surrogate = torch.min(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    policy_loss = -surrogate.mean()
    value_loss = F.mse_loss(value[mask], seqs["value_target"][mask].squeeze(-1))
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {
        "policy_loss": float(policy_loss.detach()),
        "value_loss": float(value_loss.detach()),
        "entropy": float(entropy.detach()),
    }


Progress = Callable[[dict[str, float]], None]


def train(config: PPOConfig, *, progress: Progress | None = None) -> PPOResult:
    """Train recurrent PPO on velocity-masked CartPole; evaluate it greedily at the end.

    Args:
        config: the run's settings.
        progress: called after every chunk with ``frames``, ``episodes``, ``recent_return``
            (mean of the last 20 training episodes), ``loss`` and, after an evaluation,
            ``eval_return``.

    The learning curve (``result.curve``) has one point per periodic evaluation, with
    ``train_seconds`` and ``train_cpu_seconds``: wall and process CPU time so far, the
    evaluations' own time left out, and ``load_1min``, the machine's load average.
    """
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    shuffle = torch.Generator().manual_seed(config.seed)
    net = RecurrentActorCritic(len(KEPT), N_ACTIONS, config.hidden, config.cell)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr, eps=1e-5)
    collector = Collector(
        make_masked_cartpole(config.num_envs),
        PPOPolicy(net, seed=config.seed),
        frames_per_batch=config.num_envs * config.steps_per_batch,
        total_frames=config.total_frames,
        seed=config.seed,
        track_episodes=True,
    )
    result = PPOResult(config=asdict(config))
    best: tuple[float, int, dict[str, Tensor] | None] = (-np.inf, 0, None)
    losses: list[float] = []
    next_eval, solved_in_a_row = config.eval_every, 0
    eval_seconds = eval_cpu = 0.0  # the evaluations' own wall and CPU time
    frames = padded = positions = 0
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
            if config.anneal_lr:
                for group in optimizer.param_groups:
                    group["lr"] = config.lr * remaining
            clip = config.clip * remaining if config.anneal_clip else config.clip
            add_advantages(net, batch, config)
            seqs = training_sequences(batch.select(*TRAINING_KEYS), config.seq_len)
            columns = {key: seqs.get(key) for key in (*TRAINING_KEYS[:-1], MASK)}
            padded += int((~columns[MASK]).sum())
            positions += columns[MASK].numel()
            columns[STATE_KEY] = columns[STATE_KEY][:, 0]  # stored state entering each sequence
            for _ in range(config.epochs):
                order = torch.randperm(seqs.batch_size[0], generator=shuffle)
                for part in order.chunk(config.minibatches):
                    minibatch = {key: x[part] for key, x in columns.items()}
                    loss, _ = ppo_loss(net, minibatch, config, clip)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm)
                    optimizer.step()
                    losses.append(float(loss.detach()))
                    result.updates += 1
            if config.normalize_obs:  # after the update: this chunk used one set of statistics
                net.obs_norm.update(batch[OBSERVATION].flatten(0, 1))
            result.update_seconds += time.perf_counter() - t1
            point = _curve_point(frames, collector.episode_log, losses, start_wall, eval_seconds)
            if frames >= next_eval:
                next_eval += config.eval_every
                t2, c2 = time.perf_counter(), time.process_time()
                returns = evaluate(net, config.eval_every_episodes, seed=10_000 + len(result.curve))
                point["eval_return"] = float(returns.mean())
                point["load_1min"] = os.getloadavg()[0]
                point["train_cpu_seconds"] = c2 - start_cpu - eval_cpu
                if point["eval_return"] >= best[0]:
                    best = (point["eval_return"], frames, copy.deepcopy(net.state_dict()))
                result.curve.append(point)
                eval_seconds += time.perf_counter() - t2
                eval_cpu += time.process_time() - c2
                solved_in_a_row = solved_in_a_row + 1 if point["eval_return"] >= 500 else 0
            if progress is not None:
                progress(point)
            out_of_time = time.perf_counter() - start_wall > config.time_limit
            solved = 0 < config.stop_after_solved <= solved_in_a_row
            if out_of_time or solved:
                break
    finally:
        collector.shutdown()
    result.train_seconds = time.perf_counter() - start_wall
    result.eval_seconds = eval_seconds
    result.padding_fraction = padded / max(1, positions)
    result.train_cpu_seconds = time.process_time() - start_cpu - eval_cpu
    result.frames = frames
    result.episodes = list(collector.episode_log)
    final_seed = 999_000 + config.seed
    result.last_returns = evaluate(net, config.eval_episodes, seed=final_seed).tolist()
    if config.keep_best and best[2] is not None:
        net.load_state_dict(best[2])
        result.kept_frames, result.kept_eval_return = int(best[1]), float(best[0])
        result.final_returns = evaluate(net, config.eval_episodes, seed=final_seed).tolist()
    else:
        result.final_returns = result.last_returns
    result.wall_seconds = time.perf_counter() - start_wall
    result.cpu_seconds = time.process_time() - start_cpu
    return result


def _curve_point(
    frames: int,
    episodes: list[tuple[int, float]],
    losses: list[float],
    start: float,
    eval_seconds: float,
) -> dict[str, Any]:
    recent = [r for _, r in episodes[-20:]]
    now = time.perf_counter() - start
    return {
        "frames": float(frames),
        "seconds": now,
        "train_seconds": now - eval_seconds,
        "episodes": float(len(episodes)),
        "recent_return": float(np.mean(recent)) if recent else float("nan"),
        "loss": float(np.mean(losses[-100:])) if losses else float("nan"),
    }
