"""
Trajectory assembly: from fixed-size chunks to whole episodes
=============================================================

A collector hands experience to training code in chunks of a fixed size, so nearly every
episode is cut across chunks. Code that needs whole episodes, or sequences that stay
inside one episode, has to put the pieces back together. This tutorial shows what that
involves, on data collected from gymnasium's CartPole.

**In this tutorial you will learn:**

* what a raw collector batch holds, and why collectors return fixed-size chunks;
* what goes wrong when a sequence model reads raw chunks: episodes glued together and
  hidden state that leaks from one episode into the next;
* how :func:`~splice.split_trajectories` regroups a batch into one row per trajectory
  with a mask, and what padded and nested outputs cost in memory and time;
* the difference between *done*, *terminated*, *truncated* and a *collector cut*, and
  which value to bootstrap from at the last step of each;
* how ``trajs_per_batch`` yields complete episodes, and what happens to the episodes
  still running when collection ends;
* how a :class:`~splice.ReplayBuffer` with a :class:`~splice.SliceSampler` samples
  sequences that never cross an episode end, even when the episode arrived in several
  chunks;
* how to collect in a background thread with :meth:`~splice.Collector.start` while
  training;
* how splice handles gymnasium's three autoreset modes.

Every claim on this page is checked by an ``assert`` in the code below, which runs each
time the documentation is built.
"""

# %%
# Setup
# -----
#
# We use eight CartPole environments stepped in lockstep by a gymnasium
# ``SyncVectorEnv``. We shorten the time limit from 500 to 200 steps, so that this short
# run contains episodes that the time limit ends (*truncated*) as well as episodes in
# which the pole falls (*terminated*).
#
# The documentation is built at two sizes: ``SPLICE_DOCS_BUDGET=small`` (what the test
# suite builds) and ``full`` (the default); only the amount of data changes. The helpers
# that draw the figures and tables are left out of this page; they are in the
# downloadable script.

import itertools
import os
import time

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict

from splice import (
    Collector,
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
    cat_trajectories,
    split_trajectories,
)

SMALL = os.environ.get("SPLICE_DOCS_BUDGET", "full") == "small"
N_ENVS = 8  # environments stepped together
T = 100  # steps per environment in one batch
N_BATCHES = 6 if SMALL else 12  # batches in the main stream of data
torch.manual_seed(0)
torch.set_num_threads(1)  # tiny networks run fastest on one CPU thread


def make_env(mode=AutoresetMode.NEXT_STEP):
    """Eight CartPole envs, time limit 200, in the given autoreset mode."""
    return gym.make_vec(
        "CartPole-v1",
        num_envs=N_ENVS,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": mode},
        max_episode_steps=200,
    )


# sphinx_gallery_start_ignore
# Helpers for the page: small HTML tables (no pandas here) and the figures.
plt.rcParams.update(
    {"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False}
)


class Table:
    """A small table that renders as HTML in the docs (and as markdown in a terminal)."""

    def __init__(self, header, rows):
        self.header = [str(h) for h in header]
        self.rows = [[_fmt(v) for v in row] for row in rows]

    def _repr_html_(self):
        head = "".join(f"<th>{h}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>"
            for row in self.rows
        )
        return f'<table class="splice-table"><tr>{head}</tr>{body}</table>'

    def __repr__(self):
        lines = ["| " + " | ".join(self.header) + " |"]
        lines.append("|" + "---|" * len(self.header))
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def _fmt(v):
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, bool | np.bool_):
        return "yes" if v else "no"
    if isinstance(v, float | np.floating):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int | np.integer):
        return f"{v:,}"
    return str(v)


def plot_batch(batch):
    """Each env row as coloured episodes, with their ends and the batch edges marked."""
    ids = batch["collector", "traj_ids"]
    term = batch["next", "terminated"][..., 0]
    trunc = batch["next", "truncated"][..., 0]
    cut, is_init = batch["collector", "cut"], batch["is_init"][..., 0]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    palette = plt.get_cmap("tab20")
    for row in range(ids.shape[0]):
        run_ids, run_len = torch.unique_consecutive(ids[row], return_counts=True)
        start = 0
        for traj, length in zip(run_ids.tolist(), run_len.tolist(), strict=True):
            end = start + length - 1
            ax.barh(row, length, left=start, color=palette(traj % 20), height=0.8)
            ax.text(
                start + length / 2, row, str(traj), ha="center", va="center", size=7
            )
            if term[row, end] or trunc[row, end]:
                mark = "X" if term[row, end] else "T"
                ax.text(end + 0.5, row, mark, ha="center", va="center", weight="bold")
            if cut[row, end]:
                ax.plot(
                    [end + 1] * 2, [row - 0.45, row + 0.45], color="crimson", lw=3
                )
            if start == 0 and not is_init[row, 0]:
                ax.plot([-1.2], [row], marker="<", color="grey", markersize=7)
            start += length
    ax.set_xlim(-2.5, ids.shape[1] + 1.5)
    ax.set_yticks(range(ids.shape[0]), [f"env {r}" for r in range(ids.shape[0])])
    ax.invert_yaxis()
    ax.set_xlabel("time step within the batch")
    ax.set_title(f"One {list(ids.shape)} collector batch of CartPole")
    fig.tight_layout()


