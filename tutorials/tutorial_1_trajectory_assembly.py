"""
Trajectory assembly: from collector chunks to whole episodes
============================================================

A collector hands out experience in chunks of a fixed number of steps, so most episodes
are cut across chunks, and whatever is computed along an episode (a return, a value
target, a recurrent network's input) goes wrong where a chunk's edge is taken for the
episode's end. We measure that error on real CartPole data, then use the tools that put
the pieces back together, up to a small training run that depends on them.

**In this tutorial you will learn:**

* what a collector chunk holds, how wrong returns computed chunk by chunk are, and how
  :mod:`splice.targets` computes them exactly on assembled episodes;
* how :func:`~splice.split_trajectories` regroups steps into one row per trajectory,
  padded with a mask or nested, and what each costs;
* what ``done``, ``terminated``, ``truncated`` and the collector's ``cut`` mean, and what
  to bootstrap from at the last step of a cut trajectory;
* how ``trajs_per_batch`` yields whole episodes, and how to sample 16-step slices of them
  from a :class:`~splice.ReplayBuffer` with a :class:`~splice.SliceSampler`;
* how :meth:`Collector.start() <splice.Collector.start>` fills the buffer in the
  background while a value network trains on it.

**Prerequisites:** Python and PyTorch basics, gymnasium's ``reset``/``step`` loop and what
a discounted return is; splice installed as described in :doc:`../getting_started`.
"""

# %%
# Setup
# -----
#
# Eight CartPole environments step together. CartPole pays 1 per step until the pole
# falls, and stops an episode after 500 steps (a time limit). Our policy pushes the cart
# towards the side the pole falls to, but one action in four goes the other way at
# random, so episode lengths vary widely.

import itertools
import os
import time
import timeit

import matplotlib.pyplot as plt
import torch
from torch import nn

from splice import Collector, LazyTensorStorage, ReplayBuffer, SliceSampler, targets
from splice.trajectories import TrajectoryAssembler, split_trajectories

TOTAL = 800 * 12  # steps to collect: 12 chunks of [8, 100]
UPDATES = 500  # gradient steps of the training run (section 7)
GAMMA = 0.98  # the discount
# sphinx_gallery_start_ignore
if os.environ.get("SPLICE_DOCS_BUDGET") == "small":  # the test suite's quick build
    TOTAL, UPDATES = 800 * 6, 200
# sphinx_gallery_end_ignore
torch.manual_seed(0)
torch.set_num_threads(1)  # small networks run fastest on one CPU thread


def policy(td):  # any function that reads "observation" and writes "action"
    obs = td["observation"]  # [8, 4]: cart position and speed, pole angle and speed
    push_right = obs[:, 2] + 0.5 * obs[:, 3] > 0
    td["action"] = (push_right ^ (torch.rand(len(obs)) < 0.25)).long()
    return td


# sphinx_gallery_start_ignore
# Figures and tables of this page (executed, not shown); the code shown runs without them.
# fmt: off
plt.rcParams.update({"axes.spines.top": False, "axes.spines.right": False, "figure.autolayout": True})
class table(dict):  # {row: {column: value}}, shown as an HTML table
    def _repr_html_(self):
        cols = list(dict.fromkeys(c for r in self.values() for c in r))
        rows = [["", *cols]] + [[k] + [r.get(c, "-") for c in cols] for k, r in self.items()]
        cells = ["".join(f"<td>{v:.2f}</td>" if isinstance(v, float | torch.Tensor) else f"<td>{v}</td>" for v in r) for r in rows]
        return '<table class="splice-table">' + "".join(f"<tr>{c}</tr>" for c in cells) + "</table>"
def plot_chunk(chunk):
    _, ax = plt.subplots(figsize=(9, 3.4))
    for row, ids in enumerate(chunk["collector", "traj_ids"]):
        runs, lengths = torch.unique_consecutive(ids, return_counts=True)
        for traj, end, n in zip(runs.tolist(), lengths.cumsum(0).tolist(), lengths.tolist(), strict=True):
            last = chunk[row, end - 1]
            ax.barh(row, n, left=end - n, height=0.8, color=plt.cm.tab20(traj % 20))
            if n >= 3 * len(str(traj)):  # room for the label
                ax.text(end - n / 2, row, traj, ha="center", va="center", size=8)
            if last["next", "done"]:
                ax.text(end - 0.5, row, "X" if last["next", "terminated"] else "T", ha="center", va="center", weight="bold")
            if last["collector", "cut"]:
                ax.plot([end, end], [row - 0.45, row + 0.45], color="crimson", lw=3)
        if not chunk["is_init"][row, 0]:
            ax.plot(-1.5, row, marker="<", color="grey")
    ax.set_yticks(range(8), [f"env {r}" for r in range(8)])
    ax.set(xlim=(-3, 102), ylim=(7.5, -0.5), xlabel="step within the chunk")
    ax.set_title("One [8, 100] chunk: each colour an episode, labelled with its id")
