"""
Value targets: three classic mistakes, measured
===============================================

Actor-critic and value-based agents regress on *targets* built from rewards and
bootstrapped values: returns, n-step returns, TD(λ), GAE. Each of them has to decide, at
the end of the data, whether to bootstrap and from what. Three decisions are easy to get
wrong, and popular implementations do get them wrong:

1. **A time limit treated as termination.** The episode did not end because the task
   ended, but the target stops bootstrapping as if it had (CleanRL's PPO, cleanrl#198;
   purejaxrl#20).
2. **A collector's cut treated as termination.** The collector returned the batch in the
   middle of an episode; a target that treats the batch edge as an end loses everything
   after it.
3. **V(t) for V(t+1).** A time-out bootstraps from the value of the step's own
   observation instead of the observation the episode ended in (rl_games#128; the same
   approximation in Sample Factory and in rsl_rl, rsl_rl#20 and rsl_rl#151).

This tutorial collects real CartPole data, computes the *true* value of every state, and
measures how far each mistake moves the value targets from it — next to
:func:`splice.targets.gae`, which bootstraps right at every kind of end.

**In this tutorial you will learn:**

* what splice's batches say about how the data stops at each step: terminated, truncated,
  or cut at the batch edge;
* how to compute GAE on a collector chunk as it comes, with :mod:`splice.targets`;
* how large each of the three mistakes is, measured on the same data.
"""

# %%
# Setup
# -----
#
# The documentation is built at two sizes (``SPLICE_DOCS_BUDGET=small`` in the test suite,
# ``full`` by default); only the amount of data changes. Plotting and table helpers are
# left out of this page (they are in the downloadable script).

import os

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
import torch

from splice import Collector, targets
from splice.layout import CUT, DONE, TERMINATED, TRUNCATED

SMALL = os.environ.get("SPLICE_DOCS_BUDGET", "full") == "small"
N_ENVS, T = (8, 128) if SMALL else (16, 128)
N_BATCHES = 6 if SMALL else 12
GAMMA, LMBDA = 0.99, 0.95

# sphinx_gallery_start_ignore
plt.rcParams.update(
    {"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False}
)
COLORS = {
    "splice (correct)": "C2",
    "time limit as termination": "C3",
    "cut as termination": "C1",
    "V(t) for V(t+1)": "C4",
}


class Table:
    """A small table that renders as HTML in the docs (and as markdown in a terminal)."""

    def __init__(self, header, rows):
        self.header = [str(h) for h in header]
        self.rows = [[str(v) for v in r] for r in rows]

    def _repr_html_(self):
        head = "".join(f"<th>{h}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        return f'<table class="splice-table"><tr>{head}</tr>{body}</table>'

    def __repr__(self):
        lines = [
            "| " + " | ".join(self.header) + " |",
            "|" + "---|" * len(self.header),
        ]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in self.rows])


def plot_episode_end(title, span, true_value, variants):
    fig, ax = plt.subplots(figsize=(8, 3.4))
    steps = np.arange(-len(span) + 1, 1)
    ax.plot(
        steps, true_value[span], color="black", lw=3, alpha=0.25, label="true value"
    )
    for name, target in variants.items():
        ax.plot(steps, target[span], color=COLORS[name], label=name)
    ax.set_xlabel("steps before the end of the data")
    ax.set_ylabel("value target")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()


def plot_error_by_distance(curves):
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for name, (distance, error) in curves.items():
        ax.semilogy(distance, error, color=COLORS[name], marker=".", label=name)
    ax.set_xlabel("steps before a time limit or a cut")
    ax.set_ylabel("mean |target - true value|")
    ax.set_title("How far back each mistake reaches (GAE, gamma 0.99, lambda 0.95)",
                 fontsize=10)  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()


# sphinx_gallery_end_ignore

# %%
# Data: CartPole with a time limit, cut into chunks
# -------------------------------------------------
#
# The policy is a fixed linear controller: push the cart the way the pole leans, with a
# small wrong-signed gain on the cart position. It keeps the pole up, but the cart drifts,
# and sooner or later it leaves the track — *terminated* — unless CartPole's 500-step
# limit comes first — *truncated*. It is deterministic, so every state has one true
# value, which we compute below.

GAINS = np.array(
    [-0.1, 0.0, 1.0, 0.5], dtype=np.float32
)  # x, x_dot, theta, theta_dot


def act(obs: np.ndarray) -> np.ndarray:
    return (obs @ GAINS > 0).astype(np.int64)


def policy(td):
    td["action"] = torch.from_numpy(act(td["observation"].numpy()))
    return td


env = gym.make_vec(
    "CartPole-v1", num_envs=N_ENVS, vectorization_mode="vector_entry_point"
)
collector = Collector(
    env,
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=N_ENVS * T * N_BATCHES,
    seed=0,
)
chunks = list(collector)
collector.shutdown()