def plot_hidden_gap(gap, boundaries, row):
    fig, ax = plt.subplots(figsize=(9, 2.8))
    ax.plot(gap.numpy(), color="tab:blue")
    for b in boundaries:
        ax.axvline(b, color="crimson", ls="--", lw=1)
    ax.set_xlabel(f"time step within row {row} (dashed: a new episode starts)")
    ax.set_ylabel("|h_raw - h_split|")
    ax.set_title("GRU hidden state: raw row vs. each episode separately")
    fig.tight_layout()


def plot_mask(mask):
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.imshow(mask.numpy(), aspect="auto", cmap="Blues", vmin=-0.3, vmax=1)
    ax.set_xlabel("step within the trajectory")
    ax.set_ylabel("trajectory (row)")
    ax.set_title(
        f"Mask of split_trajectories(batch): {list(mask.shape)}, dark = real"
    )
    fig.tight_layout()


def plot_episode_lengths(out):
    lengths = out["collector", "mask"].sum(1)
    last = out[torch.arange(len(lengths)), lengths - 1]
    fig, ax = plt.subplots(figsize=(9, 2.6))
    ax.barh(range(len(lengths)), lengths.numpy(), color="tab:green")
    for i, length in enumerate(lengths.tolist()):
        end = "T" if last["next", "truncated"][i] else "X"
        traj = last["collector", "traj_ids"][i].item()
        ax.text(length + 2, i, f"id {traj}, ends: {end}", va="center", size=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 250)
    ax.set_xlabel("episode length (X: terminated, T: truncated)")
    ax.set_ylabel("row")
    ax.set_title(f"First output of trajs_per_batch={len(lengths)}: {list(out.shape)}")
    fig.tight_layout()


def plot_slices(whole, positions, chunk_edges, slice_len):
    shown = sorted({k for k, _ in positions})
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(shown) + 1.2))
    for y, k in enumerate(shown):
        length = int(whole["collector", "mask"][k].sum())
        ax.barh(y, length, color="0.88", height=0.8)
        for e in chunk_edges[k]:
            ax.plot([e, e], [y - 0.4, y + 0.4], color="crimson", lw=1.5)
        starts = [start for kk, start in positions if kk == k]
        for j, start in enumerate(starts):
            level = y - 0.25 + 0.15 * (j % 4)
            ax.plot(
                [start, start + slice_len - 1], [level] * 2, color="tab:blue", lw=2
            )
    labels = [f"id {int(whole['collector', 'traj_ids'][k, 0])}" for k in shown]
    ax.set_yticks(range(len(shown)), labels, fontsize=7)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlabel(
        "step within the episode (grey: episode, red: batch edges, blue: slices)"
    )
    ax.set_title(
        f"{len(positions)} sampled slices of {slice_len} steps on their episodes"
    )
    fig.tight_layout()


def plot_training(written, losses):
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 2.8))
    ax0.step(range(len(written)), written, color="tab:green", where="post")
    ax0.set_xlabel("training step")
    ax0.set_ylabel("steps written to the buffer")
    ax0.set_title("The collector writes while we train")
    ax1.semilogy(losses, color="tab:blue", lw=0.8)
    ax1.set_xlabel("training step")
    ax1.set_ylabel("next-observation MSE")
    ax1.set_title("Training on the slices sampled meanwhile")
    fig.tight_layout()


