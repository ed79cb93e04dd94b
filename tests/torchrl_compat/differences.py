"""The documented differences that ported TorchRL test cases exercise.

Every reason here is listed, word for word, on the "Coming from TorchRL" page
(``docs/coming_from_torchrl.rst``); ``test_inventory.py`` checks it.
"""

from __future__ import annotations

#: split_trajectories pads the ids of padding positions with -1.
PADDING_ID = "split_trajectories pads trajectory ids with -1, never a real id (TorchRL: 0)"

#: Samplers and storages are used through a ReplayBuffer.
BUFFER_DRIVEN = (
    "samplers and storages are driven through a ReplayBuffer (no storage.set, "
    "sampler.sample(storage, n) or sampler.extend(index)): a sampler reads the buffer's "
    "trajectory index"
)
#: Storages are 1-D.
NO_NDIM = (
    "storages are 1-D (ndim=1 only): a [B, T] batch is stored env-major as B * T steps and "
    "samples are flat"
)
#: Auto-detected keys stay with the buffer.
KEYS_RESOLVED_BY_BUFFER = (
    "the buffer resolves the trajectory key at the first write; sampler attributes "
    "(traj_key, TorchRL's private flags) are not rewritten"
)
#: Slice marks are in the sample, not in info.
MARKS_IN_SAMPLE = (
    "slice marks (truncated, done, terminated) are written into the sample; info holds "
    "index, length, burn_in and priority_weight"
)
#: No TensorDictReplayBuffer priority keys.
NO_PRIORITY_KEY = (
    "priorities are set with update_priority only: extend does not read a priority key "
    "(no priority_key, update_priority= or update_tensordict_priority)"
)
#: Private attributes are implementation details.
PRIVATE_STATE = (
    "the test reads TorchRL's private sampler state (_sample_list, _sum_tree, "
    "_max_priority, _cache); the port checks the same behaviour through the public API"
)
#: The state dict has splice's layout.
STATE_DICT_LAYOUT = (
    "ReplayBuffer.state_dict() has splice's own keys (tensors, numbers and strings only; "
    "e.g. 'batch_size', not '_batch_size')"
)
#: loads needs identical sampler settings.
LOADS_SAME_CONFIG = (
    "loads/load_state_dict restore into a buffer with the same storage size and sampler "
    "settings, and refuse others (TorchRL overwrites the sampler's settings)"
)
#: No prefetch.
NO_PREFETCH = "no prefetch: samples are drawn when sample() is called"
#: Class hierarchy.
HIERARCHY = (
    "SliceSamplerWithoutReplacement derives from SliceSampler only, not from "
    "SamplerWithoutReplacement"
)
#: Random streams differ.
RNG_STREAM = (
    "seeded runs draw other samples than TorchRL (each sampler draws from its own generator, "
    "seeded from torch's global RNG once): an assertion on one particular random draw does "
    "not carry over"
)
#: pad_output always carries the mask.
MASK_ALWAYS = (
    "with pad_output=True every sample carries ('collector', 'mask'), also when no slice "
    "was short (TorchRL adds it only when something was padded): one schema for every sample"
)
#: Reopening a scratch_dir.
REOPENS_SCRATCH_DIR = (
    "a LazyMemmapStorage given the scratch_dir of an existing buffer reopens it (crash-safe "
    "recovery) instead of refusing to overwrite it (TorchRL's existsok)"
)
#: Fixed keys.
FIXED_KEYS = (
    "the stored keys are fixed by the first write: an in-place write cannot add a key (LayoutError)"
)
#: ListStorage of tensors.
LIST_STORAGE_OF_TENSORS = (
    "ListStorage is TorchRL-only; the port stores the same tensors in a LazyTensorStorage"
)
#: Buffers are not picklable.
NOT_PICKLABLE = (
    "a ReplayBuffer is not picklable (it holds a lock and, for memory-mapped storages, "
    "open files): save it with state_dict() or dumps()"
)
#: One write policy.
NO_WRITERS = (
    "one write policy (a ring: the oldest steps are overwritten first, TorchRL's "
    "RoundRobinWriter); ReplayBuffer takes no writer"
)
#: Every batch carries trajectory ids.
ALWAYS_TRAJ_IDS = (
    "every batch carries ('collector', 'traj_ids') (no track_traj_ids=False): the replay "
    "buffer, split and the assembler rely on it"
)
#: The env argument.
ENV_ARGUMENT = (
    "the collector's first argument is env (a gymnasium env, vector env, factory or env "
    "id), not create_env_fn / create_env_kwargs"
)
#: No env transforms.
NO_ENV_TRANSFORMS = (
    "no TorchRL env transforms (StepCounter, InitTracker): gymnasium wrappers do the "
    "env's part (TimeLimit) and the port reads the step from the batch"
)
#: Unique ids across collectors, cut marks.
IDS_AND_CUTS = (
    "trajectory ids are unique across collectors (never reused) and every batch carries "
    "('collector', 'cut') at batch-edge cuts, so two runs with different batch sizes differ "
    "in those two keys"
)
#: End of run.
END_OF_RUN = (
    "at the end of a trajs_per_batch run the unfinished episodes are yielded (and written to "
    "the replay buffer) marked ('collector', 'cut'); drop_incomplete=True drops them as "
    "TorchRL does"
)
#: Yields with a replay buffer.
YIELDS_WITH_RB = "with replay_buffer=..., the iterator yields the batch it wrote (TorchRL: None)"
#: No FutureWarning.
NO_TRAJ_FORMAT_WARNING = (
    "trajs_per_batch without traj_format defaults to 'padded' without a FutureWarning"
)
#: Collector state.
COLLECTOR_STATE = (
    "Collector.state_dict() holds 'ids', 'frames', 'batches' and 'policy' (no 'traj_pool'); "
    "the test reads TorchRL's private _frames/_iter"
)
#: Single process.
IN_PROCESS = (
    "AsyncCollector (one worker process) is TorchRL-only; splice's Collector.start() "
    "collects in a thread and pauses the same way"
)
#: No shared or use_buffers options.
NO_PROCESS_OPTIONS = (
    "no multi-process options on a single collector or buffer (use_buffers=, "
    "ReplayBuffer(shared=True)): splice's collector always writes into preallocated staging "
    "and its buffer is shared by threads"
)
#: The gymnasium counting env's action.
COUNTING_ACTIONS = (
    "the gymnasium version of TorchRL's CountingEnv takes a Discrete(2) action (TorchRL: a "
    "Binary spec), so the test's policy writes an int64 increment"
)
