"""Value targets on collector chunks: splice.targets vs rlox 1.2.0 vs TorchRL 0.14.1 vs a loop.

Run: ``python -m benchmarks.bench_targets [--quick] [--cpu-time]``. ``--cpu-time`` times in
CPU time of the process (``time.process_time``, every thread of it: rlox's GAE runs on a
thread pool), which leaves out the time other processes take from a busy machine.

Data: ``[16, 2048]`` float32 chunks (``splice.testing.synthetic_rollout``: geometric episode
lengths of mean 20, 200 and 2,000 steps, a fifth of the ends truncations, the last episode of
every row cut at the chunk's edge), random rewards, values and log-probabilities (inside an
episode ``next_value[t] = value[t + 1]``, as a feed-forward critic gives). Contenders,
round-robin in one process with one torch thread:

* **splice**: ``splice.targets.gae`` / ``td_lambda_return`` / ``vtrace`` on the TensorDict
  (reading and checking the flags, ids and cut marks is part of the time);
* **rlox**: ``compute_gae_batched_f32`` (one call for the chunk) and ``compute_vtrace`` (one
  call per env row: it takes one trajectory and one bootstrap value), on flat float32 numpy
  arrays prepared outside the timing. rlox reads **one** done flag: a truncation is treated
  as a termination (no bootstrap), so it agrees with splice only on the episodes that end by
  termination or at the chunk's edge (checked before timing);
* **TorchRL**: ``vec_generalized_advantage_estimate`` / ``vec_td_lambda_return_estimate`` /
  ``vec_td1_return_estimate`` (its vectorised versions) and ``vtrace_advantage_estimate`` on
  the same tensors;
* **loop**: the plain Python loop over time (CleanRL's form: whole-tensor ops across the 16
  rows at each step) on precomputed TD errors and trace coefficients — the work that is left
  once the flags are read;
* **raw**: the elementwise part every GAE needs (the TD errors), a lower bound.

Two timings: round-robin (the harness's: a ``gc.collect()`` before each call, and every
contender in turn, so each call starts with cold caches, as a target computed between two
network updates does), and back to back for splice and rlox (ten calls in a row: warm
caches, a tight loop). Ratios are splice's time over each contender's (below 1: splice is
faster). rlox has no
TD(λ), discounted or n-step return: their rows compare with rlox's GAE on the same chunk,
marked "(GAE)". "return" is ``discounted_return`` with ``next_value`` (bootstrapped).

Without ``--quick`` it also measures what the compiled kernels cost: ``import splice``, the
first target computed in a fresh process with an empty and with a warm kernel cache, and the
size of numba and llvmlite on disk.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks._harness import Timing, interleaved, load, parser, table
from splice import targets
from splice.layout import DONE, REWARD, TERMINATED, TRUNCATED
from splice.targets import _torch
from splice.testing import synthetic_rollout

warnings.filterwarnings("ignore")
try:
    from torchrl.objectives.value.functional import (
        vec_generalized_advantage_estimate,
        vec_td1_return_estimate,
        vec_td_lambda_return_estimate,
        vtrace_advantage_estimate,
    )
except ImportError:  # pragma: no cover - the bench extra installs torchrl
    vec_generalized_advantage_estimate = vec_td_lambda_return_estimate = None
    vec_td1_return_estimate = vtrace_advantage_estimate = None
try:
    import rlox
except ImportError:  # pragma: no cover - the bench extra installs rlox
    rlox = None

GAMMA, LMBDA, N = 0.99, 0.95, 5


def loop_scan(b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``x_t = b_t + c_t x_{t+1}``, one time step at a time."""
    out = torch.empty_like(b)
    running = torch.zeros_like(b[:, 0])
    for t in range(b.shape[1] - 1, -1, -1):
        running = b[:, t] + c[:, t] * running
        out[:, t] = running
    return out


def times(ours: float, theirs: float) -> str:
    """splice's time over a contender's."""
    return f"{ours / theirs:.3f}x" if theirs > 0 else "inf"