def best_time(fn, repeat=5):
    """The fastest of ``repeat`` runs of ``fn()``, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


# sphinx_gallery_end_ignore

# %%
# The policy: push the cart towards the side the pole is falling to, except that about
# one step in four takes the other action. This keeps the pole up for a while, so
# episodes last from a few dozen steps to the 200-step limit. The "noise" is a fixed
# function of the observation rather than a random draw, so the whole run depends only
# on the environment seed; the last section needs that.
#
# A splice policy is any callable that takes a :class:`~tensordict.TensorDict` holding
# the ``"observation"`` of every env and writes an ``"action"``.

NOISE = np.array([12.9898, 78.233, 37.719, 4.581], dtype=np.float32)


def policy(td):
    # observation [N_ENVS, 4]: cart position, cart velocity, pole angle, angular velocity
    obs = td["observation"].numpy()
    push_right = obs[..., 2] + 0.5 * obs[..., 3] > 0
    flip = np.modf(np.abs(np.sin(obs @ NOISE) * 43758.5453))[0] < 0.25
    td["action"] = torch.from_numpy((push_right ^ flip).astype(np.int64))
    return td


# %%
# 1. A raw collector batch
# ------------------------
#
# :class:`~splice.Collector` steps the environments with the policy and yields batches
# of ``frames_per_batch`` steps. With 8 environments and 800 frames per batch, each batch
# holds 100 consecutive steps of each environment: its shape is ``[8, 100]``,
# environments first, time last. We collect a few batches and look at the fourth one: by
# then the episodes of the eight environments have drifted apart.

collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=N_ENVS * T * N_BATCHES,
    seed=0,
)
batches = list(collector)
collector.shutdown()
batch = batches[3]
batch

# %%
# Besides the observation, action, reward and the three end flags, every step carries a
# trajectory id in ``("collector", "traj_ids")`` and a ``("collector", "cut")`` flag.
# Here is what the 8 rows of this batch contain. Each colour is one episode (the number
# is its id); ``X`` marks a step where the pole fell (terminated), ``T`` a step where the
# time limit ended the episode (truncated), a red bar an episode that the batch edge cut
# while it was still running, and a grey arrow an episode that began in an earlier
# batch.

plot_batch(batch)

# %%
# The same in numbers. Most rows start in the middle of an episode and end in the middle
# of another, and a row often holds several episodes one after the other.

ids = batch["collector", "traj_ids"]
is_init = batch["is_init"][..., 0]
terminated = batch["next", "terminated"][..., 0]
truncated = batch["next", "truncated"][..., 0]
done = batch["next", "done"][..., 0]
cut = batch["collector", "cut"]

Table(
    [
        "row",
        "episodes",
        "starts mid-episode",
        "terminated",
        "truncated",
        "cut at the end",
    ],
    [
        [f"env {r}", len(ids[r].unique()), not is_init[r, 0]]
        + [terminated[r].sum(), truncated[r].sum(), cut[r, -1]]
        for r in range(N_ENVS)
    ],
)

# %%
# The collector marks a cut exactly where the last step of a row is not the end of an
# episode, and nowhere else; ``done`` is ``terminated | truncated``:

assert torch.equal(cut[:, -1], ~done[:, -1]) and not cut[:, :-1].any()
assert torch.equal(done, terminated | truncated)
assert (~is_init[:, 0]).sum() > N_ENVS / 2 and cut[:, -1].sum() > N_ENVS / 2

# %%
# **Why fixed-size chunks?** The environments advance in lockstep, one vector step at a
# time, so the natural unit of collection is "``T`` steps of every environment". A batch
# of fixed shape can be written into memory allocated once, costs the same time and
# memory every iteration, and lets the trainer update the policy at a steady rhythm.
# Episodes, on the other hand, have any length. Here are all the episodes of the batches
# we collected (the whole stream of data), put back together:

# [8, 100 * N_BATCHES]: each row is one env's whole history
stream = torch.cat(batches, dim=1)
# one row per episode (explained in section 3)
whole = split_trajectories(stream)
lengths = whole["collector", "mask"].sum(1)
ended = whole["next", "done"].any(1)[:, 0]  # False: still running at the end
Table(
    ["episodes that ended", "shortest", "median", "longest", "hit the time limit"],
    [
        [
            ended.sum(),
            lengths[ended].min(),
            lengths[ended].median(),
            lengths[ended].max(),
        ]
        + [whole["next", "truncated"].any(1).sum()]
    ],
)

# %%
# Waiting for whole episodes would make the size of every batch unpredictable, and a
# slow environment would hold up all the others. So collectors return chunks, and the
# trajectory ids say which steps belong together. An episode keeps its id from one batch
# to the next, so concatenating the batches along time and splitting by id, as we just
# did, gives whole episodes back: every row of ``whole`` starts with a reset, and the
# episodes that ended end at their last step and nowhere else.

last_done = whole["next", "done"][torch.arange(len(lengths)), lengths - 1, 0]
assert whole["is_init"][:, 0].all()
assert torch.equal(last_done, ended)
assert torch.equal(whole["next", "done"][..., 0].sum(1), ended.long())

# %%
# 2. What goes wrong with raw chunks
# ----------------------------------
#
# A row of a raw batch looks like one sequence of 100 steps, but it is several episodes
# glued together. A model that reads the row as one sequence treats the first
# observation of a new episode as if it followed the last observation of the previous
# one. For a feed-forward network on single steps this does not matter. For a sequence
# model, a recurrent network or a transformer, it does: its state at the start of an
# episode should depend on nothing that happened before.
#
# Let us run a GRU over one row of the batch, once over the raw row and once over each
# trajectory of that row separately, each starting from a zero hidden state (which is
# what :func:`~splice.split_trajectories` makes easy). We take the row that holds the
# most episodes.

row = int(torch.tensor([len(r.unique()) for r in ids]).argmax())
gru = torch.nn.GRU(input_size=4, hidden_size=32, batch_first=True)
with torch.no_grad():
    # the glued row, as one sequence: [1, 100, 32]
    h_raw, _ = gru(batch["observation"][row].unsqueeze(0))
    # one row per episode, each starting from h = 0
    pieces = split_trajectories(batch[row])
    h_pieces, _ = gru(pieces["observation"])
    # back to the row's 100 steps, in order
    h_split = h_pieces[pieces["collector", "mask"]]
gap = (h_raw[0] - h_split).norm(dim=-1)
boundaries = (torch.nonzero(ids[row, 1:] != ids[row, :-1])[:, 0] + 1).tolist()
plot_hidden_gap(gap, boundaries, row)

# %%
# Up to the first episode boundary both runs see the same inputs from the same state, so
# their hidden states agree. From the first step of the next episode on they differ: in
# the raw run, the state carried over from the previous episode changes what the network
# computes for the new one. The gap shrinks as the GRU forgets, then jumps again at the
# next boundary. A network trained on raw rows is trained on inputs it never sees when
# it acts (the collector resets its state at every episode start), and it can learn to
# use information from an episode it is no longer in.

assert boundaries, "this row holds more than one episode"
assert gap[: boundaries[0]].max() < 1e-5  # same inputs, same state: identical
assert all(gap[b] > 1e-2 for b in boundaries)  # state leaks across every boundary

# %%
# The same holds for anything computed along the time axis of a raw row: a discounted
# return summed along the row adds rewards from the next episode, and a frame stack at
# the start of an episode shows frames of the previous one.
#
# 3. ``split_trajectories`` and the mask
# --------------------------------------
#
# :func:`~splice.split_trajectories` regroups the steps of a batch into one row per
# trajectory. Rows are padded with zeros to the longest trajectory, and a boolean mask
# ``("collector", "mask")`` says which positions are real steps. It is a drop-in
# replacement for TorchRL's function of the same name (same arguments, same output keys,
# rows in the same order).

episodes = split_trajectories(batch)
mask = episodes["collector", "mask"]
episodes.batch_size

# %%
# The mask of this batch, one row per piece of trajectory (dark: real step, light:
# padding):

plot_mask(mask)

# %%
# The trajectory id of a padding position is ``-1``, never a real id (TorchRL writes 0
# there, which is also the id of the first trajectory). Here are the ids around the end
# of the three shortest rows, three real steps and three padding positions each:

shortest = mask.sum(1).argsort()[:3]
window = mask.sum(1)[shortest, None] + torch.arange(-3, 3)  # [3, 6] positions
episodes["collector", "traj_ids"][shortest[:, None], window]

# %%
# Every value on a padding position is 0, so any statistic over time must use the mask:
# ``reward.sum(1)`` happens to be right (padding adds 0), but ``reward.mean(1)`` is not,
# and neither is a loss averaged over all positions. Divide by ``mask.sum(1)``, or index
# with ``x[mask]``, which gives back exactly the real steps.
#
# Each piece of the batch is one of two kinds at its start and one of three at its end:
# it starts with a reset (``is_init``) or continues an episode from an earlier batch,
# and it ends with the pole falling, with the time limit, or cut by the batch edge:

last_step = episodes[torch.arange(len(mask)), mask.sum(1) - 1]  # each row's last step
starts = episodes["is_init"][:, 0, 0]
term = last_step["next", "terminated"][:, 0]
ends = {
    "terminated": term,
    # gymnasium may set both at the time limit; terminated wins (no bootstrap)
    "truncated": last_step["next", "truncated"][:, 0] & ~term,
    "cut (continues in the next batch)": last_step["collector", "cut"],
}
assert (sum(e.long() for e in ends.values()) == 1).all()  # exactly one kind of end
Table(
    ["piece begins", *ends],
    [
        ["with a reset (is_init)", *[(starts & e).sum() for e in ends.values()]],
        [
            "mid-episode (earlier batch)",
            *[(~starts & e).sum() for e in ends.values()],
        ],
    ],
)

# %%
# :func:`~splice.cat_trajectories` is the inverse: it drops the padding and lays the
# trajectories end to end, the flat "cat" layout. Since every row of this batch holds its
# trajectories in order, the round trip gives back the batch flattened row by row,
# exactly:

run_lengths = torch.unique_consecutive(ids.reshape(-1), return_counts=True)[1]
assert torch.equal(mask.sum(1), run_lengths)
assert (cat_trajectories(episodes) == batch.reshape(-1)).all()

# %%
# Padded or nested?
# ~~~~~~~~~~~~~~~~~
#
# Padding costs memory: every row is as long as the longest trajectory. With
# ``as_nested=True`` the output holds nested tensors instead, one row per trajectory with
# its own length, and no padding. splice adds the mask to nested output too (TorchRL's
# nested output has none). ``as_nested=torch.jagged`` gives the jagged layout that
# PyTorch's newer nested-tensor kernels use.
#
# We compare both on the whole stream of data collected above (``[8, 600]`` steps at
# the small budget, ``[8, 1200]`` at the full one), split into whole episodes:


def nbytes(td):
    """Bytes held by the tensors of ``td`` (the values of nested tensors)."""
    leaves = td.values(include_nested=True, leaves_only=True)
    return sum(x.values().nbytes if x.is_nested else x.nbytes for x in leaves)


padded = split_trajectories(stream)
nested = split_trajectories(stream, as_nested=True)
size = {
    "input stream": nbytes(stream),
    "padded": nbytes(padded),
    "nested": nbytes(nested),
}
padding = 1 - padded["collector", "mask"].float().mean()
Table(
    ["layout", "batch size", "memory (KiB)", "x the input", "padding", "time (ms)"],
    [
        [
            "input stream",
            list(stream.shape),
            size["input stream"] / 1024,
            1.0,
            "-",
            "-",
        ],
        ["padded", list(padded.shape), size["padded"] / 1024]
        + [size["padded"] / size["input stream"], f"{padding:.0%}"]
        + [best_time(lambda: split_trajectories(stream))],
        ["nested", list(nested.shape), size["nested"] / 1024]
        + [size["nested"] / size["input stream"], "0%"]
        + [best_time(lambda: split_trajectories(stream, as_nested=True))],
    ],
)

# %%
# (Times are the fastest of five runs, measured when this page was built, on whatever
# machine built it.) The nested output is about the size of the input plus the mask; the
# padded one grows with the spread of episode lengths. Use padded output when the next
# step wants a regular ``[n, max_len]`` tensor (a recurrent network over a batch of
# sequences, a loss with a mask); use nested output to keep or move variable-length
# episodes without paying for padding.

assert size["nested"] < size["padded"]
assert nested["collector", "mask"].is_nested  # nested output has a mask too
first_real = padded[0]["observation"][padded[0]["collector", "mask"]]
assert torch.equal(nested[0]["observation"], first_real)

# %%
# 4. done, terminated, truncated, and the collector's cut
# -------------------------------------------------------
#
# Three flags come from the environment, one from the collector:
#
# * ``("next", "terminated")``: the episode reached a terminal state (the pole fell). The
#   state after this step has no future reward: **do not bootstrap**.
# * ``("next", "truncated")``: something outside the task stopped the episode, here the
#   time limit. The state after this step still has a value: **bootstrap** from it.
# * ``("next", "done")``: ``terminated | truncated``, "the episode is over". It tells
#   where an episode ends, not whether to bootstrap.
# * ``("collector", "cut")``: the collector cut the episode at the batch edge. Nothing
#   happened in the environment: done, terminated and truncated all stay False, and the
#   episode goes on in the next batch under the same id. ``("next", "observation")`` at
#   the cut step is the real next state: the first observation of the next batch.

for before, after in itertools.pairwise(batches):
    rows = before["collector", "cut"][:, -1]
    last, first = before[rows, -1], after[rows, 0]
    assert torch.equal(last["next", "observation"], first["observation"])
    assert torch.equal(last["collector", "traj_ids"], first["collector", "traj_ids"])
    assert not last["next", "done"].any() and not first["is_init"].any()

# %%
# So the last step of a piece cut at a batch edge is an ordinary step: its one-step
# target is ``r + γ V(next observation)``, like any step that is not terminal.
#
# TorchRL's collectors have an option, ``set_truncated=True``, that marks these cut steps
# as truncated (and so done), so that code which only looks at ``truncated`` bootstraps
# there. splice supports it too, and still writes the cut flag, so that a cut can be
# told apart from a real time limit. Let us collect the same data again with
# ``set_truncated=True``:

collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=N_ENVS * T * N_BATCHES,
    seed=0,
    set_truncated=True,
)
stream_st = torch.cat(list(collector), dim=1)
collector.shutdown()
st_cut = stream_st["collector", "cut"]

# %%
# The data is the same, except for truncated and done at the cut steps, and for the ids:
# a second collector draws its ids from another id space, so two collectors never share
# an id (TorchRL's collectors all start counting at 0).

assert torch.equal(st_cut, stream["collector", "cut"])
for key in [("next", "truncated"), ("next", "done")]:
    assert torch.equal(stream_st[key][..., 0], stream[key][..., 0] | st_cut)
changed = [("next", "truncated"), ("next", "done"), ("collector", "traj_ids")]
assert (stream_st.exclude(*changed) == stream.exclude(*changed)).all()
old_ids, new_ids = stream["collector", "traj_ids"], stream_st["collector", "traj_ids"]
assert not set(old_ids.unique().tolist()) & set(new_ids.unique().tolist())
old_ids[0, :3], new_ids[0, :3]

# %%
# Now the one-step TD target ``r + γ (1 - flag) V(s')`` for five kinds of step. ``V``
# here is a stand-in critic (any function of the observation would do: what matters is
# which steps bootstrap from it). The correct target bootstraps unless the step is
# terminated; the last column shows what happens if ``done`` is used as the flag
# instead.

GAMMA = 0.99


def value(obs):
    """A stand-in critic: roughly how many more steps the pole stays up (made up)."""
    return 100.0 * (1 - obs[..., 2].abs() / 0.2095).clamp(min=0)


def first_step(data, flag):
    """The first step of ``data`` (row by row, in time order) where ``flag`` holds."""
    row, t = torch.nonzero(flag)[0].tolist()
    return data[row, t]


term_flag = stream["next", "terminated"][..., 0]
trunc_flag = stream["next", "truncated"][..., 0] & ~term_flag
plain = ~(stream["next", "done"][..., 0] | stream["collector", "cut"])
kinds = {
    "inside an episode": first_step(stream, plain),
    "terminated (the pole fell)": first_step(stream, term_flag),
    "truncated (time limit)": first_step(stream, trunc_flag),
    "cut by the collector": first_step(stream, stream["collector", "cut"]),
    "cut, set_truncated=True": first_step(stream_st, st_cut),
}
rows = []
for name, step in kinds.items():
    r, v_next = (
        step["next", "reward"].item(),
        value(step["next", "observation"]).item(),
    )
    term, trunc, dn = (
        bool(step["next", k]) for k in ("terminated", "truncated", "done")
    )
    right = r + GAMMA * (1 - term) * v_next
    wrong = r + GAMMA * (1 - dn) * v_next
    rows.append([name, term, trunc, dn, bool(step["collector", "cut"]), r, v_next])
    rows[-1] += [right, wrong]
    if name.startswith("cut"):
        assert not term and right > r  # a cut step always bootstraps
Table(
    ["step", "terminated", "truncated", "done", "cut", "r", "V(s')"]
    + ["target with terminated (right)", "target with done"],
    rows,
)

# %%
# The rule that is always right: **bootstrap unless terminated.** ``done`` only says
# where an episode's steps end, and ``cut`` says that a piece is not a whole episode:
# with ``set_truncated=True``, a done-based target silently drops the bootstrap value at
# every batch edge. The :doc:`data contract <../data_contract>` page has the same table
# for every key.
#
# 5. Complete episodes with ``trajs_per_batch``
# ---------------------------------------------
#
# Some algorithms want whole episodes (Monte-Carlo returns, episodic replay,
# evaluation). With ``trajs_per_batch=N`` the collector keeps collecting fixed-size
# chunks internally, stitches each episode's pieces together, and yields ``N`` complete
# episodes at a time: every row starts at a reset and ends where the environment ended
# the episode.

TPB_FRAMES = N_ENVS * T * (5 if SMALL else 15)
collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=TPB_FRAMES,
    trajs_per_batch=N_ENVS,
    seed=1,
)
outputs = list(collector)
collector.shutdown()
outputs[0].batch_size

# %%
# Each output is padded to its longest episode, with the same mask as
# :func:`~splice.split_trajectories`. All outputs but the last hold only complete
# episodes:

for out in outputs[:-1]:
    real = out["collector", "mask"]
    last_step = out[torch.arange(out.shape[0]), real.sum(1) - 1]
    assert out["is_init"][:, 0].all()  # starts with a reset
    assert last_step["next", "done"].all()  # ends where the env ended it
    assert out["next", "done"][..., 0][real].sum() == out.shape[0]  # only there
    assert not out["collector", "cut"].any()  # no piece of an episode

plot_episode_lengths(outputs[0])

# %%
# **The end of the run.** When ``total_frames`` is reached, some episodes are still
# running. TorchRL's collector drops them silently. splice yields them, in one last
# output together with any complete episodes left over, and marks each unfinished one
# with ``("collector", "cut") = True`` on its last step, so it can never pass for a
# complete episode. (``drop_incomplete=True`` drops them instead and counts them in
# ``collector.dropped_trajs``.) Nothing that was collected is lost:

final = outputs[-1]
final_last = final[
    torch.arange(final.shape[0]), final["collector", "mask"].sum(1) - 1
]
final_cut = final_last["collector", "cut"]
assert torch.equal(final_cut, ~final_last["next", "done"][:, 0]) and final_cut.any()
frames_out = sum(int(o["collector", "mask"].sum()) for o in outputs)
assert frames_out == collector.frames == TPB_FRAMES
Table(
    ["output", "rows", "complete episodes", "unfinished (cut)", "frames"],
    [
        [
            i,
            o.shape[0],
            o["next", "done"].any(1).sum(),
            o["collector", "cut"].any(1).sum(),
        ]
        + [o["collector", "mask"].sum()]
        for i, o in enumerate(outputs)
    ],
)

# %%
# How many outputs a run yields depends on the episode lengths, so ``len(collector)``
# refuses to guess (TorchRL returns the number of raw batches, which is wrong here):

try:
    len(collector)
except TypeError as error:
    message = str(error)
message

# %%
# With ``traj_format="cat"`` the episodes come flat, one after the other, without
# padding: a ``[sum of lengths]`` batch whose ids change exactly where an episode ends.

collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    trajs_per_batch=4,
    traj_format="cat",
    seed=1,
)
flat = next(iter(collector))
collector.shutdown()
run_ids, run_len = torch.unique_consecutive(
    flat["collector", "traj_ids"], return_counts=True
)
done_at = torch.nonzero(flat["next", "done"][..., 0])[:, 0]
assert len(run_ids) == len(run_ids.unique()) == 4  # one run per episode
assert torch.equal(done_at + 1, run_len.cumsum(0))  # done exactly at each run's end
flat.batch_size, run_len

# %%
# 6. Replay: slices that respect episode boundaries
# -------------------------------------------------
#
# Off-policy training of a sequence model (a recurrent Q-network, a transformer) samples
# short sequences of consecutive steps from a replay buffer. A slice must stay inside
# one episode. :class:`~splice.ReplayBuffer` with a :class:`~splice.SliceSampler` does
# this: the buffer records, as each batch is written, which trajectory and which step
# every stored row holds, so the sampler never needs to scan the storage, and a slice
# may span the chunks of one episode even though they were written far apart.
#
# We store the raw ``[8, 100]`` batches of section 1 as they are, then sample 32 slices
# of 24 steps, shaped ``[32, 24]`` (``as_sequences=True``; TorchRL's flat layout is the
# default).

SLICE = 24
rb = ReplayBuffer(
    storage=LazyTensorStorage(stream.numel()),  # room for the whole stream
    sampler=SliceSampler(slice_len=SLICE, as_sequences=True, seed=0),
    batch_size=32 * SLICE,
)
for b in batches:
    rb.extend(b)
sample = rb.sample()
sample["collector", "traj_ids"][:6]

# %%
# Each slice holds one trajectory id. Like TorchRL's ``TensorDictReplayBuffer``, the
# sample marks the last step of every slice as truncated (a slice end is not an episode
# end: a value target must bootstrap there) and its first step as ``is_init`` (a
# recurrent network starts from a fresh or stored state there).

slice_ids = sample["collector", "traj_ids"]
assert (slice_ids == slice_ids[:, :1]).all()
assert sample["next", "truncated"][:, -1].all() and sample["is_init"][:, 0].all()

# %%
# Where do the slices fall? For each sampled slice we find its episode among the whole
# episodes of the stream, and the step at which it starts (by matching its first
# observation). We check that the slice is that episode's next 24 steps, and draw it on
# the episode's timeline. Red ticks show where batch edges cut the episode into chunks.

episode_row = {int(i): k for k, i in enumerate(whole["collector", "traj_ids"][:, 0])}
positions = []
for s in range(sample.shape[0]):
    k = episode_row[int(slice_ids[s, 0])]
    ep_obs = whole["observation"][k][whole["collector", "mask"][k]]
    start = int(torch.nonzero((ep_obs == sample["observation"][s, 0]).all(-1))[0, 0])
    assert torch.equal(ep_obs[start : start + SLICE], sample["observation"][s])
    assert start + SLICE <= len(ep_obs)  # never runs past the episode's end
    positions.append((k, start))

# where the batch edges fall within each episode: at multiples of T in stream time
stream_ids = stream["collector", "traj_ids"]
chunk_edges = {}
for k, _ in positions:
    t0 = int(torch.nonzero(stream_ids == whole["collector", "traj_ids"][k, 0])[0, 1])
    length = int(lengths[k])
    chunk_edges[k] = [
        e - t0 for e in range(T, stream.shape[1], T) if 0 < e - t0 < length
    ]
spanning = sum(any(s < e < s + SLICE for e in chunk_edges[k]) for k, s in positions)
assert spanning > 0  # some slices join two chunks of an episode
plot_slices(whole, positions, chunk_edges, SLICE)

# %%
# Every slice lies inside its episode, and some cross a red tick: their steps came from
# two different batches, stored at distant positions of the buffer.
#
# The buffer accepts every layout the collector produces, not only raw ``[B, T]``
# batches: the padded output of ``trajs_per_batch`` can be written directly (TorchRL's
# ``SliceSampler`` fails on it with its default storage), and the padding is dropped.
# Given a ``replay_buffer``, the collector of section 5 writes each output itself (and
# still yields it); the last output brings the unfinished episodes, marked cut.

rb_episodes = ReplayBuffer(
    storage=LazyTensorStorage(TPB_FRAMES),
    sampler=SliceSampler(slice_len=SLICE, as_sequences=True, seed=0),
    batch_size=8 * SLICE,
)
collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=TPB_FRAMES,
    trajs_per_batch=N_ENVS,
    replay_buffer=rb_episodes,
    seed=1,
)
n_outputs = len(list(collector))
collector.shutdown()
assert n_outputs == len(outputs)  # the same run as in section 5
assert len(rb_episodes) == TPB_FRAMES  # exactly the real steps, no padding
assert (rb_episodes.sample()["index"] >= 0).all()  # no padding sampled

# %%
# By default every trajectory is equally likely to be picked (TorchRL's rule), so a step
# of a short episode is sampled more often than a step of a long one;
# ``SliceSampler(weighting="transition")`` makes every stored step equally likely to end
# a slice instead.
#
# 7. Collecting in the background
# -------------------------------
#
# :meth:`Collector.start() <splice.Collector.start>` runs the collection loop in a
# background thread that writes every batch to the replay buffer, while your code
# samples from it and trains. The thread stops by itself at ``total_frames``, or when
# :meth:`~splice.Collector.shutdown` is called; a batch being collected is always
# finished and written, never thrown away.
#
# Here the "training" is a small GRU that learns to predict the next observation from
# 16-step slices, one gradient step per sample. The collector has no frame budget
# (``total_frames=-1``): it writes batch after batch into a buffer of fixed capacity (the
# oldest steps are overwritten) until we shut it down after the last training step.

N_TRAIN = 40 if SMALL else 200
rb = ReplayBuffer(
    storage=LazyTensorStorage(50_000),
    sampler=SliceSampler(slice_len=16, as_sequences=True, seed=0),
    batch_size=16 * 16,
)
collector = Collector(
    make_env(),
    policy,
    frames_per_batch=N_ENVS * T,
    total_frames=-1,
    replay_buffer=rb,
    seed=2,
)


class NextObsModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(5, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, obs, action):
        h, _ = self.gru(torch.cat([obs, action.unsqueeze(-1).float()], -1))
        return obs + self.head(h)  # predict the change of the observation


model = NextObsModel()
optim = torch.optim.Adam(model.parameters(), lr=3e-3)
written, losses = [], []

collector.start()
while len(rb) == 0:  # wait for the first batch
    time.sleep(0.001)
for _ in range(N_TRAIN):
    data = rb.sample()  # [16, 16]
    pred = model(data["observation"], data["action"])
    loss = torch.nn.functional.mse_loss(pred, data["next", "observation"])
    optim.zero_grad()
    loss.backward()
    optim.step()
    written.append(rb.write_count)
    losses.append(loss.item())
collector.shutdown()  # stops after the batch being collected, which is written too

# every collected batch is in the buffer, and only whole batches
assert rb.write_count == collector.frames and rb.write_count % (N_ENVS * T) == 0
assert written == sorted(written) and not collector.running
plot_training(written, losses)

# %%
# The collector thread and the training loop share one Python process (as with
# TorchRL's ``Collector.start()``), so they take turns; how many frames the collector
# writes per training step depends on how fast each side is. With a finite
# ``total_frames`` the thread stops by itself and :meth:`~splice.Collector.wait` blocks
# until it has. :meth:`~splice.Collector.pause` stops the thread after the current batch
# (also as a ``with collector.pause():`` block), and
# :meth:`~splice.Collector.update_policy_weights_` hands new weights to it.
#
# 8. Gymnasium's autoreset modes
# ------------------------------
#
# A gymnasium vector env resets an env whose episode ended by itself, in one of three
# ways:
#
# * ``NEXT_STEP`` (gymnasium's default): the reset happens on the *next* call to
#   ``step``, and that call's action is ignored. It returns the reset observation with
#   reward 0: a *dead* step that is not a transition of either episode. (TorchRL refuses
#   this mode.)
# * ``SAME_STEP``: the reset happens in the same ``step`` call; the true final
#   observation is in ``infos["final_obs"]``.
# * ``DISABLED``: nothing is reset; the caller resets the finished envs.
#
# splice handles all three. It keeps the true final observation of every episode and
# never lets a dead step into the data, so the same seed and policy give identical
# batches in every mode. (We give the three collectors the same ``worker_id``, so that
# they draw the same ids too.)

by_mode = {}
for mode in AutoresetMode:  # NEXT_STEP, SAME_STEP, DISABLED
    collector = Collector(
        make_env(mode),
        policy,
        frames_per_batch=N_ENVS * T,
        total_frames=3 * N_ENVS * T,
        seed=0,
        worker_id=100,
    )
    by_mode[mode] = torch.cat(list(collector), dim=1)
    collector.shutdown()
reference = by_mode[AutoresetMode.NEXT_STEP]
assert all((data == reference).all() for data in by_mode.values())
Table(
    ["autoreset mode", "steps per env", "episodes ended", "identical to NEXT_STEP"],
    [
        [
            mode.name,
            data.shape[1],
            data["next", "done"].sum(),
            (data == reference).all(),
        ]
        for mode, data in by_mode.items()
    ],
)

# %%
# Now the dead steps. We step a ``NEXT_STEP`` vector env by hand with the same seed and
# the same policy, as a plain gymnasium loop would, and record what ``step`` returns:

env = make_env(AutoresetMode.NEXT_STEP)
obs, _ = env.reset(seed=0)
ended_last_step = np.zeros(N_ENVS, dtype=bool)
raw_obs, raw_dead, raw_reward = [], [], []
for _ in range(int(reference.shape[1] * 1.1)):
    td = TensorDict({"observation": torch.from_numpy(obs)}, batch_size=[N_ENVS])
    action = policy(td)["action"].numpy()
    raw_obs.append(obs)
    # this call only resets the envs whose episode ended at the previous one
    raw_dead.append(ended_last_step)
    obs, reward, term, trunc, _ = env.step(action)
    raw_reward.append(reward)
    ended_last_step = term | trunc
env.close()
raw_obs, raw_dead = np.stack(raw_obs, 1), np.stack(raw_dead, 1)
assert (np.stack(raw_reward, 1)[raw_dead] == 0).all()  # dead steps: reward 0

# %%
# Removing the dead steps from each env's stream of the plain loop gives exactly the
# steps that splice returned, in the same order:

for e in range(N_ENVS):
    real = torch.from_numpy(raw_obs[e][~raw_dead[e]])
    assert torch.equal(real[: reference.shape[1]], reference["observation"][e])
Table(
    ["", "env steps returned", "dead reset steps among them"],
    [
        [
            f"plain loop, {raw_obs.shape[1]} calls to step",
            raw_dead.size,
            raw_dead.sum(),
        ],
        ["splice, 3 batches of [8, 100]", reference.numel(), 0],
    ],
)

# %%
# To keep every row at exactly ``T`` real steps, the collector steps a ``NEXT_STEP`` env
# a little further when dead steps were dropped, and carries any surplus over to the
# next batch. Gymnasium's fast vectorized CartPole (``gym.make_vec("CartPole-v1",
# vectorization_mode="vector_entry_point")``) uses ``NEXT_STEP`` too, and works the same
# way.
#
# Conclusion
# ----------
#
# **We covered:**
#
# * why collectors return ``[B, T]`` chunks, and that a row of a chunk holds several
#   episodes glued together, with episodes cut at both edges;
# * how a recurrent network run over a raw row carries its hidden state from one episode
#   into the next, and how :func:`~splice.split_trajectories` (one row per trajectory,
#   zero padding, a mask, ids padded with ``-1``) avoids it; padded against nested
#   output;
# * done, terminated, truncated and the collector's cut: bootstrap unless terminated,
#   and the last step of a cut piece is an ordinary step to bootstrap from, with or
#   without ``set_truncated``;
# * ``trajs_per_batch`` for complete episodes, in padded and cat layouts, and how the run
#   ends: unfinished episodes are yielded, marked cut, not dropped;
# * a replay buffer that stores any layout and samples slices that never cross an
#   episode end, even across chunks;
# * background collection with :meth:`~splice.Collector.start` while training;
# * gymnasium's three autoreset modes giving identical data, without ``NEXT_STEP``'s
#   dead steps.
#
# **Useful resources:**
#
# * :doc:`../data_contract`: every key, its shape and meaning, and the bootstrap table;
# * :doc:`../coming_from_torchrl`: what maps one to one and what splice does
#   differently;
# * the API reference of :class:`~splice.Collector`, :func:`~splice.split_trajectories`,
#   :class:`~splice.TrajectoryAssembler` (the streaming assembler behind
#   ``trajs_per_batch``), :class:`~splice.ReplayBuffer` and
#   :class:`~splice.SliceSampler` (burn-in, stored recurrent state, prioritised slices);
# * the other tutorials in the :doc:`gallery <index>`, such as a recurrent DQN trained
#   from slices like the ones above.
