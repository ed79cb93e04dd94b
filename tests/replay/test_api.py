"""The replay API TorchRL users rely on: plain tensors and dicts, in-place access, state dicts,
memory-mapped cleanup, key detection, and the two transition samplers."""

from __future__ import annotations

import gc
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from splice.layout import DONE, TRAJ_IDS, LayoutError
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream, assert_slices_contiguous


# ---------------------------------------------------------------------- containers
def test_plain_tensors() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=RandomSampler(seed=0))
    rows = rb.extend(torch.arange(100))
    assert rows.tolist() == list(range(100))
    sample = rb.sample(10)
    assert isinstance(sample, torch.Tensor) and sample.shape == (10,)
    assert rb[3:6].tolist() == [3, 4, 5]
    assert rb.add(torch.tensor(7)) == 0 and rb[0].item() == 7  # the ring wrapped
    sample, info = rb.sample(4, return_info=True)
    assert torch.equal(sample, rb[info["index"]])
    with pytest.raises(TypeError, match="holds tensor data"):
        rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))


def test_nested_dicts() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
    data = {"a": torch.arange(6), "b": {"c": torch.ones(6, 2)}}
    assert rb.extend(data).tolist() == list(range(6))
    sample = rb.sample()
    assert isinstance(sample, dict) and sample["b"]["c"].shape == (3, 2)
    assert rb[:2]["a"].tolist() == [0, 1] and rb["a"].tolist() == list(range(6))
    with pytest.raises(TypeError, match=r"key \('b', 'c'\) holds str"):
        rb.extend({"a": torch.arange(2), "b": {"c": "x"}})
    with pytest.raises(LayoutError, match="first"):
        rb.extend({"a": torch.arange(2), "b": {"c": torch.ones(3, 2)}})
    assert len(rb) == 6


