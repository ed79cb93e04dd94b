"""
Scaling out: worker processes, Ray, and one replay buffer
=========================================================

One :class:`~splice.Collector` steps its envs in one process. When the env or the policy
needs more CPU than that, :class:`~splice.MultiSyncCollector` and
:class:`~splice.MultiAsyncCollector` run several workers, each with its own envs and a copy of
the policy, and keep every guarantee of the single collector: trajectory ids unique across
workers, an episode under one id across its worker's batches, ``total_frames`` exact, nothing
dropped. The workers are processes on this machine (``backend="process"``), or Ray actors on
any machine of a Ray cluster (``backend="ray"``).

**In this tutorial you will learn:**

* how a batch of 1 and of 2 workers looks, and how trajectory ids tell the workers apart;
* how to run the same collector on Ray, feeding one :class:`~splice.RayReplayBuffer` that
  lives in a Ray actor, without the batches passing through your process;
* how to train the recurrent agent of :mod:`splice.examples.r2d2` from that buffer while the
  workers collect, pushing new weights to them with ``update_policy_weights_()``.

The page :doc:`/scaling_out` says what crosses the network per batch and how to go from this
machine to a cluster (one line: ``ray.init(address=...)``).
"""

# %%
# Setup
# -----
#
# The documentation is built at two sizes (``SPLICE_DOCS_BUDGET=small`` in the test suite,
# ``full`` by default); only the amount of data and training changes. Plotting helpers are
# left out of this page (they are in the downloadable script).

import os
import time

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
import torch

from splice import (
    Collector,
    LazyTensorStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayReplayBuffer,
)
from splice.collectors.ids import worker_of
from splice.examples.masked_cartpole import make_masked_cartpole
from splice.examples.qnets import EpsilonGreedy
from splice.examples.r2d2 import (
    Learner,
    R2D2Config,
    evaluate,
    make_network,
    make_sampler,
)
from splice.layout import IS_INIT, TRAJ_IDS

SMALL = os.environ.get("SPLICE_DOCS_BUDGET", "full") == "small"
FRAMES = 2_000 if SMALL else 20_000  # per collector in the first part
UPDATES = 40 if SMALL else 4_000
torch.set_num_threads(1)
torch.manual_seed(0)

