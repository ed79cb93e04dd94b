"""Recurrent state: discovered from the first call, carried, zeroed at is_init, stored."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict

from splice import Collector, TrajectoryIds
from splice.collectors.rollout import RolloutLoop
from splice.envs import make_adapter
from splice.testing import counting_vec


class GRUPolicy(torch.nn.Module):
    def __init__(self, obs_dim: int = 3, hidden: int = 5) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(obs_dim, hidden)
        self.head = torch.nn.Linear(hidden, 2)
        self.hidden = hidden

    def forward(self, td):
        h = td.get("h", None)
        if h is None:
            h = torch.zeros(*td.batch_size, self.hidden)
        h = self.cell(td["observation"] / 10, h)
        td["action"] = self.head(h).argmax(-1)
        td["logits"] = self.head(h)
        td["next", "h"] = h
        return td


def _by_hand(policy, batch):
    """Run the policy step by step over a [B, T] batch: zero state at is_init, else carry."""
    b, t = batch.shape
    h = None
    hs, nhs, actions = [], [], []
    for i in range(t):
        step = TensorDict({"observation": batch["observation"][:, i]}, batch_size=[b])
        init = batch["is_init"][:, i]
        if h is not None:
            step["h"] = torch.where(init, torch.zeros_like(h), h)
        out = policy(step)
        hs.append(step.get("h", torch.zeros(b, policy.hidden)))
        nhs.append(out["next", "h"])
        actions.append(out["action"])
        h = out["next", "h"]
    return torch.stack(hs, 1), torch.stack(nhs, 1), torch.stack(actions, 1)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_state_carried_and_zeroed_like_by_hand(mode):
    policy = GRUPolicy()
    # length-1 episodes: NEXT_STEP needs twice the columns, so staging grows mid-batch
    adapter = make_adapter(counting_vec([1, 5, 8], mode))
    loop = RolloutLoop(adapter, policy, steps=10, ids=TrajectoryIds())
    batches = [loop.collect() for _ in range(4)]
    loop.close()
    if mode == AutoresetMode.NEXT_STEP:
        assert loop.staging.capacity > 2 * 10  # the staging did grow (T = 10)
    data = torch.cat(batches, 1)
    with torch.no_grad():
        h_in, h_out, actions = _by_hand(policy, data)
    assert torch.allclose(data["h"], h_in, atol=1e-6)
    assert torch.allclose(data["next", "h"], h_out, atol=1e-6)
    assert torch.equal(data["action"], actions)
    init = data["is_init"].squeeze(-1)
    assert bool((data["h"][init] == 0).all())
    assert bool((data["h"][~init].abs().sum(-1) > 0).all())  # carried elsewhere, never reset
    # the state entering a step is the state the previous step produced, inside an episode
    assert torch.equal(data["h"][:, 1:][~init[:, 1:]], data["next", "h"][:, :-1][~init[:, 1:]])
    assert "logits" in data


def test_state_on_single_env():
    policy = GRUPolicy(obs_dim=4)
    c = Collector(gym.make("CartPole-v1"), policy, frames_per_batch=50, total_frames=100, seed=0)
    data = torch.cat(list(c))
    c.shutdown()
    init = data["is_init"].squeeze(-1)
    assert data["h"].shape == (100, 5)
    assert bool((data["h"][init] == 0).all())
    assert torch.equal(data["h"][1:][~init[1:]], data["next", "h"][:-1][~init[1:]])


def test_torchrl_gru_module_needs_no_primer():
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import GRUModule

    gru = GRUModule(input_size=3, hidden_size=4, in_key="observation", out_key="features")
    head = TensorDictModule(lambda x: x.argmax(-1) % 2, in_keys=["features"], out_keys=["action"])
    policy = TensorDictSequential(gru, head)
    c = Collector(counting_vec([4, 6]), policy, frames_per_batch=20, total_frames=60)
    data = torch.cat(list(c), 1)
    c.shutdown()
    key = "recurrent_state"
    assert key in data and ("next", key) in data.keys(True)
    init = data["is_init"].squeeze(-1)
    assert bool((data[key][init] == 0).all())
    assert bool((data[key][~init].abs().sum((-1, -2)) > 0).all())
    assert torch.equal(data[key][:, 1:][~init[:, 1:]], data["next", key][:, :-1][~init[:, 1:]])