def back_to_back(
    contenders: dict[str, Callable[[], object]],
    *,
    rounds: int,
    clock: Callable[[], float],
    calls: int = 10,
) -> dict[str, Timing]:
    """Each round, each contender ``calls`` times in a row after an untimed call (caches warm,
    as in a tight loop); the median over rounds of the time per call."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            fn()
            start = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - start) / calls)
    return {
        name: Timing(statistics.median(s), min(s), max(s), rounds) for name, s in samples.items()
    }


def case(
    n_env: int, n_steps: int, mean_len: float, rounds: int, clock: Callable[[], float]
) -> tuple[list[list[object]], list[list[object]]]:
    """The round-robin table's rows and the back-to-back table's (splice and rlox)."""
    batch = synthetic_rollout(n_env, n_steps, mean_len, seed=0)
    gen = torch.Generator().manual_seed(0)
    batch[REWARD] = torch.randn(n_env, n_steps, 1, generator=gen)
    cont = targets.continues(batch)
    value = torch.randn(n_env, n_steps, generator=gen)
    # inside an episode V(s'_t) = V(s_{t+1}); at its end, the true final observation's value
    next_value = torch.where(
        cont, torch.nn.functional.pad(value[:, 1:], (0, 1)), torch.randn(n_env, n_steps)
    )
    log_mu = -torch.rand(n_env, n_steps, generator=gen) * 2  # behaviour log-probabilities
    log_pi = log_mu + 0.3 * torch.randn(n_env, n_steps, generator=gen)
    batch["action_log_prob"] = log_mu
    reward = batch[REWARD].squeeze(-1)
    term = batch[TERMINATED].squeeze(-1)
    boot = torch.where(term, 0.0, next_value)
    delta = reward + GAMMA * boot - value
    c = cont.float()
    done = batch[DONE]  # for TorchRL: every end inside a row (a row's end stops it too)
    v1, nv1 = value.unsqueeze(-1), next_value.unsqueeze(-1)
    ratio = (log_pi - log_mu).exp()
    rho = ratio.clamp(max=1.0)
    vtrace_delta = rho * delta
    vtrace_trace = GAMMA * ratio.clamp(max=1.0) * c

    # rlox's inputs: flat float32 numpy arrays, one done flag (terminated or truncated)
    r_np, v_np = reward.numpy().ravel().copy(), value.numpy().ravel().copy()
    done_np = done.squeeze(-1).float().numpy().copy()
    last_np = next_value[:, -1].numpy().copy()
    log_rho_np = (log_pi - log_mu).numpy().copy()

    def splice_gae() -> object:
        return targets.gae(batch, value, next_value, gamma=GAMMA, lmbda=LMBDA)

    def rlox_gae() -> object:
        return rlox.compute_gae_batched_f32(
            r_np, v_np, done_np.ravel(), last_np, n_steps, GAMMA, LMBDA
        )

    def torchrl_gae() -> object:
        return vec_generalized_advantage_estimate(
            GAMMA, LMBDA, v1, nv1, batch[REWARD], done, batch[TERMINATED]
        )

    def loop_gae() -> object:
        return loop_scan(delta, GAMMA * LMBDA * c)

    def raw_gae() -> object:
        return reward + GAMMA * torch.where(term, 0.0, next_value) - value

    lam_b = reward + GAMMA * (1 - LMBDA * c) * boot

    def splice_lambda() -> object:
        return targets.td_lambda_return(batch, next_value, gamma=GAMMA, lmbda=LMBDA)

    def torchrl_lambda() -> object:
        return vec_td_lambda_return_estimate(
            GAMMA, LMBDA, nv1, batch[REWARD], done, batch[TERMINATED]
        )

    def loop_lambda() -> object:
        return loop_scan(lam_b, GAMMA * LMBDA * c)

    def splice_return() -> object:
        return targets.discounted_return(batch, next_value, gamma=GAMMA)

    def torchrl_return() -> object:
        return vec_td1_return_estimate(GAMMA, nv1, batch[REWARD], done, batch[TERMINATED])

    def loop_return() -> object:
        return loop_scan(reward + GAMMA * (1 - c) * boot, GAMMA * c)

    def splice_n_step() -> object:
        return targets.n_step_return(batch, next_value, n=N, gamma=GAMMA)

    def splice_vtrace() -> object:
        return targets.vtrace(batch, value, next_value, log_pi=log_pi, gamma=GAMMA)

    def rlox_vtrace() -> object:
        out = []
        for row in range(n_env):
            lo, hi = row * n_steps, (row + 1) * n_steps
            out.append(
                rlox.compute_vtrace(
                    log_rho_np[row],
                    r_np[lo:hi],
                    v_np[lo:hi],
                    done_np[row],
                    float(last_np[row]),
                    GAMMA,
                )
            )
        return out

    def torchrl_vtrace() -> object:
        return vtrace_advantage_estimate(
            GAMMA,
            log_pi.unsqueeze(-1),
            log_mu.unsqueeze(-1),
            v1,
            nv1,
            batch[REWARD],
            done,
            batch[TERMINATED],
        )

    def loop_vtrace() -> object:
        vs = loop_scan(vtrace_delta, vtrace_trace) + value
        after = torch.where(cont, torch.nn.functional.pad(vs[:, 1:], (0, 1)), boot)
        return rho * (reward + GAMMA * after - value), vs

    # Everyone computes the same thing (rlox: where a single done flag means the same).
    close = {"rtol": 1e-4, "atol": 1e-4}
    adv, _ = splice_gae()
    lam = splice_lambda()
    pg, vs = splice_vtrace()
    adv, lam, pg, vs = (x.squeeze(-1) for x in (adv, lam, pg, vs))
    torch.testing.assert_close(adv, loop_gae(), **close)
    torch.testing.assert_close(lam, loop_lambda(), **close)
    torch.testing.assert_close((pg, vs), loop_vtrace(), **close)
    ret = splice_return().squeeze(-1)
    torch.testing.assert_close(ret, loop_return(), **close)
    gae_group = {"splice": splice_gae, "loop": loop_gae, "raw": raw_gae}
    lambda_group = {"splice": splice_lambda, "loop": loop_lambda}
    return_group = {"splice": splice_return, "loop": loop_return}
    n_step_group = {"splice": splice_n_step}
    vtrace_group = {"splice": splice_vtrace, "loop": loop_vtrace}
    if rlox is not None:
        truncated_end = batch[TRUNCATED].squeeze(-1) & ~term
        agree = ~truncated_end.gather(-1, _torch.segment_end(cont))  # ends not truncated
        theirs = torch.from_numpy(rlox_gae()[0]).reshape(n_env, n_steps)
        torch.testing.assert_close(adv[agree], theirs[agree], **close)
        assert not torch.allclose(adv[~agree], theirs[~agree])  # truncations differ
        vs_rlox = torch.stack([torch.from_numpy(v) for v, _ in rlox_vtrace()])
        pg_rlox = torch.stack([torch.from_numpy(a) for _, a in rlox_vtrace()])
        torch.testing.assert_close(vs[agree], vs_rlox[agree], **close)
        torch.testing.assert_close(pg[agree], pg_rlox[agree], **close)
        gae_group["rlox"], vtrace_group["rlox"] = rlox_gae, rlox_vtrace
    if vec_generalized_advantage_estimate is not None:
        torch.testing.assert_close(adv, torchrl_gae()[0].squeeze(-1), **close)
        torch.testing.assert_close(lam, torchrl_lambda().squeeze(-1), **close)
        torch.testing.assert_close(ret, torchrl_return().squeeze(-1), **close)
        return_group["TorchRL"] = torchrl_return
        theirs = tuple(x.squeeze(-1) for x in torchrl_vtrace())
        torch.testing.assert_close((pg, vs), theirs, **close)
        gae_group["TorchRL"], lambda_group["TorchRL"] = torchrl_gae, torchrl_lambda
        vtrace_group["TorchRL"] = torchrl_vtrace

    rows, warm_rows = [], []
    label = f"[{n_env}, {n_steps}] mean {mean_len:g}"
    rlox_gae_time = rlox_gae_warm = None
    groups = (("GAE", gae_group), ("TD(λ)", lambda_group), ("return", return_group),
              (f"n-step (n={N})", n_step_group), ("V-trace", vtrace_group))  # fmt: skip
    for name, group in groups:
        t = interleaved(group, rounds=rounds, clock=clock)
        ours = t["splice"].median

        def cell(who: str, t: dict = t) -> str:
            return t[who].ms() if who in t else "n/a"

        def rel(who: str, t: dict = t, ours: float = ours) -> str:
            return times(ours, t[who].median) if who in t else "n/a"

        if "rlox" in t and name == "GAE":
            rlox_gae_time = t["rlox"].median
        vs_rlox = rel("rlox")
        if "rlox" not in t and rlox_gae_time is not None:  # rlox has no such target
            vs_rlox = f"{times(ours, rlox_gae_time)} (GAE)"
        rows.append(
            [
                f"{name} {label}",
                cell("splice"),
                cell("rlox"),
                cell("TorchRL"),
                cell("loop"),
                cell("raw") if "raw" in t else "",
                vs_rlox,
                rel("TorchRL"),
                rel("loop"),
            ]
        )
        warm = back_to_back(
            {k: f for k, f in group.items() if k in ("splice", "rlox")}, rounds=rounds, clock=clock
        )
        if "rlox" in warm and name == "GAE":
            rlox_gae_warm = warm["rlox"].median
        if "rlox" in warm:
            vs_rlox = times(warm["splice"].median, warm["rlox"].median)
        elif rlox_gae_warm is not None:
            vs_rlox = f"{times(warm['splice'].median, rlox_gae_warm)} (GAE)"
        else:
            vs_rlox = "n/a"
        rlox_cell = warm["rlox"].ms() if "rlox" in warm else "n/a"
        warm_rows.append([f"{name} {label}", warm["splice"].ms(), rlox_cell, vs_rlox])
    return rows, warm_rows


# --------------------------------------------------------------------------- costs

_FIRST_CALL = """
import time
t0 = time.perf_counter()
import torch
from tensordict import TensorDict
from splice import targets
t1 = time.perf_counter()
td = TensorDict({("next", "reward"): torch.ones(16, 2048, 1),
                 ("next", "terminated"): torch.zeros(16, 2048, 1, dtype=torch.bool),
                 ("next", "done"): torch.zeros(16, 2048, 1, dtype=torch.bool)}, [16, 2048])
