"""Q-networks for the recurrent DQN, and the epsilon-greedy policy that collects with them.

Both networks share one interface, so the learner does not care which it trains::

    q, state = net(obs, state)   # obs [S, L, obs_dim], state [S, state_dim] -> q [S, L, A]

The policy follows splice's collector protocol: it reads ``"observation"`` and the recurrent
state entering the step (absent on the very first call), writes ``"action"`` and the state
it produced under ``("next", STATE_KEY)``. The collector carries that state to the next step,
zeroes it at episode starts and stores it with every step, which is what stored-state replay
needs.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

__all__ = ["ENV_INDEX_KEY", "STATE_KEY", "EpsilonGreedy", "MLPQNet", "RecurrentQNet"]

#: Where the policy keeps its recurrent state (``[B, state_dim]``).
STATE_KEY = "recurrent_state"
#: Each step's env row, written when the policy is asked to (for naive fixed windows).
ENV_INDEX_KEY = "env_index"


class RecurrentQNet(nn.Module):
    """Linear+ReLU encoder, an LSTM (or GRU), and a 2-layer head to one Q-value per action.

    The LSTM's ``(h, c)`` travel as one ``[S, 2 * hidden]`` tensor so the collector and the
    replay buffer see a single state key.

    Examples:
        >>> net = RecurrentQNet(obs_dim=2, n_actions=2, hidden=8)
        >>> q, state = net(torch.zeros(3, 5, 2), net.initial_state(3))
        >>> q.shape, state.shape
        (torch.Size([3, 5, 2]), torch.Size([3, 16]))
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, cell: str = "lstm"):
        super().__init__()
        if cell not in ("lstm", "gru"):
            raise ValueError(f"cell must be 'lstm' or 'gru', got {cell!r}")
        self.cell, self.hidden = cell, hidden
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.rnn: nn.LSTM | nn.GRU = (nn.LSTM if cell == "lstm" else nn.GRU)(
            hidden, hidden, batch_first=True
        )
        self.head = nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions)
        )
        self.state_dim = 2 * hidden if cell == "lstm" else hidden

    def initial_state(self, batch: int) -> Tensor:
        return torch.zeros(batch, self.state_dim)

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(obs)
        if isinstance(self.rnn, nn.LSTM):
            h, c = state[:, : self.hidden], state[:, self.hidden :]
            y, (h, c) = self.rnn(x, (h[None].contiguous(), c[None].contiguous()))
            return self.head(y), torch.cat([h[0], c[0]], -1)
        y, h = self.rnn(x, state[None].contiguous())
        return self.head(y), h[0]


class MLPQNet(nn.Module):
    """A memoryless 2x``hidden`` MLP with the recurrent interface (a zero-width state).

    Examples:
        >>> net = MLPQNet(obs_dim=2, n_actions=2, hidden=8)
        >>> q, state = net(torch.zeros(3, 5, 2), net.initial_state(3))
        >>> q.shape, state.shape
        (torch.Size([3, 5, 2]), torch.Size([3, 0]))
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_actions),
        )
        self.state_dim = 0

    def initial_state(self, batch: int) -> Tensor:
        return torch.zeros(batch, 0)

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return self.net(obs), state


class EpsilonGreedy(nn.Module):
    """Collect with ``net``: greedy action, replaced by a uniform one with probability epsilon.

    ``epsilon`` is a plain attribute: the trainer lowers it as training goes on (the collector
    thread reads it at every step). Random draws come from the policy's own generator.

    Args:
        net: a :class:`RecurrentQNet` or :class:`MLPQNet`.
        n_actions: number of discrete actions.
        seed: seed of the policy's generator.
        tag_env_index: also write each step's env row under ``ENV_INDEX_KEY`` (lets a
            sampler cut naive fixed windows from each env's raw stream).

    Examples:
        >>> from tensordict import TensorDict
        >>> policy = EpsilonGreedy(RecurrentQNet(2, 2, hidden=8), n_actions=2, seed=0)
        >>> td = policy(TensorDict({"observation": torch.zeros(4, 2)}, batch_size=[4]))
        >>> td["action"].shape, td["next", "recurrent_state"].shape
        (torch.Size([4]), torch.Size([4, 16]))
    """

    def __init__(
        self,
        net: RecurrentQNet | MLPQNet,
        n_actions: int,
        *,
        seed: int = 0,
        epsilon: float = 1.0,
        tag_env_index: bool = False,
    ) -> None:
        super().__init__()
        self.net = net
        self.n_actions = n_actions
        self.epsilon = epsilon
        self.tag_env_index = tag_env_index
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td["observation"]
        batch = obs.shape[0]
        state = td.get(STATE_KEY, None)
        if state is None:
            state = self.net.initial_state(batch)
        q, new_state = self.net(obs[:, None], state)
        greedy = q[:, 0].argmax(-1)
        explore = torch.rand(batch, generator=self.generator) < self.epsilon
        uniform = torch.randint(self.n_actions, (batch,), generator=self.generator)
        td["action"] = torch.where(explore, uniform, greedy)
        if self.net.state_dim:
            td["next", STATE_KEY] = new_state
        if self.tag_env_index:
            td[ENV_INDEX_KEY] = torch.arange(batch)
        return td