# %%
# Every chunk is ``[N_ENVS, 128]``: 128 consecutive steps of each environment. Episodes
# end inside the rows, and the episode still running at the chunk's edge is *cut*:
# ``("collector", "cut")`` is True on its last step, and it goes on in the next chunk.
# Each step says how the data stops there, if it does:

batch = torch.cat(chunks, 0)  # the chunks' rows stacked: still one [rows, 128] layout
counts = {
    "terminated": int(batch[TERMINATED].sum()),
    "truncated (time limit)": int(batch[TRUNCATED].sum()),
    "cut (chunk edge)": int(batch[CUT].sum()),
}
assert all(n > 0 for n in counts.values())
Table(["how the data stops", "steps"], list(counts.items()))

# %%
# The true value of every state
# -----------------------------
#
# CartPole's observation is its whole state, the dynamics are deterministic and so is the
# policy: the value of a state is the discounted return of running the policy from it,
# until the cart leaves the track. The time limit is not part of the state, so it is not
# part of the value either — which is exactly why a time limit must not be treated as a
# termination. We roll out the policy from every observation of the data (the true final
# observation included), in one vectorised CartPole with no time limit.


def true_values(states: np.ndarray, horizon: int = 1000) -> np.ndarray:
    """Discounted return of the policy from each state (gamma**1000 < 5e-5)."""
    n = len(states)
    rollout = gym.make_vec(
        "CartPole-v1",
        num_envs=n,
        vectorization_mode="vector_entry_point",
        max_episode_steps=10 * horizon,
    )
    rollout.reset(seed=0)
    rollout.unwrapped.state = states.T.astype(np.float64)
    obs, returns, alive, discount = states, np.zeros(n), np.ones(n, bool), 1.0
    for _ in range(horizon):
        obs, reward, terminated, _, _ = rollout.step(act(obs))
        returns += discount * reward * alive
        alive &= ~terminated
        discount *= GAMMA
    rollout.close()
    return returns


obs = batch["observation"].reshape(-1, 4).numpy()
next_obs = batch["next", "observation"].reshape(-1, 4).numpy()
both = torch.from_numpy(true_values(np.concatenate([obs, next_obs]))).float()
value = both[: len(obs)].reshape(batch.shape)  # V(s_t)
next_value = both[len(obs) :].reshape(
    batch.shape
)  # V(s'_t), s'_t = ("next", "observation")
f"true values from {value.min():.1f} to {value.max():.1f}"

# %%
# Targets with splice
# -------------------
#
# :func:`splice.targets.gae` takes the chunk as it comes, with :math:`V(s_t)` and
# :math:`V(s'_t)` for every step. It stops the recursion at every end and bootstraps from
# :math:`V(s'_t)` unless the step terminated: a truncated step from its true final
# observation, a cut step from the observation its episode continues from. With the true
# values, the right targets *are* the true values (up to the float32 rounding of the
# observations the rollouts start from).

_, correct = targets.gae(batch, value, next_value, gamma=GAMMA, lmbda=LMBDA)
correct = correct.squeeze(-1)
error = (correct - value).abs()
assert error.mean() < 0.1
f"splice: mean |target - true value| = {error.mean():.3f}"

# %%
# The three mistakes
# ------------------
#
# Each mistake is written the way the implementations that make it compute their targets,
# on the same batch and the same values.
#
# 1. A time limit treated as termination: truncated steps count as terminated.

timelimit = batch.clone()
timelimit[TERMINATED] = batch[DONE].clone()
_, mistake_1 = targets.gae(timelimit, value, next_value, gamma=GAMMA, lmbda=LMBDA)

# %%
# 2. A cut treated as termination: the last step of every chunk row is an end, with no
# bootstrap.

cut_as_end = batch.clone()
at_cut = batch[CUT].unsqueeze(-1)
cut_as_end[TERMINATED] = batch[TERMINATED] | at_cut
cut_as_end[DONE] = batch[DONE] | at_cut
_, mistake_2 = targets.gae(cut_as_end, value, next_value, gamma=GAMMA, lmbda=LMBDA)

# %%
# 3. V(t) for V(t+1): a time-out bootstraps from the value of the step's own observation.

own_value = torch.where(batch[TRUNCATED].squeeze(-1), value, next_value)
_, mistake_3 = targets.gae(batch, value, own_value, gamma=GAMMA, lmbda=LMBDA)

variants = {
    "splice (correct)": correct,
    "time limit as termination": mistake_1.squeeze(-1),
    "cut as termination": mistake_2.squeeze(-1),
    "V(t) for V(t+1)": mistake_3.squeeze(-1),
}

