"""Which of TorchRL's tests were ported, which exercise a documented difference, which are
TorchRL-only — and the counts.

``torchrl_cases.txt`` lists every test function of TorchRL's own tests of the APIs splice
mirrors (pytorch/rl 6e18e35b2, the 0.14.0 release: ``test/test_postprocs.py``,
``test/test_collectors.py``, ``test/rb/*.py``) with its number of collected cases. Each one
is either ported under the same file, class and function name in ``tests/torchrl_compat``,
or listed below as TorchRL-only with the reason (:data:`TORCHRL_ONLY`). A ported function
may keep only some of TorchRL's parametrizations: the dropped ones are TorchRL-only too, for
the reason in :data:`PARTIAL`.

Ported cases are counted from pytest's collection of the suite: unmarked ones pass with the
imports changed (and TorchRL's test envs replaced by the same envs in gymnasium); cases
marked ``torchrl_difference`` exercise a documented difference — unchanged and expected to
fail (``xfail(strict=True)``), or adapted to splice's way and passing.

Run ``python -m tests.torchrl_compat.inventory`` to print the counts (they are quoted on the
"Coming from TorchRL" page and in the README; ``test_inventory.py`` checks them).
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: Where the conftest leaves the classification of the cases a pytest session collected.
SESSION_CASES = pytest.StashKey[list[dict[str, object]]]()

_MULTI = "multi-process collectors (MultiSyncCollector, MultiAsyncCollector, AsyncCollector)"

#: TorchRL test functions not ported, by fnmatch pattern over ``file::[Class::]function``,
#: with the TorchRL-only feature they test. The first matching pattern gives the reason.
TORCHRL_ONLY: list[tuple[str, str]] = [
    # test_postprocs.py
    ("test_postprocs.py::TestMultiStep::*", "MultiStep (n-step returns): no post-processing"),
    ("test_postprocs.py::TestDensifyReward::*", "DensifyReward: no post-processing transforms"),
    # rb/test_samplers.py
    (
        "rb/test_samplers.py::TestFindStartStopTraj::*",
        "find_start_stop_traj (boundaries recovered by scanning the storage; splice's index "
        "is built when data is written)",
    ),
    ("rb/test_samplers.py::TestPromptGroupSampler::*", "PromptGroupSampler (LLM prompt groups)"),
    ("rb/test_samplers.py::TestStalenessAwareSampler::*", "StalenessAwareSampler"),
    (
        "rb/test_samplers.py::test_prioritized_parameter_scheduler",
        "parameter schedulers annealing alpha/beta",
    ),
    (
        "rb/test_samplers.py::TestSamplers::test_prb_load*_legacy_*",
        "max_priority_within_buffer and TorchRL's legacy checkpoints",
    ),
    (
        "rb/test_samplers.py::TestSamplers::test_prb_ndim",
        "TensorDictPrioritizedReplayBuffer, priority_key, ndim=2 storages",
    ),
    (
        "rb/test_samplers.py::TestSamplers::test_prb_new_sampler_with_loaded_storage",
        "a storage shared by two buffers; priority_key",
    ),
    (
        "rb/test_samplers.py::TestSamplers::test_slice_sampler_errors",
        "standalone samplers reading a ListStorage",
    ),
    ("rb/test_samplers.py::TestSamplers::test_slice_sampler_left_right*", "SliceSampler(span=)"),
    # rb/test_storages.py
    ("rb/test_storages.py::TestCompressedListStorage::*", "CompressedListStorage"),
    ("rb/test_storages.py::test_compressed_storage_*", "CompressedListStorage"),
    ("rb/test_storages.py::TestSharedStorageInit::*", "storages shared across processes"),
    ("rb/test_storages.py::TestRBLazyInit::*", "lazy buffer initialisation from factories"),
    (
        "rb/test_storages.py::TestLazyStorages::*",
        "the standalone storage API (set/get/_init), tensorclasses, lists of pytrees",
    ),
    (
        "rb/test_storages.py::TestStorages::test_errors",
        "TensorStorage (a storage around a given tensor)",
    ),
    ("rb/test_storages.py::TestStorages::test_get_set", "TensorStorage"),
    ("rb/test_storages.py::TestStorages::test_state_dict", "storage-level state dicts"),
    (
        "rb/test_storages.py::TestStorages::test_*load_state_dict_decouples_from_source",
        "storage-level state dicts (TensorStorage, ListStorage)",
    ),
    ("rb/test_storages.py::TestStorages::test_*lazystack*", "LazyStackStorage"),
    ("rb/test_storages.py::TestStorages::test_lazy_stack_storage", "LazyStackStorage"),
    (
        "rb/test_storages.py::TestStorages::test_storage_device",
        "standalone storages and the 'auto' device",
    ),
    ("rb/test_storages.py::TestStorages::test_storage_dumps_loads", "storage-level dumps/loads"),
    ("rb/test_storages.py::TestStorages::test_*recompile*", "torch.compile of storages"),
    ("rb/test_storages.py::TestStorages::test_compilable_*", "torch.compile of storages"),
    ("rb/test_storages.py::TestStorages::test_add_list_of_tds", "extending with lists"),
    ("rb/test_storages.py::TestStorages::test_*_transform", "replay-buffer transforms"),
    ("rb/test_storages.py::test_storage_save_hook", "save hooks"),
    (
        "rb/test_storages.py::TestLazyMemmapStorageCleanup::test_cleanup_registry",
        "TorchRL's module-level cleanup registry",
    ),
    # rb/test_rb_core.py
    ("rb/test_rb_core.py::TestBufferStats::*", "ReplayBuffer.stats()"),
    ("rb/test_rb_core.py::TestReplayBufferConsumption::*", "consume mode"),
    ("rb/test_rb_core.py::TestSampleUnit::*", "sample units"),
    (
        "rb/test_rb_core.py::TestSequence*::*",
        "sample units of sequences (splice's slice samplers cover sequences)",
    ),
    ("rb/test_rb_core.py::TestUpdateIfPresent*::*", "update_if_present and versioned handles"),
    ("rb/test_rb_core.py::test_add_warning", "ListStorage and RL_WARNINGS"),
    (
        "rb/test_rb_core.py::test_rb_trajectories",
        "TensorDictPrioritizedReplayBuffer, priority_key, ListStorage",
    ),
    ("rb/test_rb_core.py::test_replay_buffer_*transform*", "replay-buffer transforms"),
    ("rb/test_rb_core.py::test_replay_buffer_share_*", "shared buffers and transforms"),
    ("rb/test_rb_core.py::test_replay_buffer_direct_service_client*", "service backends"),
    ("rb/test_rb_core.py::test_replay_buffer_prefetch_*", "prefetch"),
    ("rb/test_rb_core.py::test_replay_buffer_load_state_dict_waits_*", "prefetch"),
    ("rb/test_rb_core.py::test_replay_buffer_read_write_all_in_order*", "read/write_all_in_order"),
    ("rb/test_rb_core.py::test_shared_storage_prioritized_sampler", "storages shared by buffers"),
    ("rb/test_rb_core.py::test_storage_mutation_revision_*", "storage mutation revisions"),
    # rb/test_prioritized.py
    ("rb/test_prioritized.py::test_cuda_*", "CUDA segment trees"),
    ("rb/test_prioritized.py::*_cuda_*", "CUDA segment trees"),
    ("rb/test_prioritized.py::*_sampler_device_cpu", "sampler devices"),
    ("rb/test_prioritized.py::test_prb", "TensorDictPrioritizedReplayBuffer, priority_key"),
    ("rb/test_prioritized.py::test_ptdrb", "TensorDictPrioritizedReplayBuffer, priority_key"),
    (
        "rb/test_prioritized.py::test_replay_buffer_trajectories",
        "TensorDictPrioritizedReplayBuffer, priority_key",
    ),
    (
        "rb/test_prioritized.py::test_prb_within_buffer_max_priority_stays_raw",
        "max_priority_within_buffer",
    ),
    ("rb/test_prioritized.py::test_prb_alpha_change_*", "changing alpha on a filled sampler"),
    ("rb/test_prioritized.py::test_prb_alpha_setter_*", "changing alpha on a filled sampler"),
    # rb/test_composable.py
    ("rb/test_composable.py::TestComposableBuffers::test_cursor_position", "standalone writers"),
    (
        "rb/test_composable.py::TestComposableBuffers::test_extend_sample_recompile",
        "torch.compile of buffers",
    ),
    ("rb/test_composable.py::test_pickable_fresh_interpreter_*", "pickling a ListStorage buffer"),
    # whole files
    ("rb/test_ensemble.py::*", "ReplayBufferEnsemble and ensemble storages/samplers/writers"),
    ("rb/test_her.py::*", "hindsight experience replay"),
    ("rb/test_query.py::*", "trajectory queries (ReplayBuffer.query, iter_trajectories)"),
    ("rb/test_rb_distributed.py::*", "distributed and Ray replay buffers"),
    ("rb/test_rb_transforms.py::*", "replay-buffer transforms"),
    ("rb/test_storage_map.py::*", "storage maps, hashes and MCTS trees"),
    ("rb/test_writers.py::*", "writers (max-value, generations, multi-process)"),
    # test_collectors.py
    ("test_collectors.py::TestAggregateReset::*", "nested done keys of TorchRL envs"),
    ("test_collectors.py::TestAsyncCollection::test_start_multi", _MULTI),
    ("test_collectors.py::TestAutoWrap::*", "wrapping nn.Modules from env specs"),
    ("test_collectors.py::TestCollectHooks::*", "pre/post-collect hooks"),
    ("test_collectors.py::TestCollectorDevices::*", "policy/env device options"),
    ("test_collectors.py::TestCollectorGeneric::test_*backend*", "collector backends"),
    ("test_collectors.py::TestCollectorGeneric::test_public_signature", "collector backends"),
    (
        "test_collectors.py::TestCollectorGeneric::test_sequence_inference_*",
        "collector backends",
    ),
    ("test_collectors.py::TestCollectorGeneric::test_collector_batch_size", _MULTI),
    ("test_collectors.py::TestCollectorGeneric::test_collector_frames_per_batch_worker", _MULTI),
    ("test_collectors.py::TestCollectorGeneric::test_concurrent_*", _MULTI),
    ("test_collectors.py::TestCollectorGeneric::test_multi_sync_*", _MULTI),
    ("test_collectors.py::TestCollectorGeneric::test_env_that_waits", _MULTI),
    ("test_collectors.py::TestCollectorGeneric::test_fake_tensordict_*", "spec-based fake data"),
    (
        "test_collectors.py::TestCollectorGeneric::test_collector_consistency",
        "env.rollout() of TorchRL envs",
    ),
    (
        "test_collectors.py::TestCollectorGeneric::test_collector_output_keys",
        "policies built from TorchRL specs",
    ),
    ("test_collectors.py::TestCollectorGeneric::test_collector_vecnorm_*", "VecNorm, EnvCreator"),
    ("test_collectors.py::TestCollectorGeneric::test_compact_obs_*", "compact_obs"),
    ("test_collectors.py::TestCollectorGeneric::test_concrete_default_*", "collector classes"),
    ("test_collectors.py::TestCollectorGeneric::test_excluded_keys", "private-key exclusion"),
    ("test_collectors.py::TestCollectorGeneric::test_maxframes_error", "StepCounter conflicts"),
    ("test_collectors.py::TestCollectorGeneric::test_no_deepcopy_policy", "policy_device"),
    ("test_collectors.py::TestCollectorGeneric::test_reset_heterogeneous_envs", "env devices"),
    ("test_collectors.py::TestCollectorGeneric::test_set_truncated", "nested done keys"),
    ("test_collectors.py::TestCollectorGeneric::test_*weight*", "weight sync schemes"),
    ("test_collectors.py::TestCollectorProfiling::*", "collector profiling"),
    ("test_collectors.py::TestCollectorRB::test_collector_postproc_zeros", "postproc="),
    ("test_collectors.py::TestCollectorRB::test_collector_rb_multi*", _MULTI),
    ("test_collectors.py::TestCollectorRB::test_*multi*", _MULTI),
    ("test_collectors.py::TestCollectorRB::test_collector_with_rb_*", "ParallelEnv, lazy stacks"),
    ("test_collectors.py::TestCollectorRB::test_runner_managed_*", _MULTI),
    ("test_collectors.py::TestCollectorRemoteHelpers::*", "remote helpers"),
    ("test_collectors.py::TestCollectorStats::*", "collector stats"),
    ("test_collectors.py::TestCollectorsNonTensor::*", "non-tensor entries (tensors only)"),
    ("test_collectors.py::TestDynamicEnvs::*", "envs with dynamic specs"),
    ("test_collectors.py::TestEnvTransformAutoWrap::*", "auto-registered env transforms"),
    ("test_collectors.py::TestHeterogeneousEnvsCollector::*", "heterogeneous TorchRL envs"),
    ("test_collectors.py::TestMultiKeyEnvsCollector::*", "multi-key TorchRL envs"),
    ("test_collectors.py::TestNestedEnvsCollector::*", "nested TorchRL envs"),
    ("test_collectors.py::TestInitRandomFramesWithStart::*", _MULTI),
    ("test_collectors.py::TestLibThreading::*", "num_threads management"),
    ("test_collectors.py::TestMakePolicyFactory::*", "policy factories"),
    ("test_collectors.py::TestPolicyFactory::*", "policy factories"),
    ("test_collectors.py::TestPolicyVersion::*", "policy versions"),
    ("test_collectors.py::TestPreemptiveThreshold::*", "interruptors / preemption"),
    ("test_collectors.py::TestRandomPolicyLazyInit::*", "TorchRL RandomPolicy spec init"),
    (
        "test_collectors.py::TestTrajsPerBatch::test_[ei][mn]*_*",  # test_emit_*, test_ingest_*
        "TorchRL's private _traj_ingest/_traj_emit (splice's TrajectoryAssembler is public "
        "and tested on its own)",
    ),
    (
        "test_collectors.py::TestTrajsPerBatch::test_chunk_ends_done_terminated",
        "TorchRL's private _traj_chunk_ends_done",
    ),
    ("test_collectors.py::TestTrajsPerBatchReplayBuffer::test_multi_*", _MULTI),
    ("test_collectors.py::TestTrajsPerBatchReplayBuffer::test_*multi_*", _MULTI),
    ("test_collectors.py::TestTrajsPerBatchReplayBuffer::test_*device*", "device metadata"),
    (
        "test_collectors.py::TestTrajsPerBatchReplayBuffer::test_trajs_per_write_*",
        "trajs_per_write",
    ),
    ("test_collectors.py::TestUniqueTraj::*", _MULTI),
    ("test_collectors.py::TestUpdateParams::*", f"weight updates of {_MULTI}"),
    ("test_collectors.py::test_*weight*", "weight sync schemes"),
]

#: Ported functions that keep only some of TorchRL's parametrizations: why the others are
#: TorchRL-only.
PARTIAL: dict[str, str] = {
    "rb/test_samplers.py::TestSamplers::test_slice_sampler_prioritized_span": (
        "SliceSampler(span=)"
    ),
    "rb/test_samplers.py::TestSamplers::test_prb_update_max_priority": (
        "max_priority_within_buffer"
    ),
    "rb/test_prioritized.py::test_prb_new_item_gets_max_priority": "max_priority_within_buffer",
    "rb/test_prioritized.py::test_prb_alpha_zero_keeps_raw_max": "max_priority_within_buffer",
    "rb/test_storages.py::TestStorages::test_storage_inplace_writing": "ListStorage",
    "rb/test_storages.py::TestStorages::test_storage_inplace_writing_newkey": "ListStorage",
    "rb/test_rb_core.py::TestBuffers::*": (
        "ListStorage and list data, PrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer"
    ),
    "rb/test_composable.py::TestComposableBuffers::*": (
        "ListStorage, pytrees with lists and int keys, RemoteTensorDictReplayBuffer, "
        "TensorDictMaxValueWriter"
    ),
    "test_collectors.py::TestCollectorGeneric::test_no_stopiteration": _MULTI,
    "test_collectors.py::TestCollectorGeneric::test_collector_reloading": _MULTI,
    "test_collectors.py::TestTrajsPerBatch::test_trajs_per_batch_integration": _MULTI,
    "test_collectors.py::TestTrajsPerBatch::test_traj_format_cat_integration": _MULTI,
    "test_collectors.py::TestAsyncCollection::test_start_update_policy": _MULTI,
    "test_collectors.py::TestCollectorGeneric::test_env_that_errors": _MULTI,
}


def torchrl_cases() -> dict[str, int]:
    """TorchRL's test functions and their case counts (``torchrl_cases.txt``)."""
    out: dict[str, int] = {}
    for line in (HERE / "torchrl_cases.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, count = line.rsplit(" ", 1)
            out[name] = int(count)
    return out


def torchrl_only_reason(function: str) -> str | None:
    for pattern, reason in TORCHRL_ONLY:
        if fnmatch.fnmatchcase(function, pattern):
            return reason
    return None


def partial_reason(function: str) -> str | None:
    for pattern, reason in PARTIAL.items():
        if fnmatch.fnmatchcase(function, pattern):
            return reason
    return None


def collect_ported() -> list[dict[str, object]]:
    """The suite's cases: ``{"function", "failing", "adapted"}`` (reasons), from pytest's
    collection in a subprocess (the conftest writes them when asked)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "items.json"
        env = dict(os.environ, SPLICE_COMPAT_INVENTORY=str(path))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                str(HERE),
            ],
            check=True,
            env=env,
            capture_output=True,
            cwd=HERE.parent.parent,
        )
        items: list[dict[str, object]] = json.loads(path.read_text())
    return items


@dataclass
class Counts:
    """The inventory's numbers (cases of TorchRL's tests)."""

    total: int = 0
    passing: int = 0  # ported by changing imports (and envs), pass
    adapted: int = 0  # documented difference, adapted, pass
    failing: int = 0  # documented difference, xfail(strict=True)
    torchrl_only: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)  # differences
    only_by_reason: Counter[str] = field(default_factory=Counter)  # TorchRL-only
    problems: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return self.adapted + self.failing


def count(items: list[dict[str, object]] | None = None) -> Counts:
    """Classify every TorchRL case (see module docs)."""
    items = collect_ported() if items is None else items
    cases = torchrl_cases()
    counts = Counts(total=sum(cases.values()))
    ported = Counter(str(item["function"]) for item in items)
    for item in items:
        failing, adapted = item["failing"], item["adapted"]
        assert isinstance(failing, list) and isinstance(adapted, list)
        if failing:
            counts.failing += 1
        elif adapted:
            counts.adapted += 1
        else:
            counts.passing += 1
        for reason in {*failing, *adapted}:
            counts.by_reason[reason] += 1
    for function, n in cases.items():
        mine = ported.get(function, 0)
        only = torchrl_only_reason(function)
        if mine and only:
            counts.problems.append(f"{function}: ported and listed as TorchRL-only ({only})")
        elif not mine and not only:
            counts.problems.append(f"{function}: neither ported nor listed as TorchRL-only")
        elif not mine and only:
            counts.torchrl_only += n
            counts.only_by_reason[only] += n
        elif mine > n:
            counts.problems.append(f"{function}: {mine} ported cases, TorchRL has {n}")
        elif mine < n:
            reason = partial_reason(function)
            if reason is None:
                counts.problems.append(f"{function}: {n - mine} cases dropped without a reason")
            else:
                counts.torchrl_only += n - mine
                counts.only_by_reason[reason] += n - mine
    for function in ported:
        if function not in cases:
            counts.problems.append(f"{function}: ported but not a TorchRL test")
    return counts


def main() -> None:
    c = count()
    print(f"TorchRL cases: {c.total}")
    print(f"  pass with imports changed: {c.passing}")
    print(f"  documented differences:    {c.differences} ({c.adapted} adapted and passing, ")
    print(f"                             {c.failing} unchanged, xfail strict)")
    print(f"  TorchRL-only:              {c.torchrl_only}")
    print("\nDocumented differences (cases):")
    for reason, n in c.by_reason.most_common():
        print(f"  {n:5d}  {reason}")
    print("\nTorchRL-only (cases):")
    for reason, n in c.only_by_reason.most_common():
        print(f"  {n:5d}  {reason}")
    for problem in c.problems:
        print("PROBLEM:", problem)


if __name__ == "__main__":
    main()