# sphinx_gallery_start_ignore
plt.rcParams.update(
    {"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False}
)


def plot_ids(batches: dict[str, torch.Tensor]) -> None:
    fig, axes = plt.subplots(1, len(batches), figsize=(10, 3.2), squeeze=False)
    for ax, (name, batch) in zip(axes[0], batches.items(), strict=True):
        owner = worker_of(batch[TRAJ_IDS]).numpy()
        spaces = {int(s): i for i, s in enumerate(np.unique(owner))}
        image = np.vectorize(spaces.get)(owner)
        ax.imshow(
            image,
            aspect="auto",
            interpolation="nearest",
            cmap="tab10",
            vmin=0,
            vmax=9,
        )
        starts = np.argwhere(batch[IS_INIT][..., 0].numpy())
        ax.scatter(
            starts[:, 1],
            starts[:, 0],
            marker="|",
            color="k",
            s=80,
            label="episode start",
        )
        ax.set_title(name)
        ax.set_xlabel("step in the batch")
        ax.set_ylabel("env row")
        ax.set_yticks(range(owner.shape[0]))
    axes[0][0].legend(loc="upper right", fontsize=8)
    fig.suptitle("Env rows coloured by the worker (id space) of their trajectory ids")
    fig.tight_layout()


def plot_frames(frames: dict[str, list[int]]) -> None:
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(frames)
    bottom = np.zeros(len(names))
    for worker in range(max(len(v) for v in frames.values())):
        values = np.array(
            [v[worker] if worker < len(v) else 0 for v in frames.values()]
        )
        ax.barh(names, values, left=bottom, label=f"worker {worker}")
        bottom += values
    ax.set_xlabel("frames collected")
    ax.legend(fontsize=8)
    fig.tight_layout()


def plot_training(curve: list[tuple[int, int, float, float]]) -> None:
    updates, _frames, loss, ret = (np.array(c) for c in zip(*curve, strict=True))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    a.plot(updates, loss)
    a.set_xlabel("gradient steps")
    a.set_ylabel("loss (mean since the last point)")
    b.plot(updates, ret, marker="o")
    b.set_xlabel("gradient steps")
    b.set_ylabel("greedy return (5 episodes)")
    fig.suptitle(
        "Recurrent agent trained from the Ray buffer while 2 Ray workers collect"
    )
    fig.tight_layout()


# sphinx_gallery_end_ignore

# %%
# One process, then two workers
# -----------------------------
#
# A worker is built from an env *factory* (a function, pickled to the worker), not an env
# object. The sync collector asks every worker for its part of each batch and concatenates
# the parts along the env rows: 2 workers of 2 envs each give ``[4, T]`` batches, the layout
# of a :class:`~splice.Collector` with 4 envs.


def two_cartpoles() -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")


batches = {}
with Collector(
    two_cartpoles(), frames_per_batch=200, total_frames=FRAMES, seed=0
) as one:
    batches["Collector (1 process)"] = list(one)[-1]
with MultiSyncCollector(
    two_cartpoles, num_workers=2, frames_per_batch=400, total_frames=FRAMES, seed=0
) as two:
    local = list(two)
    batches["MultiSyncCollector (2 processes)"] = local[-1]
    local_frames = list(two.worker_frames)
assert sum(local_frames) == FRAMES == sum(b.numel() for b in local)
plot_ids(batches)

# %%
# Each worker draws trajectory ids from its own id space (the high bits of the id, read by
# :func:`~splice.collectors.ids.worker_of`), so ids never collide across workers, and an
# episode keeps its id across its worker's batches. ``total_frames`` is honoured exactly:
# the workers collected ``sum(worker_frames) == total_frames`` frames, nothing more.
#
# The same through Ray
# --------------------
#
# With ``backend="ray"`` each worker is a Ray actor. Here Ray runs on this machine
# (``ray.init(num_cpus=2)``); on a cluster, ``ray.init(address="auto")`` is the only change.
# The buffer is a :class:`~splice.RayReplayBuffer`: the same :class:`~splice.ReplayBuffer`,
# served by a Ray actor. In background mode (``start()``) each worker puts its batch into
# Ray's object store and the buffer's actor reads it from there: the data never passes
# through this process (``collector.remote_writes``).
#
# The agent is the recurrent Q-network of :mod:`splice.examples.r2d2`, on CartPole with the
# velocities hidden (it needs memory), and its replay settings: sequences of
# ``burn_in + seq_len`` steps that never cross an episode end, with the stored recurrent
# state at each sequence's start. Each worker runs a copy of the epsilon-greedy policy and
# carries the recurrent state of its envs from step to step.

import ray  # noqa: E402

ray.init(
    num_cpus=2,
    include_dashboard=False,
    log_to_driver=False,
    _node_ip_address="127.0.0.1",
)

config = R2D2Config(seed=0, learning_starts=1_000 if SMALL else 5_000)
BATCH = (
    4 * config.steps_per_batch
)  # each worker: 4 envs x steps_per_batch steps per batch
TRAIN_FRAMES = BATCH * (190 if SMALL else 4_700)  # a whole number of batches
net = make_network(config, obs_dim=2, n_actions=2)  # masked CartPole: x and angle
policy = EpsilonGreedy(net, n_actions=2, seed=0, epsilon=0.2)
sampler, sample_steps = make_sampler(config)  # the recurrent agent's replay settings
rb = RayReplayBuffer(  # ... in a Ray actor
    storage=LazyTensorStorage(config.capacity),
    sampler=sampler,
    batch_size=sample_steps,
)
collector = MultiAsyncCollector(
    lambda: make_masked_cartpole(4),
    policy,
    num_workers=2,
    frames_per_batch=BATCH,
    total_frames=TRAIN_FRAMES,
    replay_buffer=rb,
    backend="ray",
    seed=0,
)
assert collector.remote_writes

# %%
# Training while the workers collect
# ----------------------------------
#
# The learner samples the buffer actor and takes gradient steps here; every 10 steps it
# pushes the new weights to the workers with :meth:`~splice.MultiAsyncCollector.
# update_policy_weights_` (put once into Ray's object store; each worker loads them before
# its next batch, so a worker is at most one batch behind). ``epsilon`` is a plain attribute
# of the policy, not a weight: the workers keep the value they were built with.

learner = Learner(net, config)
EVAL_ENV = make_masked_cartpole(5)  # one greedy episode per env
curve, losses = [], []
collector.start()
while len(rb) < config.learning_starts:
    time.sleep(0.05)
while learner.updates < UPDATES:
    data, info = rb.sample(return_info=True)
    losses.append(learner.update(data, info))
    if learner.updates % 10 == 0:
        collector.update_policy_weights_(policy)
    if learner.updates % (UPDATES // 8) == 0:
        ret = float(evaluate(net, EVAL_ENV, seed=learner.updates).mean())
        curve.append((learner.updates, len(rb), float(np.mean(losses)), ret))
        losses = []
collector.wait()  # the workers finish the frame budget
collector.shutdown()
ray_frames = list(collector.worker_frames)
assert (
    len(rb) == rb.write_count == collector.frames == sum(ray_frames) == TRAIN_FRAMES
)
plot_training(curve)

# %%
# ``len(rb)`` is exactly the frames the workers collected, and every sampled sequence is one
# episode of one worker's env (the buffer actor is the one writer of its trajectory index).
# At the small size the test suite builds this page with, the agent takes only a few dozen
# gradient steps; the full build trains longer.

sample = rb.sample()
ids = sample[TRAJ_IDS]
assert bool((ids == ids[:, :1]).all()), "a sequence mixes episodes"
plot_frames({"2 processes": local_frames, "2 Ray actors": ray_frames})
EVAL_ENV.close()
rb.shutdown()
ray.shutdown()

# %%
# The bars are each worker's own count of the frames it collected; with the async collector
# a fast worker may collect more than a slow one, and the total is still the budget.
#
# We covered
# ----------
#
# * ``MultiSyncCollector`` / ``MultiAsyncCollector`` take env factories and ``num_workers``;
#   ids stay unique across workers and ``total_frames`` stays exact;
# * ``backend="ray"`` runs the workers as Ray actors, locally or on a cluster
#   (``ray.init(address=...)``);
# * a :class:`~splice.RayReplayBuffer` is fed by the workers directly and sampled by the
#   learner; ``update_policy_weights_`` broadcasts new weights through Ray's object store.
#
# Useful resources
# ----------------
#
# * :doc:`/scaling_out`: the backends, what crosses the network, faults and shutdown;
# * :doc:`/coming_from_torchrl`: the differences from TorchRL's ``RayCollector``;
# * `Ray's documentation on clusters <https://docs.ray.io/en/latest/cluster/getting-started.html>`_.