def test_wrong_container_is_a_type_error() -> None:
    rb = ReplayBuffer()
    for bad in ([1, 2, 3], np.arange(3), 3.0):
        with pytest.raises(TypeError, match="stores TensorDicts, tensors or dicts"):
            rb.extend(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sampler must be"):
        ReplayBuffer(sampler=object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------- in-place access
def _filled(n: int = 6) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    ids = torch.tensor([0, 0, 0, 1, 1, 1])[:n]
    rb.extend(TensorDict({TRAJ_IDS: ids, "x": torch.arange(n), "y": torch.zeros(n, 2)}, [n]))
    return rb


def test_setitem_set_at_set_and_update() -> None:
    rb = _filled()
    rb[1] = TensorDict({"x": torch.tensor(100)}, [])  # one step, some keys
    rb[torch.tensor([2, 3])] = TensorDict({"y": torch.ones(2, 2)}, [2])
    assert rb["x"].tolist() == [0, 100, 2, 3, 4, 5]
    assert rb["y"][:, 0].tolist() == [0, 0, 1, 1, 0, 0]
    rb.set_at_("x", torch.tensor([7, 8]), torch.tensor([0, 5]))
    assert rb["x"].tolist() == [7, 100, 2, 3, 4, 8]
    rb.set_("x", torch.arange(6) * 2)
    rb["y"] = torch.full((6, 2), 3.0)
    assert rb["x"].tolist() == [0, 2, 4, 6, 8, 10] and bool((rb["y"] == 3).all())
    rb.update_({"x": torch.arange(6) + 1, "y": torch.zeros(6, 2)}, keys_to_update=["x"])
    assert rb["x"].tolist() == [1, 2, 3, 4, 5, 6] and bool((rb["y"] == 3).all())
    # Samples see the new data; trajectories are unchanged.
    s = rb.sample(4)
    assert bool((s["x"] == s["index"] + 1).all())


def test_in_place_writes_cannot_move_boundaries_and_leave_state_unchanged() -> None:
    rb = _filled()
    before = rb["x"].clone()
    with pytest.raises(LayoutError, match="delimits trajectories"):
        rb[0] = TensorDict({TRAJ_IDS: torch.tensor(5), "x": torch.tensor(9)}, [])
    rb[0] = TensorDict({TRAJ_IDS: torch.tensor(0), "x": torch.tensor(9)}, [])  # same id: fine
    with pytest.raises(LayoutError, match="unexpected keys 'z'"):
        rb[1] = TensorDict({"z": torch.tensor(1)}, [])
    with pytest.raises(LayoutError, match=r"'x'.*dtype"):
        rb.set_at_("x", torch.tensor([0.5]), [1])
    with pytest.raises(IndexError, match="out of range"):
        rb[6] = TensorDict({"x": torch.tensor(1)}, [])
    assert rb["x"].tolist() == [9, *before[1:].tolist()]
    flags = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    flags.extend(TensorDict({DONE: torch.tensor([[False], [True]]), "x": torch.zeros(2)}, [2]))
    with pytest.raises(LayoutError, match="'next', 'done'"):
        flags.set_at_(DONE, torch.tensor([[True]]), [0])


# ---------------------------------------------------------------------- state dicts
SAMPLERS = {
    "random": lambda: RandomSampler(seed=1),
    "without": lambda: SamplerWithoutReplacement(seed=1),
    "prioritized": lambda: PrioritizedSampler(60, alpha=0.7, beta=0.5, seed=1),
    "slice": lambda: SliceSampler(slice_len=3, seed=1),
    "slice-without": lambda: SliceSamplerWithoutReplacement(slice_len=3, seed=1),
    "prioritized-slice": lambda: PrioritizedSliceSampler(slice_len=3, strict_length=False, seed=1),
}


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_state_dict_round_trip_without_pickle(kind: str) -> None:
    def make() -> ReplayBuffer:
        return ReplayBuffer(storage=LazyTensorStorage(60), sampler=SAMPLERS[kind](), batch_size=6)

    rb = make()
    stream = SyntheticStream(2, 4.0, seed=3, labels=True)
    for _ in range(5):
        rb.extend(stream.chunk(8))  # 80 steps into 60: wrapped
    s = rb.sample()
    rb.update_priority(s["index"], torch.rand(s["index"].shape))
    buffer = io.BytesIO()
    torch.save(rb.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # tensors, numbers and strings only
    other = make()
    other.load_state_dict(state)
    assert (len(other), other.write_count) == (len(rb), rb.write_count)
    for _ in range(3):
        assert torch.equal(rb.sample()["g"], other.sample()["g"])
    more = stream.chunk(5)
    rb.extend(more)
    other.extend(more)
    assert torch.equal(rb.sample()["g"], other.sample()["g"])
    # The state dict holds copies: changing the buffer later does not change it.
    assert state["columns"][0].data_ptr() != rb.storage.columns[("g",)].data_ptr()


def test_load_state_dict_refuses_another_configuration_and_leaves_the_buffer_alone() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(slice_len=2))
    rb.extend(SyntheticStream(1, 4.0, labels=True).chunk(10))
    state = rb.state_dict()
    other = ReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(slice_len=3))
    other.extend(SyntheticStream(1, 4.0, seed=5, labels=True).chunk(4))
    with pytest.raises(ValueError, match="sampler"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="20 steps"):
        ReplayBuffer(
            storage=LazyTensorStorage(30), sampler=SliceSampler(slice_len=2)
        ).load_state_dict(state)
    with pytest.raises(ValueError, match="format"):
        other.load_state_dict({"format": "something else"})
    assert len(other) == 4 and other.write_count == 4


def test_tensor_buffers_round_trip_their_kind() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=RandomSampler(seed=0), batch_size=2)
    rb.extend(torch.arange(5.0))
    other = ReplayBuffer(storage=LazyTensorStorage(8), sampler=RandomSampler(seed=0), batch_size=2)
    other.load_state_dict(rb.state_dict())
    assert isinstance(other.sample(), torch.Tensor) and other[:].tolist() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------- memmap cleanup
