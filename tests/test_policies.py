"""Policies as users write them (:func:`splice.policies.as_policy`): plain modules, Q-values and
logits, Dict observations, TensorDictModules, functions, recurrent modules; action casts."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule

from splice import Collector, PolicyError
from splice.policies import ModulePolicy, RandomPolicy, as_policy
from splice.testing import CountingEnv

VEC = {"num_envs": 3, "env_kwargs": {"vectorization_mode": "sync"}}


@pytest.fixture(autouse=True)
def _one_thread():
    """Small recurrent modules on a loaded 2-core machine: one intra-op thread (10x faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def one_batch(env: Any, policy: Any, frames: int = 60, **kw: Any) -> TensorDictBase:
    with Collector(env, policy, frames_per_batch=frames, total_frames=frames, seed=0, **kw) as c:
        (batch,) = list(c)
    return batch


@pytest.mark.parametrize("vec", [{}, VEC])
def test_plain_linear_module_on_pendulum(vec: dict[str, Any]) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    batch = one_batch("Pendulum-v1", net, **vec)
    with torch.no_grad():
        expected = net(batch["observation"])
    assert batch["action"].dtype == torch.float32
    assert torch.allclose(batch["action"], expected, atol=1e-6)


@pytest.mark.parametrize("vec", [{}, VEC])
def test_q_values_greedy(vec: dict[str, Any]) -> None:
    net = torch.nn.Linear(4, 2)
    batch = one_batch("CartPole-v1", as_policy(net, output="greedy"), **vec)
    assert torch.equal(batch["action"], batch["action_value"].argmax(-1))
    with torch.no_grad():
        assert torch.allclose(batch["action_value"], net(batch["observation"]), atol=1e-6)


def test_logits_sample_follows_torch_rng() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh())
    policy = as_policy(net, output="sample")
    torch.manual_seed(1)
    a = one_batch("CartPole-v1", policy, frames=300, **VEC)
    torch.manual_seed(1)
    b = one_batch("CartPole-v1", policy, frames=300, **VEC)
    assert (a.exclude("collector") == b.exclude("collector")).all()  # torch's global RNG
    logp = a["logits"].log_softmax(-1).gather(-1, a["action"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(a["action_log_prob"], logp)
    assert 0 < a["action"].float().mean() < 1  # sampled, not greedy


def test_logits_without_a_choice_get_a_hint() -> None:
    with pytest.raises(PolicyError, match=r"scores per action.*output='greedy'.*'sample'"):
        one_batch("CartPole-v1", torch.nn.Linear(4, 2))


class DictObsEnv(CountingEnv):
    def __init__(self) -> None:
        super().__init__(4)
        self.observation_space = spaces.Dict(
            pos=spaces.Box(-np.inf, np.inf, (3,), np.float32), flag=spaces.Discrete(2)
        )

    def _obs(self) -> Any:
        return {"pos": super()._obs(), "flag": self.t % 2}


def test_dict_observation_module_with_in_keys() -> None:
    class Net(torch.nn.Module):
        def forward(self, pos: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
            return (pos[:, 1] + flag).long() % 2

    policy = as_policy(Net(), in_keys=[("observation", "pos"), ("observation", "flag")])
    batch = one_batch(DictObsEnv(), policy, frames=12)
    expected = (batch["observation", "pos"][:, 1] + batch["observation", "flag"]).long() % 2
    assert torch.equal(batch["action"], expected)
    with pytest.raises(PolicyError, match=r"'observation'.* is not a tensor.*in_keys"):
        one_batch(DictObsEnv(), torch.nn.Identity(), frames=4)
    with pytest.raises(PolicyError, match=r"policy input \('nope',\) is not in the step"):
        one_batch(DictObsEnv(), as_policy(Net(), in_keys=["nope"]), frames=4)


def test_info_entry_as_module_input() -> None:
    def act(obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mask.float().argmax(-1)

    batch = one_batch(
        gym.make("Taxi-v4"), as_policy(act, in_keys=["observation", "action_mask"]),
        info_keys=["action_mask"],
    )  # fmt: skip
    assert torch.equal(batch["action"], batch["action_mask"].float().argmax(-1))


def test_tensordict_module_and_functions() -> None:
    module = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    assert as_policy(module) is module
    batch = one_batch("Pendulum-v1", module)
    assert batch["action"].shape == (60, 1)

    def td_policy(td):
        td["action"] = td["observation"][..., :1] * 0
        return td

    def annotated(data: TensorDictBase) -> TensorDictBase:
        return td_policy(data)

    assert as_policy(td_policy) is td_policy and as_policy(annotated) is annotated
    assert as_policy(lambda td: td) is not None
    random = RandomPolicy(spaces.Box(-2, 2, (1,), np.float32), seed=0)
    assert as_policy(random) is random

    def obs_to_action(obs):  # a plain function on tensors
        return obs[..., :1] * 0

    batch = one_batch("Pendulum-v1", obs_to_action)
    assert bool((batch["action"] == 0).all())


def test_anything_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"policy must be one of: a tensordict.nn.TensorDictModule"):
        Collector("CartPole-v1", "greedy", frames_per_batch=4)
    with pytest.raises(TypeError, match="policy must be one of"):
        Collector("CartPole-v1", 3, frames_per_batch=4)
    module = TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["action"])
    with pytest.raises(ValueError, match="declares its own keys"):
        as_policy(module, output="greedy")
    with pytest.raises(ValueError, match="output must be"):
        as_policy(torch.nn.Linear(4, 2), output="argmax")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="in_keys must be a non-empty list"):
        as_policy(torch.nn.Linear(4, 2), in_keys="observation")


class GRUNet(torch.nn.Module):
    """nn.GRU-based: the documented convention, state in torch's RNN layout."""

    def __init__(self, hidden: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(4, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, 2)

    def forward(self, obs: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        out, state = self.rnn(obs.unsqueeze(1), state)
        return self.head(out[:, 0]), state


class LSTMNet(GRUNet):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 8, num_layers=2, batch_first=True)


@pytest.mark.parametrize("net_cls", [GRUNet, LSTMNet])
@pytest.mark.parametrize("vec", [{}, VEC])
def test_recurrent_modules(net_cls: type, vec: dict[str, Any]) -> None:
    torch.manual_seed(0)
    net = net_cls()
    batch = one_batch("CartPole-v1", as_policy(net, output="greedy"), frames=150, **vec)
    if not vec:
        batch = batch.unsqueeze(0)
    keys = (
        [("recurrent_state",)]
        if net_cls is GRUNet
        else [("recurrent_state", "0"), ("recurrent_state", "1")]
    )
    init = batch["is_init"].squeeze(-1)
    for key in keys:
        entering, produced = batch[key], batch[("next", *key)]
        assert entering.shape == (*batch.shape, 2, 8)  # batch-first: [..., num_layers, hidden]
        assert bool((entering[init] == 0).all())
        carried = ~init[:, 1:]
        assert torch.equal(produced[:, :-1][carried], entering[:, 1:][carried])
    # A hand run of the module over each episode gives the same actions.
    with torch.no_grad():
        for row in range(batch.shape[0]):
            state = None
            for t in range(batch.shape[1]):
                if init[row, t]:
                    state = None
                scores, state = net(batch["observation"][row, t : t + 1], state)
                assert int(scores.argmax(-1)) == int(batch["action"][row, t])


def test_recurrent_state_in_another_layout_is_refused() -> None:
    class CellNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.GRUCell(4, 5)
            self.head = torch.nn.Linear(5, 2)

        def forward(self, obs, state=None):
            h = self.cell(obs, state)
            return self.head(h), h  # [B, hidden]: not torch's RNN layout

    with pytest.raises(PolicyError, match=r"torch's RNN layout \[num_layers, B, hidden\]"):
        one_batch("CartPole-v1", as_policy(CellNet(), output="greedy"), **VEC)


@pytest.mark.parametrize(
    ("env", "dtype", "stored"),
    [
        ("Pendulum-v1", np.float64, torch.float32),
        ("CartPole-v1", np.int32, torch.int64),
        ("CartPole-v1", np.uint8, torch.int64),
    ],
)
def test_actions_cast_to_the_space_dtype(env: str, dtype: Any, stored: torch.dtype) -> None:
    def act(obs):
        shape = obs.shape[:1] + ((1,) if env == "Pendulum-v1" else ())
        return np.ones(shape, dtype)  # numpy output, another dtype

    batch = one_batch(env, act, frames=10, **VEC)
    assert batch["action"].dtype == stored and bool((batch["action"] == 1).all())


def test_lossy_action_casts_name_the_output() -> None:
    def float_action(obs):
        return torch.full(obs.shape[:1], 0.5)

    with pytest.raises(
        PolicyError,
        match=r"policy output 'action' has dtype torch.float32 and shape \[3\]; the action space "
        r"Discrete\(2\) needs shape \[3\] and an integer dtype",
    ):
        one_batch("CartPole-v1", float_action, frames=6, **VEC)

    def wrong_shape(obs):
        return torch.zeros(obs.shape[0], 2)

    with pytest.raises(PolicyError, match=r"shape \[3, 2\].*Box.*needs shape \[3, 1\]"):
        one_batch("Pendulum-v1", wrong_shape, frames=6, **VEC)


def test_weights_of_a_wrapped_module_are_the_collectors() -> None:
    net = torch.nn.Linear(4, 2)
    c = Collector("CartPole-v1", as_policy(net, output="greedy"), frames_per_batch=4)
    other = torch.nn.Linear(4, 2)
    c.update_policy_weights_(other)
    assert torch.equal(net.weight, other.weight)
    assert set(c.state_dict()["policy"]) == {"weight", "bias"}
    c.shutdown()


def test_module_policy_outside_a_collector() -> None:
    policy = ModulePolicy(torch.nn.Linear(4, 2), output="greedy")
    td = policy(TensorDict({"observation": torch.ones(4)}, []))  # a single env: no batch dim
    assert td["action"].shape == () and td["action_value"].shape == (2,)