def plot_returns(truth, chunked, mask, error):
    k = int(mask.sum(1).argmax())  # the longest episode
    n = int(mask[k].sum())
    _, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.4), width_ratios=[3, 2])
    ax0.plot(truth[k, :n], color="black", lw=2.5, alpha=0.4, label="exact")
    ax0.plot(chunked[k, :n], color="tab:red", lw=1, label="computed chunk by chunk")
    ax0.set(xlabel=f"step of the longest episode ({n} steps)", ylabel="return")
    ax0.legend(fontsize=8, loc="lower left")
    ax1.hist(100 * error.clamp(0, 1), bins=20, range=(0, 100), color="tab:red")
    ax1.set(xlabel="chunk-by-chunk error (% of the exact return)", ylabel="steps")
    ax1.set_title(f"All {len(error):,} steps; left bar: 0-5% (exact ones included)", size=9)
def plot_mask(mask):
    _, ax = plt.subplots(figsize=(9, 2.6))
    ax.imshow(mask, aspect="auto", cmap="Blues", vmin=-0.3, vmax=1, interpolation="nearest")
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set(xlabel="step within the piece of trajectory", ylabel="row (a piece)", title=f"The mask of split_trajectories(chunk), {list(mask.shape)}: dark = real step")
def plot_slices(sample, rb, slice_len=16):
    stored = rb["collector", "traj_ids"]  # every stored step, oldest first
    rows = sample["index"].view(-1, slice_len)
    names = {t: "ABCDEFGH"[k] for k, t in enumerate(dict.fromkeys(stored[rows[:, 0]].tolist()))}
    _, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.1))
    for y, r in enumerate(rows):
        episode = torch.nonzero(stored == stored[r[0]])[:, 0]  # its stored rows, in order
        ax.barh(y, len(episode), color="0.85", height=0.7)
        ax.barh(y, slice_len, left=int(r[0] - episode[0]), color="tab:blue", height=0.7)
    ax.set_yticks(range(len(rows)), [f"slice {y + 1}: episode {names[int(stored[r[0]])]}" for y, r in enumerate(rows)])
    ax.set(ylim=(len(rows) - 0.5, -0.5), xlabel="step within the episode (grey: the whole episode, blue: the slice)", title=f"The {len(rows)} slices of the sample, each on its episode")
def plot_values(final):
    _, ax = plt.subplots(figsize=(9, 3.2))
    for (name, pred), color in zip(final.items(), ["C2", "C3"], strict=True):
        ax.hist(pred - eval_return, bins=60, range=(-50, 40), color=color, alpha=0.6, label=name)
    ax.axvline(0, color="black", ls="--", lw=1)
    ax.set(xlabel="predicted value minus exact return", ylabel="held-out steps", title=f"The two critics' errors on the {len(eval_return):,} held-out steps")
    ax.legend(fontsize=8, loc="upper left")
# fmt: on
# sphinx_gallery_end_ignore

# %%
# 1. Real CartPole data
# ---------------------
#
# :class:`~splice.Collector` steps the environments with the policy and yields chunks of
# ``frames_per_batch`` steps, shaped ``[8, 100]``: environments first, time last. We keep
# the chunks of a short run and look at the fourth. Each step holds the observation, the
# action, and under ``"next"`` what the environment returned: the next observation, the
# reward and three end flags. ``("collector", "traj_ids")`` names each step's episode,
# which keeps its id from chunk to chunk. In the figure, each colour is an episode: ``X``
# marks where the pole fell, ``T`` a time limit, a red bar an episode cut by the chunk's
# edge, a grey arrow a row continuing an episode from the previous chunk.

collector = Collector(
    "CartPole-v1", policy, num_envs=8, frames_per_batch=800, total_frames=TOTAL,
    seed=0,
)  # fmt: skip
chunks = list(collector)
chunk = chunks[3]
# sphinx_gallery_start_ignore
plot_chunk(chunk)
# sphinx_gallery_end_ignore
chunk