def test_memmap_cleanup(tmp_path: Path) -> None:
    temp = LazyMemmapStorage(10)
    assert temp.auto_cleanup and temp.scratch_dir.exists()
    path = temp.scratch_dir
    rb = ReplayBuffer(storage=temp)
    rb.extend(torch.arange(3))
    del rb, temp
    gc.collect()
    assert not path.exists()  # a temporary directory goes with its storage

    kept = LazyMemmapStorage(10, scratch_dir=tmp_path / "kept")
    assert not kept.auto_cleanup
    ReplayBuffer(storage=kept).extend(torch.arange(3))
    del kept
    gc.collect()
    assert (tmp_path / "kept" / "meta.json").exists()  # a given directory outlives it

    storage = LazyMemmapStorage(10, scratch_dir=tmp_path / "gone", auto_cleanup=True)
    rb = ReplayBuffer(storage=storage)
    rb.extend(torch.arange(3))
    assert storage.cleanup() is True and not (tmp_path / "gone").exists()
    assert storage.cleanup() is False
    with pytest.raises(RuntimeError, match="cleaned up"):
        rb.extend(torch.arange(3))
    with pytest.raises(TypeError, match="auto_cleanup"):
        LazyMemmapStorage(10, auto_cleanup="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- trajectory keys
def test_traj_key_falls_back_to_end_flags_and_episode_is_detected() -> None:
    done = torch.tensor([False, False, True, False, True]).unsqueeze(-1)
    g = torch.arange(5)
    # A traj_key absent from the data falls back to the end flags (as in TorchRL).
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SliceSampler(slice_len=2, traj_key="my_ids", as_sequences=True, seed=0),
        batch_size=20,
    )
    rb.extend(TensorDict({DONE: done, "g": g}, [5]))
    assert rb.index.num_trajectories == 2
    pairs = {tuple(row) for row in rb.sample()["g"].tolist()}
    assert pairs <= {(0, 1), (1, 2), (3, 4)}
    # TorchRL's "episode" key is detected like ("collector", "traj_ids").
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SliceSampler(slice_len=2, as_sequences=True, seed=0),
        batch_size=20,
    )
    episode = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    rb.extend(TensorDict({"episode": episode, "g": g}, [5]))
    assert {tuple(row) for row in rb.sample()["g"].tolist()} <= {(0, 1), (2, 3), (3, 4)}
    # ("collector", "traj_ids") wins over "episode"; an explicit traj_key wins over both.
    both = TensorDict({TRAJ_IDS: torch.tensor([0, 0, 0, 1, 1]), "episode": episode, "g": g}, [5])
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    rb.extend(both)
    assert rb.index.describe(2)[0] == 0
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2, traj_key="episode")
    )
    rb.extend(both)
    assert rb.index.describe(2)[0] == 1