v = torch.zeros(16, 2048)
t2 = time.perf_counter()
targets.gae(td, v, v, gamma=0.99, lmbda=0.95)
t3 = time.perf_counter()
targets.vtrace(td, v, v, log_pi=v, log_mu=v, gamma=0.99)
t4 = time.perf_counter()
print(t1 - t0, t3 - t2, t4 - t3)
"""


def _python(code: str, env: dict[str, str] | None = None) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return [float(x) for x in out.stdout.split()]


def _size_mib(package: str) -> float:
    module = __import__(package)
    root = Path(module.__file__).parent
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20


def costs(runs: int) -> list[list[object]]:
    """What the compiled kernels cost: import time, first calls, install size."""
    plain = [
        _python(
            "import time; t = time.perf_counter(); import splice; print(time.perf_counter() - t)"
        )[0]
        for _ in range(runs)
    ]
    with_numba = [
        _python(
            "import time; t = time.perf_counter(); import splice, numba; "
            "print(time.perf_counter() - t)"
        )[0]
        for _ in range(runs)
    ]
    cold, warm = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            env = {"NUMBA_CACHE_DIR": cache}
            cold.append(_python(_FIRST_CALL, env))
            warm.append(_python(_FIRST_CALL, env))

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e3:.0f} ms"

    size = _size_mib("numba") + _size_mib("llvmlite")
    return [
        ["import splice (numba not imported)", med(plain)],
        ["import splice, numba (what importing numba eagerly would cost)", med(with_numba)],
        ["first gae, empty kernel cache (import numba + compile)", med([c[1] for c in cold])],
        ["first vtrace after it, empty cache (compile)", med([c[2] for c in cold])],
        ["first gae, warm kernel cache (import numba + load)", med([w[1] for w in warm])],
        ["first vtrace after it, warm cache (load)", med([w[2] for w in warm])],
        ["numba + llvmlite installed size", f"{size:.0f} MiB"],
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cpu-time", action="store_true", help="time in CPU time, not wall time")
    args = p.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(1)
    gc.freeze()  # the timings' gc.collect() skips the imported libraries' objects (~0.4 s each)
    n_env, n_steps = (4, 256) if args.quick else (16, 2048)
    rounds = 3 if args.quick else 15
    started = time.perf_counter()
    rows, warm_rows = [], []
    for mean_len in (20.0, 200.0, 2000.0):
        cold, warm = case(n_env, n_steps, mean_len, rounds, clock)
        rows.extend(cold)
        warm_rows.extend(warm)
    what = "CPU time" if args.cpu_time else "wall time"
    print(f"## Value targets on a collector chunk (median of round-robin runs, {what})\n")
    print(
        table(
            [
                "targets",
                "splice",
                "rlox",
                "TorchRL",
                "loop over time",
                "raw (TD errors)",
                "splice / rlox",
                "splice / TorchRL",
                "splice / loop",
            ],
            rows,
        )
    )
    print(f"\n## The same, back to back (10 calls in a row per contender and round, {what})\n")
    print(table(["targets", "splice", "rlox", "splice / rlox"], warm_rows))
    print(f"\n{load()}; {time.perf_counter() - started:.0f} s")
    if not args.quick:
        print("\n## What the compiled kernels cost (fresh processes, median of 5)\n")
        print(table(["", "time"], costs(5)))


if __name__ == "__main__":
    main()