# %%
# Most rows start and end in the middle of an episode: chunks have a fixed shape (the
# environments advance in lockstep, memory is allocated once), episodes any length.
#
# 2. What goes wrong without assembly
# -----------------------------------
#
# The discounted return of a step adds up the rewards that follow it in its episode,
# :math:`G_t = r_t + \gamma G_{t+1}`. The usual loop computes it backwards over a chunk,
# starting again from 0 after each ``done``. Run chunk by chunk, it also starts from 0 at
# the chunk's edge, as if every episode ended there:


def returns_chunk_by_chunk(chunk):
    reward, done = chunk["next", "reward"][..., 0], chunk["next", "done"][..., 0]
    future = torch.zeros(len(chunk))  # nothing after the chunk's edge: the mistake
    returns = torch.empty_like(reward)
    for t in reversed(range(chunk.shape[1])):
        future = reward[:, t] + GAMMA * future * ~done[:, t]
        returns[:, t] = future
    return returns


# %%
# For the exact returns we put the pieces back together: a
# :class:`~splice.TrajectoryAssembler` takes the chunks in order and returns each ended
# episode as one row, padded, with a mask (section 3), the chunk-by-chunk returns with
# the steps; :func:`splice.targets.discounted_return` does the rest.

assembler = TrajectoryAssembler()
for c in chunks:
    assembler.ingest(c.set("chunked_return", returns_chunk_by_chunk(c)))
episodes = assembler.emit()  # every episode that ended: [episodes, longest] + mask
mask = episodes["collector", "mask"]
exact = targets.discounted_return(episodes, gamma=GAMMA)[..., 0]

# %%
# CartPole pays 1 per step, so a formula checks both: a step ``n`` steps before its
# episode's end (itself included) has the return :math:`(1-\gamma^n)/(1-\gamma)`. We
# measure each error as a share of it, on every step of these episodes.

steps_left = mask.flip(-1).cumsum(-1).flip(-1)
truth = (1 - GAMMA**steps_left) / (1 - GAMMA)
error = {
    "chunk by chunk": ((truth - episodes["chunked_return"]) / truth).abs()[mask],
    "splice.targets, whole episodes": ((truth - exact) / truth).abs()[mask],
}
assert error["splice.targets, whole episodes"].max() < 1e-5  # exact, up to float32
summary = {
    name: {
        "wrong by > 1%": f"{(e > 0.01).float().mean():.0%}",
        "mean": f"{e.mean():.1%}",
    }
    for name, e in error.items()
}
# sphinx_gallery_start_ignore
plot_returns(truth, episodes["chunked_return"], mask, error["chunk by chunk"])
table(summary)
# sphinx_gallery_end_ignore

# %%
# On whole episodes the returns are exact. Chunk by chunk they are wrong on every step
# before a chunk's edge in an episode the edge cut, a large share of a real run, and the
# error reaches far back: a step :math:`k` steps before the edge misses :math:`\gamma^k`
# of the return from the edge on (:math:`\gamma^{50} = 0.36`). Left: the longest
# episode, whose chunk-by-chunk return drops to 1 at every chunk edge. Value targets
# (TD(λ), GAE) have the same problem; a chunk avoids it by bootstrapping at its edge
# (section 4; :ref:`tutorial 3 <sphx_glr_tutorials_tutorial_3_value_targets.py>`).
#
# 3. ``split_trajectories``: padded or nested
# -------------------------------------------
#
# :func:`~splice.split_trajectories` regroups the steps of a batch by trajectory id: one
# row per trajectory, padded with zeros (and the id ``-1``) to the longest, and a mask
# ``("collector", "mask")``, True on real steps. Anything computed over time must use
# it: ``x[mask]`` gives back exactly the real steps; a sum over a row is right (padding
# adds 0), a mean is not. On one chunk, the rows are the pieces of episodes it holds:

pieces = split_trajectories(chunk)
real_steps = pieces["observation"][pieces["collector", "mask"]]
# sphinx_gallery_start_ignore
plot_mask(pieces["collector", "mask"])
# sphinx_gallery_end_ignore
pieces.batch_size, real_steps.shape  # the chunk's 800 steps, grouped by trajectory

# %%
# Padding costs memory: every row is as long as the longest. With ``as_nested=True`` each
# key holds a nested tensor instead, rows of their own length (the ``-1`` in its batch
# size), with a nested mask. We compare both on all the chunks, each episode one row
# (times: the best of five runs, measured when this page was built).

