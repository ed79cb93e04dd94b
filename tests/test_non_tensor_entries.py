"""Non-tensor entries (per-step Python objects, e.g. text observations) are carried exactly
through every layer — split and cat, the assembler, the replay buffer with every sampler,
state_dict, dumps/loads and memory-mapped reopening — and refused by name only where they
would be lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from splice import (
    Collector,
    LayoutError,
    ReplayBuffer,
    TrajectoryAssembler,
    cat_trajectories,
    split_trajectories,
)
from splice._non_tensor import non_tensor_values, to_non_tensor
from splice.layout import tensor_leaves
from splice.policies import PolicyError
from splice.replay import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from splice.testing import SyntheticStream, synthetic_rollout

TEXT_KEY = ("info", "text")
NEXT_TEXT_KEY = ("next", "info", "text")
#: Any text: unicode of every plane, NUL, lone surrogates (which UTF-8 cannot hold without
#: surrogatepass), the empty string; and None.
CHARS = st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\x00", "é", "🙂"]))
VALUES = st.one_of(st.none(), st.text(alphabet=CHARS, max_size=8))

SAMPLERS = {
    "random": lambda: RandomSampler(seed=1),
    "without": lambda: SamplerWithoutReplacement(seed=1),
    "prioritized": lambda: PrioritizedSampler(40, alpha=0.7, beta=0.5, seed=1),
    "slice": lambda: SliceSampler(slice_len=4, strict_length=False, pad_output=True, seed=1),
    "slice-transition": lambda: SliceSampler(
        slice_len=4, weighting="transition", burn_in=2, as_sequences=True, seed=1
    ),
    "slice-without": lambda: SliceSamplerWithoutReplacement(slice_len=3, seed=1),
    "slice-prioritized": lambda: PrioritizedSliceSampler(
        alpha=0.7, beta=0.5, slice_len=3, seed=1, state_keys=[TEXT_KEY]
    ),
}


def with_text(batch: TensorDictBase, texts: list[Any]) -> TensorDictBase:
    """Give every step the text of its global index ``g`` (and its successor's as "next")."""
    g = batch["g"].numpy()
    batch.set(TEXT_KEY, to_non_tensor(_lookup(texts, g)))
    batch.set(NEXT_TEXT_KEY, to_non_tensor(_lookup(texts, g + 1)))
    return batch


def _lookup(texts: list[Any], g: np.ndarray) -> np.ndarray:
    out = np.empty(g.shape, dtype=object)
    for index, value in np.ndenumerate(g):
        out[index] = texts[int(value) % len(texts)]
    return out


def check_lined_up(td: TensorDictBase, texts: list[Any]) -> None:
    """Every step's text is the one of its ``g`` (padding repeats a real step: so does g)."""
    g = td["g"].numpy()
    assert non_tensor_values(td.get(TEXT_KEY)).tolist() == _lookup(texts, g).tolist()
    assert non_tensor_values(td.get(NEXT_TEXT_KEY)).tolist() == _lookup(texts, g + 1).tolist()


def chunks(texts: list[Any], seed: int, n: int = 5, steps: int = 9) -> list[TensorDictBase]:
    stream = SyntheticStream(3, 4.0, seed=seed, labels=True)
    return [with_text(stream.chunk(steps), texts) for _ in range(n)]


TEXTS = st.lists(VALUES, min_size=1, max_size=40)
PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@given(texts=TEXTS, seed=st.integers(0, 2**16))
@PROPERTY
def test_split_cat_and_assembler_carry_text_exactly(texts: list[Any], seed: int) -> None:
    assembler = TrajectoryAssembler()
    for batch in chunks(texts, seed):
        split = split_trajectories(batch)
        mask = split["collector", "mask"].numpy()
        g = split["g"].numpy()
        text = non_tensor_values(split.get(TEXT_KEY))
        assert text[mask].tolist() == _lookup(texts, g[mask]).tolist()
        # padding repeats each trajectory's last text (one object per row when constant)
        last = mask.sum(1) - 1
        assert (text == text[np.arange(len(last)), last][:, None])[~mask].all()
        back = cat_trajectories(split)
        check_lined_up(back, texts)
        assembler.ingest(batch)
    for episodes in (assembler.emit(traj_format="padded"), assembler.flush("cat")):
        if episodes is None:
            continue
        if episodes.ndim == 2:
            episodes = cat_trajectories(episodes)
        check_lined_up(episodes, texts)


@given(texts=TEXTS, seed=st.integers(0, 2**16), kind=st.sampled_from(sorted(SAMPLERS)))
@PROPERTY
def test_replay_samples_line_up_with_their_steps(texts: list[Any], seed: int, kind: str) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(40), sampler=SAMPLERS[kind](), batch_size=12)
    for batch in chunks(texts, seed):  # 135 steps into 40 rows: wrapped
        rows = rb.extend(batch)
        check_lined_up(rb[rows.reshape(-1)], texts)
    for _ in range(3):
        sample, info = rb.sample(return_info=True)
        check_lined_up(sample, texts)
        if "initial_state" in info:
            first = info["index"][:, 0]
            want = non_tensor_values(rb[first].get(TEXT_KEY)).tolist()
            assert non_tensor_values(info["initial_state"].get(TEXT_KEY)).tolist() == want