def test_int32_ids_under_a_custom_traj_key() -> None:
    """One contract: integer ids of any dtype, read as int64 (the buffer refused int32)."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(50),
        sampler=SliceSampler(slice_len=4, traj_key=("my", "ids"), as_sequences=True, seed=0),
        batch_size=16,
    )
    stream = SyntheticStream(3, 6.0, seed=2, labels=True)
    batch = stream.chunk(10)
    batch["my", "ids"] = batch.pop(TRAJ_IDS).to(torch.int32)
    rb.extend(batch)
    assert_slices_contiguous(rb.sample())


# ---------------------------------------------------------------------- transition samplers
def test_sampler_without_replacement_epochs() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(20), sampler=SamplerWithoutReplacement(seed=0), batch_size=6
    )
    rb.extend(torch.arange(20))
    batches = [b.tolist() for b in rb]
    assert [len(b) for b in batches] == [6, 6, 6, 2]
    assert sorted(x for b in batches for x in b) == list(range(20))
    assert sorted(x for b in rb for x in b.tolist()) == list(range(20))  # a new epoch
    dropping = ReplayBuffer(
        storage=LazyTensorStorage(20),
        sampler=SamplerWithoutReplacement(drop_last=True, shuffle=False, seed=0),
        batch_size=6,
    )
    dropping.extend(torch.arange(20))
    assert [b.tolist() for b in dropping] == [
        [0, 1, 2, 3, 4, 5],
        [6, 7, 8, 9, 10, 11],
        [12, 13, 14, 15, 16, 17],
    ]
    with pytest.raises(ValueError, match="greater than the storage capacity"):
        dropping.sample(21)


def test_sampler_without_replacement_skips_overwritten_steps() -> None:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement(seed=0), batch_size=4
    )
    rb.extend(torch.arange(10))
    first = rb.sample().tolist()
    rb.extend(torch.arange(10, 15))  # overwrites 0..4
    rest = []
    while not rb.sampler.ran_out:
        rest += rb.sample().tolist()
    seen = first + rest
    assert len(set(seen)) == len(seen)
    assert set(rest) <= set(range(5, 10))  # the epoch's snapshot, minus overwritten steps


def test_prioritized_sampler_draws_in_proportion_and_weights() -> None:
    sampler = PrioritizedSampler(1000, alpha=0.5, beta=1.0, eps=0.0, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), sampler=sampler)
    rows = rb.extend(torch.arange(1000))
    priority = torch.ones(1000)
    priority[:10] = 100.0  # p ** alpha = 10: 10 rows hold 100 / (100 + 990) of the mass
    rb.update_priority(rows, priority)
    sample, info = rb.sample(20_000, return_info=True)
    hot = (sample < 10).float().mean().item()
    assert hot == pytest.approx(100 / 1090, abs=0.01)
    w = info["priority_weight"]
    assert torch.allclose(w[sample < 10], torch.tensor(0.1)) and torch.allclose(
        w[sample >= 10], torch.tensor(1.0)
    )
    # New steps get the largest priority given so far.
    new = rb.extend(torch.arange(1000, 1010))
    assert np.allclose(sampler.priority(new.numpy()), 10.0)
    # -1 and repeated rows: the last value wins; bad priorities are refused.
    rb.update_priority(torch.tensor([-1, 5, 5]), torch.tensor([9.0, 4.0, 16.0]))
    assert sampler.priority(np.array([5]))[0] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="finite"):
        rb.update_priority(torch.tensor([1]), torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="max_capacity"):
        ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(11, 0.5, 0.5))


def _chi2_quantile(df: int, z: float = 3.719) -> float:
    """The chi-square quantile at normal deviate ``z`` (3.719: upper tail 1e-4), by
    Wilson-Hilferty (within 0.5% for df >= 30)."""
    c = 2 / (9 * df)
    return df * (1 - c + z * c**0.5) ** 3


def test_prioritized_sampler_counts_follow_the_priorities() -> None:
    """Chi-square of how often each row is drawn against ``(p + eps) ** alpha / sum``, over
    1,000 rows in 32 blocks of the sum tree (one in ten with priority 0: never drawn with
    ``eps=0``; rows holding nothing: never drawn), before and after an update; every
    importance weight is ``(w_i / w_min) ** -beta`` of its row."""
    alpha, beta = 0.7, 0.5
    sampler = PrioritizedSampler(1024, alpha=alpha, beta=beta, eps=0.0, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(1024), sampler=sampler)
    rows = rb.extend(torch.arange(1000))
    gen = np.random.default_rng(0)
    priority = gen.uniform(0.05, 4.0, 1000)
    priority[gen.random(1000) < 0.1] = 0.0
    for phase in range(2):
        if phase:  # a third of the rows change; new zeros and revived rows included
            changed = gen.choice(1000, 333, replace=False)
            priority[changed] = np.where(gen.random(333) < 0.1, 0.0, gen.uniform(0, 9, 333))
        rb.update_priority(rows[torch.from_numpy(np.arange(1000))], torch.from_numpy(priority))
        sample, info = rb.sample(300_000, return_info=True)
        index = info["index"].numpy()
        counts = np.bincount(index, minlength=1024)
        weight = np.zeros(1024)
        weight[:1000] = priority**alpha
        assert counts[weight == 0].sum() == 0  # priority 0 and empty rows are never drawn
        live = weight > 0
        expected = weight[live] / weight.sum() * index.size
        stat = float(((counts[live] - expected) ** 2 / expected).sum())
        assert stat < _chi2_quantile(int(live.sum()) - 1), stat
        w_min = weight[live].min()
        assert torch.allclose(
            info["priority_weight"], torch.from_numpy((weight[index] / w_min) ** -beta).float()
        )
        assert torch.equal(sample, info["index"])  # the stored value is the row here


def test_prioritized_sampler_reduces_per_step_priorities() -> None:
    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0, eps=0.0, reduction="mean", seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler)
    rows = rb.extend(torch.arange(3))
    rb.update_priority(rows, torch.tensor([[1.0, 3.0], [2.0, 2.0], [0.0, 8.0]]))
    assert sampler.priority(rows.numpy()).tolist() == [2.0, 2.0, 4.0]