stacked = torch.cat(chunks)  # all the chunks as rows: [96, 100]


def megabytes(td):
    leaves = td.values(include_nested=True, leaves_only=True)
    return sum(x.values().nbytes if x.is_nested else x.nbytes for x in leaves) / 1e6


summary = {
    "the chunks": {"batch size": list(stacked.shape), "MB": megabytes(stacked)}
}
for name, nested in [("padded", False), ("nested", True)]:
    out = split_trajectories(stacked, as_nested=nested)
    build = lambda n=nested: split_trajectories(stacked, as_nested=n)  # noqa: E731
    summary[name] = {"batch size": list(out.shape), "MB": megabytes(out)}
    summary[name]["ms to build"] = 1e3 * min(timeit.repeat(build, number=1))
# sphinx_gallery_start_ignore
table(summary)
# sphinx_gallery_end_ignore

# %%
# Nested output takes about the memory of the input, padded output more, the more so as
# episode lengths vary. But nested output is slower to build, and most computations
# (recurrent networks, :mod:`splice.targets`) want a regular tensor: compute on padded
# output; keep or move variable-length episodes as nested output.
#
# 4. done, terminated, truncated, and the collector's cut
# -------------------------------------------------------
#
# * ``("next", "terminated")``: the episode reached a terminal state (the pole fell).
#   Nothing comes after it: **do not bootstrap**.
# * ``("next", "truncated")``: something outside the task stopped the episode, here the
#   time limit. The state it stopped in still has a value: **bootstrap** from it.
# * ``("next", "done")``: ``terminated or truncated``. It says where an episode's steps
#   end, not whether to bootstrap.
# * ``("collector", "cut")``: the chunk's edge cut the episode. Nothing happened in the
#   environment: the episode goes on in the next chunk, under the same id, and the cut
#   step's ``("next", "observation")`` is the first observation of the next chunk.

for a, b in itertools.pairwise(chunks):  # a chunk and the next one
    cut = a["collector", "cut"][:, -1]
    assert torch.equal(a["next", "observation"][cut, -1], b["observation"][cut, 0])
flags = [("next", "terminated"), ("next", "truncated"), ("collector", "cut")]
{flag: int(stacked[flag].sum()) for flag in flags}  # steps that carry each flag

# %%
# No episode reached the time limit here. To see every kind of ending side by side, we
# collect one more chunk with a limit of 60 steps, twice: as above, and with
# ``set_truncated=True``, TorchRL's option that also marks a cut step ``truncated`` and
# ``done``. :func:`~splice.split_trajectories` gives one row per piece; we read each
# piece's last real step and show one piece of each kind:


def last_steps(chunk):  # the last real step of every piece of trajectory in a chunk
    pieces = split_trajectories(chunk)
    return pieces[torch.arange(len(pieces)), pieces["collector", "mask"].sum(1) - 1]


keys = [("next", "done"), ("next", "terminated"), ("next", "truncated")]
keys.append(("collector", "cut"))
last = {}  # set_truncated -> [pieces, 4]: done, terminated, truncated, cut
for set_truncated in (False, True):
    one_chunk = Collector(
        "CartPole-v1", policy, num_envs=8, frames_per_batch=800, total_frames=800, seed=3,
        env_kwargs={"max_episode_steps": 60}, set_truncated=set_truncated,
    )  # fmt: skip
    ends = last_steps(next(iter(one_chunk)))
    columns = [ends[k].reshape(len(ends), -1)[:, 0] for k in keys]  # [pieces] each
    last[set_truncated] = torch.stack(columns, 1)
done, terminated, truncated, cut = last[False].T
kinds = {  # the first piece of each kind
    "the pole fell": last[False][terminated][0],
    "time limit": last[False][truncated & ~cut][0],
    "cut by the chunk's edge": last[False][cut][0],
    "cut, with set_truncated=True": last[True][last[True][:, 3]][0],
}
# sphinx_gallery_start_ignore
assert {k: v.tolist() for k, v in kinds.items()} == {"the pole fell": [True, True, False, False], "time limit": [True, False, True, False], "cut by the chunk's edge": [False, False, False, True], "cut, with set_truncated=True": [True, False, True, True]}  # fmt: skip
assert not stacked["next", "truncated"].any()  # "no episode reached the time limit"
table({k: dict(zip(["done", "terminated", "truncated", "cut"], v.tolist(), strict=True)) for k, v in kinds.items()})  # fmt: skip
# sphinx_gallery_end_ignore