@given(texts=TEXTS, seed=st.integers(0, 2**16))
@PROPERTY
def test_persistence_round_trips_text_exactly(texts: list[Any], seed: int, tmp_path: Path) -> None:
    def fresh(storage: Any = None) -> ReplayBuffer:
        return ReplayBuffer(
            storage=storage if storage is not None else LazyTensorStorage(40),
            sampler=SliceSampler(slice_len=3, seed=2),
            batch_size=12,
        )

    directory = tmp_path / f"mm-{seed}-{len(texts)}"
    rb, mm = fresh(), fresh(LazyMemmapStorage(40, scratch_dir=directory))
    for batch in chunks(texts, seed):
        rb.extend(batch)
        mm.extend(batch)
    loaded = fresh()
    state = rb.state_dict()
    torch.save(state, tmp_path / "state.pt")
    loaded.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    rb.dumps(tmp_path / "saved")
    restored = fresh()
    restored.loads(tmp_path / "saved")
    del mm
    reopened = fresh(LazyMemmapStorage(40, scratch_dir=directory))
    rows = torch.from_numpy(rb.index.live_rows())
    want = non_tensor_values(rb[rows].get(TEXT_KEY)).tolist()
    first = rb.sample()  # every copy was saved or opened before rb sampled
    for other in (loaded, restored, reopened):
        got = non_tensor_values(other[rows].get(TEXT_KEY)).tolist()
        assert got == want  # None included, every str exactly
        sample = other.sample()
        check_lined_up(sample, texts)
        if other is not reopened:  # a reopened index is rebuilt: it draws differently
            assert torch.equal(sample["g"], first["g"])
    reopened.storage.cleanup()


def test_memmap_text_log_compacts_and_reopens(tmp_path: Path) -> None:
    """Distinct texts keep arriving (a log of them grows); the log is compacted into a new
    generation and the directory reopens with every live text."""
    path = tmp_path / "mm"
    rb = ReplayBuffer(storage=LazyMemmapStorage(64, scratch_dir=path))
    stream = SyntheticStream(2, 6.0, seed=0, labels=True)
    big = [f"{i:06d}" * 2000 for i in range(300)]  # 12 kB each: 1 MiB after ~90 steps
    for _ in range(40):
        rb.extend(with_text(stream.chunk(8), big))
    generations = {p.name.split(".")[1] for p in path.glob("obj_000.*.log")}
    assert generations != {"0"} and len(generations) == 1  # compacted, old files gone
    assert sum(p.stat().st_size for p in path.glob("obj_000.*.log")) < 4 << 20
    rows = torch.from_numpy(rb.index.live_rows())
    check_lined_up(rb[rows], big)
    want = non_tensor_values(rb[rows].get(TEXT_KEY)).tolist()
    del rb
    again = ReplayBuffer(storage=LazyMemmapStorage(64, scratch_dir=path))
    assert non_tensor_values(again[rows].get(TEXT_KEY)).tolist() == want
    check_lined_up(again[rows], big)