# %%
# The measured error
# ------------------
#
# For every variant: the mean absolute error of the value targets over all steps, over the
# steps that end at a time limit or a cut, the largest error, and the share of steps whose
# target is off by more than 1 (the true values are between 1 and 100).

truncated, cut = batch[TRUNCATED].squeeze(-1), batch[CUT]
rows, errors = [], {}
for name, target in variants.items():
    err = (target - value).abs()
    errors[name] = err
    rows.append(
        [
            name,
            f"{err.mean():.3f}",
            f"{err[truncated].mean():.2f}",
            f"{err[cut].mean():.2f}",
            f"{err.max():.1f}",
            f"{(err > 1).float().mean():.1%}",
        ]
    )
# The claims of this page, checked on this run's data:
assert errors["time limit as termination"][truncated].mean() > 30
assert errors["cut as termination"][cut].mean() > 30
assert errors["cut as termination"].mean() > 10 * errors["splice (correct)"].mean()
assert (
    errors["cut as termination"].mean() > errors["time limit as termination"].mean()
)
assert errors["V(t) for V(t+1)"][truncated].mean() < 5
assert (
    errors["V(t) for V(t+1)"][truncated].mean()
    > errors["splice (correct)"][truncated].mean()
)
Table(
    ["targets", "mean error", "at time limits", "at cuts", "max", "steps off by > 1"],
    rows,
)

# %%
# What the table says:
#
# * **Cut as termination** is the worst on this data: every chunk row ends with a cut, so
#   every row's tail loses its bootstrap, and with :math:`\gamma\lambda = 0.94` the damage
#   reaches dozens of steps back. The shorter the chunks, the larger the share of data it
#   spoils.
# * **Time limit as termination** does the same damage where it applies (at a time limit
#   the target drops from the state's value to one reward), but time limits are rarer
#   than chunk edges here.
# * **V(t) for V(t+1)** is much smaller on CartPole: one step rarely changes the value
#   much. It is still a bias, and it grows where values change fast from step to step —
#   near failure, or with sparse rewards.
#
# Figures 1 and 2 show single episodes; figure 3 shows how far back each mistake reaches.

# sphinx_gallery_start_ignore
rows_with = lambda flag: [int(r) for r in flag.any(1).nonzero().squeeze(1)]  # noqa: E731
row = rows_with(truncated)[0]
end = int(truncated[row].nonzero()[0, 0])
span = np.arange(max(0, end - 80), end + 1)
plot_episode_end(
    f"An episode that hit the 500-step time limit (chunk row {row})",
    span,
    value[row].numpy(),
    {k: variants[k][row].numpy() for k in list(variants)[:2] + ["V(t) for V(t+1)"]},
)
row = rows_with(cut)[0]
span = np.arange(T - 80, T)
plot_episode_end(
    f"An episode cut at the chunk's edge (chunk row {row}); it goes on in the next chunk",
    span,
    value[row].numpy(),
    {k: variants[k][row].numpy() for k in ["splice (correct)", "cut as termination"]},
)
# sphinx_gallery_end_ignore

# %%
# Mean error against the distance to the end of the data (steps before a time limit, for
# the time-limit mistakes; before a cut, for the cut mistake):

continues = targets.continues(batch)  # the rule splice's targets follow
position = torch.arange(T).expand_as(continues)
# the last step of each step's segment: the first step at or after it that stops
segment_end = (
    torch.where(continues, T - 1, position).flip(-1).cummin(-1).values.flip(-1)
)
distance = segment_end - position
curves = {}
for name, end_kind in [
    ("time limit as termination", truncated),
    ("cut as termination", cut),
    ("V(t) for V(t+1)", truncated),
]:
    ends_so = end_kind.gather(1, segment_end)  # the step's segment ends that way
    steps_back = np.arange(60)
    curves[name] = (
        steps_back,
        [float(errors[name][ends_so & (distance == k)].mean()) for k in steps_back],
    )
plot_error_by_distance(curves)

# %%
# Conclusion
# ----------
#
# We covered:
#
# * how a splice batch marks the ends of the data: ``terminated`` (no bootstrap),
#   ``truncated`` (bootstrap from the true final observation), and the collector's
#   ``("collector", "cut")`` (bootstrap from the observation the episode continues from);
# * :func:`splice.targets.gae` on a collector chunk as it comes — the same call works on
#   padded trajectories, the "cat" layout and replay slices;
# * the three classic mistakes, measured against the true values on real CartPole data.
#
# Useful resources:
#
# * :doc:`/value_targets` — the rule, every formula, and how the targets are computed;
# * :doc:`/data_contract` — done vs terminated vs truncated vs cut;
# * :mod:`splice.examples.ppo` — recurrent PPO built on :func:`splice.targets.gae`;
# * Pardo et al., *Time Limits in Reinforcement Learning* (ICML 2018).