# %%
# A piece the chunk's edge cut ends with ``cut`` and nothing else: its episode did not
# end, so its last step is not ``done``, and the episode goes on in the next chunk under
# the same id. With ``set_truncated=True`` (for code written for TorchRL, which
# bootstraps wherever ``truncated`` is set) the same step is ``truncated`` and ``done``
# too, and ``cut`` still tells it from a real time limit, which is ``truncated`` without
# ``cut``. Only the pole falling is ``terminated``.
#
# **The last value of a cut trajectory.** A chunk cannot know the rewards after its edge,
# but it has the state they start from: the target at a cut step bootstraps from its
# value, :math:`r + \gamma V(s')` with :math:`s'` the step's ``("next", "observation")``,
# as at a time limit, and so does an episode still running when collection stops (marked
# cut, section 5). :mod:`splice.targets` does this given the values, e.g.
# ``targets.gae(chunk, value, next_value, gamma=GAMMA, lmbda=0.95)``; section 7 trains
# that way. The rule: **bootstrap unless terminated**.
#
# 5. Whole episodes with ``trajs_per_batch``
# ------------------------------------------
#
# With ``trajs_per_batch=N`` the collector does the assembly itself: it joins each
# episode's pieces and yields ``N`` whole episodes at a time, padded with a mask as in
# section 3, each from a reset to where the environment ended it. When ``total_frames``
# is reached, a last output holds any whole episodes left over and the episodes still
# running, each marked ``("collector", "cut")`` on its last step so that it cannot pass
# for a whole episode (``drop_incomplete=True`` drops them instead).

collector = Collector(
    "CartPole-v1", policy, num_envs=8, frames_per_batch=800, total_frames=TOTAL, seed=1,
    trajs_per_batch=8,
)  # fmt: skip
outputs = list(collector)
frames_out = sum(int(out["collector", "mask"].sum()) for out in outputs)
assert frames_out == collector.frames  # nothing collected is lost
[out["collector", "mask"].sum(1).tolist() for out in outputs]  # episode lengths

# %%
# 6. A replay buffer of episodes, sampled in slices
# -------------------------------------------------
#
# A sequence model or a multi-step target trained off-policy needs consecutive steps of
# one episode. We store the episodes above (``extend`` drops the padding) in a
# :class:`~splice.ReplayBuffer` whose :class:`~splice.SliceSampler` draws 16-step slices.

rb = ReplayBuffer(
    storage=LazyTensorStorage(frames_out),
    sampler=SliceSampler(slice_len=16, end_key=("next", "done")),
    batch_size=4 * 16,  # 4 slices of 16 steps
)
for out in outputs:
    rb.extend(out)
sample = rb.sample()
ids = sample["collector", "traj_ids"]
assert (ids.view(4, 16) == ids.view(4, 16)[:, :1]).all()  # one episode per slice
new_id_at = torch.nonzero(ids.diff())[:, 0] + 1
# sphinx_gallery_start_ignore
plot_slices(sample, rb)
# sphinx_gallery_end_ignore
new_id_at, torch.nonzero(sample["next", "truncated"][:, 0])[:, 0]  # and truncated at

# %%
# The sample is flat: four 16-step slices, one after the other, each in one episode, so
# the id changes only where a new slice starts, at 16, 32 or 48 (unless neighbours share
# an episode). Each slice's last step is marked ``truncated`` (not an
# episode's end: bootstrap there), its first ``is_init``. ``end_key`` names the flag that
# ends a trajectory in data without ids; splice's ids take precedence. In the figure,
# letters stand for the ids, 13-digit numbers here: each collector draws ids from a range
# of its own, so two never issue the same id (:doc:`../data_contract`).
#
# By default (``weighting="trajectory"``) the sampler picks an episode uniformly, then a
# position in it: steps of short episodes are sampled more often. With
# ``weighting="transition"`` every step followed by at least 15 steps of its episode is
# equally likely to start a slice, so an episode's first and last 15 steps are sampled
# less than its middle. With ``strict_length=False`` too, every stored step may start a
# slice (cut short at its episode's end): only the first 15 steps are sampled less.
#
# 7. Collecting in the background while training
# -----------------------------------------------
#
# :meth:`Collector.start() <splice.Collector.start>` runs the collection in a background
# thread that writes every chunk into a replay buffer while our code samples and trains
# two small value networks (critics) on the same samples, with TD(λ) targets from
# :func:`splice.targets.td_lambda_return`. One bootstraps wherever the data stops without
# a termination, here at each slice's end (section 4); the other takes ``done`` for the
# terminal flag: section 2's mistake. (Transition weighting without strict length samples
# the steps just before the pole falls, the only ones whose targets say a state is bad,
# as often as the others.)

