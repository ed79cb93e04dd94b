"""GAE and TD(λ) on collector chunks: splice.targets vs a loop over time vs TorchRL 0.14.1.

Run: ``python -m benchmarks.bench_targets [--quick]``.

Data: ``[16, 2048]`` float32 chunks (``splice.testing.synthetic_rollout``: geometric episode
lengths of mean 20, 200 and 2,000 steps, a fifth of the ends truncations, the last episode of
every row cut at the chunk's edge), random rewards and values. Contenders, round-robin in one
process with one torch thread:

* **splice**: ``splice.targets.gae`` / ``td_lambda_return`` on the TensorDict (reading and
  checking the flags, ids and cut marks is part of the time);
* **loop**: the straightforward reverse loop over time, whole-tensor ops across the 16 rows,
  on precomputed TD errors and continuation flags (the work that is left once flags are read);
* **TorchRL**: ``vec_generalized_advantage_estimate`` / ``vec_td_lambda_return_estimate``
  (its vectorised versions) on the same tensors, done flags precomputed;
* **raw**: the elementwise part every GAE needs (the TD errors), a lower bound.

All contenders agree on this data (checked before timing).
"""

from __future__ import annotations

import warnings

import torch

from benchmarks._harness import interleaved, parser, ratio, table
from splice import targets
from splice.layout import DONE, REWARD, TERMINATED
from splice.testing import synthetic_rollout

warnings.filterwarnings("ignore")
try:
    from torchrl.objectives.value.functional import (
        vec_generalized_advantage_estimate,
        vec_td_lambda_return_estimate,
    )
except ImportError:  # pragma: no cover - the bench extra installs torchrl
    vec_generalized_advantage_estimate = vec_td_lambda_return_estimate = None

GAMMA, LMBDA = 0.99, 0.95


def loop_scan(b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``x_t = b_t + c_t x_{t+1}``, one time step at a time."""
    out = torch.empty_like(b)
    running = torch.zeros_like(b[:, 0])
    for t in range(b.shape[1] - 1, -1, -1):
        running = b[:, t] + c[:, t] * running
        out[:, t] = running
    return out


def case(n_env: int, n_steps: int, mean_len: float, rounds: int) -> list[list[object]]:
    batch = synthetic_rollout(n_env, n_steps, mean_len, seed=0)
    gen = torch.Generator().manual_seed(0)
    batch[REWARD] = torch.randn(n_env, n_steps, 1, generator=gen)
    value = torch.randn(n_env, n_steps, generator=gen)
    next_value = torch.randn(n_env, n_steps, generator=gen)
    reward = batch[REWARD].squeeze(-1)
    not_term = (~batch[TERMINATED].squeeze(-1)).float()
    cont = targets.continues(batch).float()
    delta = reward + GAMMA * not_term * next_value - value
    done = batch[DONE]  # for TorchRL: every end inside a row (a row's end stops it too)
    v1, nv1 = value.unsqueeze(-1), next_value.unsqueeze(-1)

    def splice_gae() -> object:
        return targets.gae(batch, value, next_value, gamma=GAMMA, lmbda=LMBDA)

    def loop_gae() -> object:
        return loop_scan(delta, GAMMA * LMBDA * cont)

    def torchrl_gae() -> object:
        return vec_generalized_advantage_estimate(
            GAMMA, LMBDA, v1, nv1, batch[REWARD], done, batch[TERMINATED]
        )

    def raw_gae() -> object:
        return reward + GAMMA * not_term * next_value - value

    lam_b = reward + GAMMA * (1 - LMBDA * cont) * not_term * next_value

    def splice_lambda() -> object:
        return targets.td_lambda_return(batch, next_value, gamma=GAMMA, lmbda=LMBDA)

    def loop_lambda() -> object:
        return loop_scan(lam_b, GAMMA * LMBDA * cont)

    def torchrl_lambda() -> object:
        return vec_td_lambda_return_estimate(
            GAMMA, LMBDA, nv1, batch[REWARD], done, batch[TERMINATED]
        )

    # Everyone computes the same thing.
    ours = splice_gae()[0].squeeze(-1)  # type: ignore[index]
    torch.testing.assert_close(ours, loop_gae(), rtol=1e-4, atol=1e-4)
    lam = splice_lambda().squeeze(-1)  # type: ignore[attr-defined]
    torch.testing.assert_close(lam, loop_lambda(), rtol=1e-4, atol=1e-4)
    contenders = {"splice": splice_gae, "loop": loop_gae, "raw": raw_gae}
    lambda_contenders = {"splice": splice_lambda, "loop": loop_lambda}
    if vec_generalized_advantage_estimate is not None:
        theirs = torchrl_gae()[0].squeeze(-1)  # type: ignore[index]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
        contenders["TorchRL"] = torchrl_gae
        theirs = torchrl_lambda().squeeze(-1)  # type: ignore[attr-defined]
        torch.testing.assert_close(lam, theirs, rtol=1e-4, atol=1e-4)
        lambda_contenders["TorchRL"] = torchrl_lambda
    rows = []
    label = f"[{n_env}, {n_steps}] mean {mean_len:g}"
    for name, group in (("GAE", contenders), ("TD(λ)", lambda_contenders)):
        t = interleaved(group, rounds=rounds)
        torchrl = t.get("TorchRL")
        rows.append(
            [
                f"{name} {label}",
                t["splice"].ms(),
                t["loop"].ms(),
                torchrl.ms() if torchrl else "n/a",
                t["raw"].ms() if "raw" in t else "",
                ratio(t["loop"].median, t["splice"].median),
                ratio(torchrl.median, t["splice"].median) if torchrl else "n/a",
            ]
        )
    return rows


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    n_env, n_steps = (4, 256) if args.quick else (16, 2048)
    rounds = 3 if args.quick else 15
    rows = []
    for mean_len in (20.0, 200.0, 2000.0):
        rows.extend(case(n_env, n_steps, mean_len, rounds))
    print("## Value targets on a collector chunk (median of round-robin runs)\n")
    print(
        table(
            [
                "targets",
                "splice",
                "loop over time",
                "TorchRL vec",
                "raw (TD errors)",
                "loop / splice",
                "TorchRL / splice",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