def test_in_memory_buffer_keeps_any_object_but_saves_text_only(tmp_path: Path) -> None:
    batch = synthetic_rollout(2, 5, 3.0)
    values = np.empty((2, 5), dtype=object)
    for i in range(10):
        values.flat[i] = {"step": i}
    batch.set("payload", to_non_tensor(values))
    rb = ReplayBuffer(storage=LazyTensorStorage(20))
    rows = rb.extend(batch)
    got = non_tensor_values(rb[rows].get("payload"))
    assert all(a is b for a, b in zip(got.flat, values.flat, strict=True))  # kept, not copied
    with pytest.raises(LayoutError, match=r"key 'payload'.*as text.*got a dict"):
        rb.state_dict()
    with pytest.raises(LayoutError, match=r"key 'payload'.*as text.*got a dict"):
        rb.dumps(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()  # refused before anything was written
    mm = ReplayBuffer(storage=LazyMemmapStorage(20, scratch_dir=tmp_path / "mm"))
    with pytest.raises(LayoutError, match=r"key 'payload'.*LazyMemmapStorage.*got a dict"):
        mm.extend(batch)
    assert len(mm) == 0 and mm.storage.schema is None  # unchanged
    values.flat[3] = "fine"
    with pytest.raises(LayoutError, match=r"got a dict at position 0"):
        mm.extend(batch)


def test_in_place_writes_of_text(tmp_path: Path) -> None:
    for storage in (LazyTensorStorage(30), LazyMemmapStorage(30, scratch_dir=tmp_path / "mm")):
        rb = ReplayBuffer(storage=storage)
        texts = [f"t{i}" for i in range(50)]
        rows = rb.extend(chunks(texts, 0, n=1)[0]).reshape(-1)
        new = rb[rows[:4]]
        new.set(TEXT_KEY, to_non_tensor(np.array(["a", "b", None, "d"], dtype=object)))
        rb[rows[:4]] = new
        got = non_tensor_values(rb[rows[:5]].get(TEXT_KEY)).tolist()
        assert got == ["a", "b", None, "d", texts[int(rb[rows[4]]["g"])]]
    del rb
    reopened = ReplayBuffer(storage=LazyMemmapStorage(30, scratch_dir=tmp_path / "mm"))
    got = non_tensor_values(reopened[rows[:4]].get(TEXT_KEY)).tolist()
    assert got == ["a", "b", None, "d"]


def test_refused_where_it_would_be_lost() -> None:
    batch = synthetic_rollout(2, 6, 3.0)
    # one object per step only: an entry with extra dims is not a per-step value
    batch.set("wide", NonTensorData(data="x", batch_size=[2, 6, 3]))
    for op in (split_trajectories, TrajectoryAssembler().ingest, ReplayBuffer().extend):
        with pytest.raises(LayoutError, match=r"key 'wide': a non-tensor entry must hold one"):
            op(batch)
    del batch["wide"]
    batch.set("text", NonTensorData(data="x", batch_size=[2, 6]))
    rb = ReplayBuffer()
    rb.extend(batch)
    batch2 = synthetic_rollout(2, 6, 3.0, seed=1, first_id=100)
    batch2["text"] = torch.zeros(2, 6)  # the key changed kind
    with pytest.raises(LayoutError, match=r"key 'text': the buffer stores non-tensor entries"):
        rb.extend(batch2)
    assert len(rb) == 12


def test_non_tensor_stack_entries_are_seen() -> None:
    """tensordict's leaf listing skips NonTensorStack entries: they are carried (or refused)
    like NonTensorData, never silently dropped (regression: the batch contract missed them)."""
    td = TensorDict({"x": torch.zeros(2, 3)}, [2, 3])
    td.set("text", to_non_tensor(np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)))
    assert isinstance(td.get("text"), NonTensorStack)
    with pytest.raises(LayoutError, match="'text' holds NonTensorStack"):
        list(tensor_leaves(td))


def test_collector_refuses_a_policy_writing_non_tensors() -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        td.set_non_tensor("note", "hello")
        return td

    collector = Collector(gym.make("CartPole-v1"), policy, frames_per_batch=10, total_frames=10)
    with pytest.raises(PolicyError, match="'note' holds NonTensorData"):
        next(iter(collector))
    collector.shutdown()