terminal_flag = {"bootstraps at slice ends": "terminated", "done as terminal": "done"}
critics = {
    n: nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))
    for n in terminal_flag
}
optimizer = torch.optim.Adam(nn.ModuleList(critics.values()).parameters(), lr=1e-2)
sampler = SliceSampler(slice_len=16, weighting="transition", strict_length=False)
rb = ReplayBuffer(storage=LazyTensorStorage(50_000), sampler=sampler, batch_size=256)
collector = Collector(  # the thread stops by itself after 40 chunks
    "CartPole-v1", policy, num_envs=8, frames_per_batch=800, total_frames=32_000, seed=2,
    replay_buffer=rb,
)  # fmt: skip
collector.start()
while len(rb) == 0:  # wait for the first chunk
    time.sleep(0.01)
for _ in range(UPDATES):
    data = rb.sample()  # up to 16 slices of 16 steps
    loss = 0
    for name, critic in critics.items():
        with torch.no_grad():
            next_value = critic(data["next", "observation"])
        keys = targets.TargetKeys(terminated=("next", terminal_flag[name]))
        target = targets.td_lambda_return(
            data, next_value, gamma=GAMMA, lmbda=0.95, keys=keys
        )
        loss = loss + nn.functional.mse_loss(critic(data["observation"]), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
collector.shutdown()

# %%
# We test both critics on steps they never saw, with exact returns: section 5's whole
# episodes in which the pole fell.

fell = [out[out["next", "terminated"].any(1)[:, 0]] for out in outputs[:-1]]
held_out = torch.cat([out[out["collector", "mask"]] for out in fell])  # their steps
eval_return = targets.discounted_return(held_out, gamma=GAMMA)[..., 0]
with torch.no_grad():
    final = {n: c(held_out["observation"])[:, 0] for n, c in critics.items()}
summary = {"exact returns": {"mean value": eval_return.mean()}}
for name, p in final.items():
    mean_error = (p - eval_return).abs().mean()
    summary[name] = {"mean value": p.mean(), "mean error": mean_error}
return_of_16_steps = (1 - GAMMA**16) / (1 - GAMMA)
assert final["done as terminal"].max() < return_of_16_steps
# sphinx_gallery_start_ignore
plot_values(final)
table(summary)
# sphinx_gallery_end_ignore

# %%
# The critic that bootstraps at slice ends learns returns that run past its slices, as
# far as the episode goes: its mean prediction is close to the mean exact return, its
# errors on both sides of 0 (one action in four is random, so no critic predicts each
# return exactly). The other only ever sees rewards up to a slice's end: it never
# predicts more than the return of 16 steps, :math:`(1-\gamma^{16})/(1-\gamma) = 13.8`,
# and errs far below 0 on almost every step, however long it trains.
#
# Conclusion
# ----------
#
# **We have covered:**
#
# * fixed-size chunks cut most episodes: returns computed chunk by chunk are wrong on a
#   large share of a real run's steps; :mod:`splice.targets` on whole episodes is exact;
# * :func:`~splice.split_trajectories`, padded with a mask or nested, and their costs;
# * ``done``, ``terminated``, ``truncated`` and ``cut``: bootstrap unless terminated;
# * whole episodes from ``trajs_per_batch``, stored in a replay buffer and sampled in
#   slices that never cross an episode's end;
# * background collection with :meth:`~splice.Collector.start`, and a value network that
#   learns the right values only if its targets know where episodes really end.
#
# **Useful resources:**
#
# * :ref:`Tutorial 2 <sphx_glr_tutorials_tutorial_2_recurrent_dqn.py>`: a recurrent agent
#   trained on slices like these; :ref:`tutorial 3
#   <sphx_glr_tutorials_tutorial_3_value_targets.py>`: value targets, measured;
# * :doc:`../data_contract`: every key of a batch, the bootstrap table, trajectory ids and
#   their id spaces, the layouts and the cat round trip, gymnasium's autoreset modes;
# * :doc:`../value_targets`, and :doc:`../coming_from_torchrl` for TorchRL users;
# * the :doc:`API reference <../api>`, e.g. :class:`~splice.Collector`,
#   :class:`~splice.TrajectoryAssembler`, :class:`~splice.SliceSampler`.
