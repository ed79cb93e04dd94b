"""TrajectoryAssembler: complete episodes out of chunked streams, in every corner case."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import LayoutError, TrajectoryAssembler
from splice.layout import CUT, DONE, IS_INIT, MASK, TERMINATED, TRAJ_IDS, TRUNCATED
from splice.testing import synthetic_rollout


def make_batch(ids, done, *, terminated=None, cut=None, obs=None) -> TensorDict:
    """A 1-D batch (TorchRL's ``_make_batch`` helper, plus our cut flag)."""
    n = len(ids)
    td = TensorDict(
        {
            TRAJ_IDS: torch.tensor(ids),
            DONE: torch.tensor(done).view(n, 1),
            "obs": torch.arange(n) if obs is None else torch.tensor(obs),
        },
        batch_size=[n],
    )
    if terminated is not None:
        td[TERMINATED] = torch.tensor(terminated).view(n, 1)
    if cut is not None:
        td[CUT] = torch.tensor(cut)
    return td


def chunk_stream(stream: TensorDict, chunk: int, *, set_truncated: bool) -> list[TensorDict]:
    """Cut a ``[B, T]`` stream into ``[B, chunk]`` batches the way a collector does."""
    batches = []
    for lo in range(0, stream.shape[1], chunk):
        batch = stream[:, lo : lo + chunk].clone()
        in_flight = ~batch[DONE][:, -1, 0]
        batch[CUT] = torch.zeros(batch.shape, dtype=torch.bool)
        batch[CUT][:, -1] = in_flight
        if set_truncated:  # TorchRL's marks: truncated and done on every in-flight last step
            batch[TRUNCATED][:, -1, 0] |= in_flight
            batch[DONE][:, -1, 0] |= in_flight
        batches.append(batch)
    return batches


# ---------------------------------------------------------------- TorchRL's own cases
def test_single_batch_complete() -> None:
    asm = TrajectoryAssembler()
    n = asm.ingest(make_batch([0, 0, 0, 1, 1, 2], [False, False, True, False, True, True]))
    assert n == 3 and len(asm) == 3 and asm.num_in_flight == 0


def test_trajectory_spanning_batches() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0, 0], [False] * 3, obs=[0, 1, 2]))
    assert len(asm) == 0 and asm.num_in_flight == 1 and asm.frames_in_flight == 3
    asm.ingest(make_batch([0, 0], [False, True], obs=[3, 4]))
    out = asm.emit(1)
    assert out.batch_size == torch.Size([1, 5])
    assert out["obs"].tolist() == [[0, 1, 2, 3, 4]]


def test_interleaved_ids_keep_step_order() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 1, 0, 1], [False, False, True, True]))
    out = asm.emit(2)
    assert out["obs"].tolist() == [[0, 2], [1, 3]]


def test_partial_is_not_promoted() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0, 1], [False, True, False]))
    assert len(asm) == 1
    with pytest.raises(ValueError, match="1 complete episode"):
        asm.emit(2)
    assert len(asm) == 1 and asm.frames_buffered == 3  # nothing removed by the failed call


def test_emit_shape_mask_and_padding() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0, 0, 0, 1, 1], [False, False, False, True, False, True]))
    out = asm.emit(2)
    assert out.batch_size == torch.Size([2, 4])
    assert out[MASK].tolist() == [[True] * 4, [True, True, False, False]]
    assert out[TRAJ_IDS].tolist() == [[0] * 4, [1, 1, -1, -1]]


def test_emit_in_several_batches() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 1, 2, 3], [True] * 4))
    assert asm.emit(2)[TRAJ_IDS].tolist() == [[0], [1]]
    assert asm.emit(2)[TRAJ_IDS].tolist() == [[2], [3]]
    assert len(asm) == 0


def test_terminated_alone_completes() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0], [False, False], terminated=[False, True]))
    assert len(asm) == 1


def test_cat_format() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0, 0, 0, 1, 1], [False, False, False, True, False, True]))
    out = asm.emit(2, traj_format="cat")
    assert out.batch_size == torch.Size([6])
    assert MASK not in out.keys(True)
    assert out[DONE].view(-1).tolist() == [False, False, False, True, False, True]


def test_completion_order_is_time_then_env() -> None:
    asm = TrajectoryAssembler()
    ids = torch.tensor([[0, 0, 2], [1, 3, 3]])
    done = torch.tensor([[False, True, True], [True, False, True]])
    asm.ingest(TensorDict({TRAJ_IDS: ids, DONE: done.unsqueeze(-1)}, [2, 3]))
    # env 1 finishes id 1 at t=0, env 0 finishes id 0 at t=1, then ids 2 and 3 at t=2.
    assert asm.emit(4)[TRAJ_IDS][:, 0].tolist() == [1, 0, 2, 3]


# ---------------------------------------------------------------------- cuts
def test_collector_cut_never_completes_an_episode() -> None:
    # TorchRL emits this fragment as "complete" when set_truncated marks it done.
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0], [False, True], cut=[False, True]))
    assert len(asm) == 0 and asm.num_in_flight == 1
    asm.ingest(make_batch([0, 0], [False, True], cut=[False, False]))
    out = asm.emit(1)
    # The collector's mark inside the stitched episode is gone: one end, at the last step.
    assert out[DONE].view(-1).tolist() == [False, False, False, True]
    assert out[CUT].view(-1).tolist() == [False] * 4


def test_flush_returns_in_flight_marked_cut() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([5, 5, 6, 7, 7], [False, True, False, False, False]))
    leftovers = asm.flush()
    assert leftovers is not None
    assert leftovers[TRAJ_IDS].tolist() == [[6, -1], [7, 7]]
    assert leftovers[CUT].tolist() == [[True, False], [False, True]]
    assert (leftovers[DONE] == False).all()  # noqa: E712
    assert len(asm) == 1 and asm.num_in_flight == 0  # the complete one stays for emit()
    assert asm.flush() is None


def test_bad_input_leaves_state_unchanged() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0], [False, False]))
    snapshot = (len(asm), asm.frames_buffered, asm.num_in_flight)
    bad = [
        (TensorDict({DONE: torch.zeros(2, 1, dtype=torch.bool)}, [2]), "traj_ids"),
        (make_batch([0, 0], [False, False]).exclude(DONE), "end-of-episode flag"),
        (make_batch([0, 0], [False, False]).set("extra", torch.zeros(2)), "unexpected"),
        (make_batch([0, 0], [False, False]).set("obs", torch.zeros(2)), "'obs'"),
        (make_batch([0, 0], [False, False]).set(TRAJ_IDS, torch.zeros(2)), "integer dtype"),
        (
            make_batch([0, 0], [False, False]).set(TRAJ_IDS, torch.zeros(2, dtype=torch.complex64)),
            "integer dtype",
        ),
        (make_batch([0, 0], [False, False]).set(MASK, torch.ones(2)), "mask must have dtype"),
        (make_batch([0, 0], [False, False]).set(DONE, torch.zeros(2, 1)), "bool flag"),
        (make_batch([0, 0], [False, False]).unsqueeze(0).unsqueeze(0), r"\[T\] or \[B, T\]"),
    ]
    for batch, match in bad:
        with pytest.raises(LayoutError, match=match):
            asm.ingest(batch)
        assert (len(asm), asm.frames_buffered, asm.num_in_flight) == snapshot
    with pytest.raises(TypeError, match="expects a TensorDict, got dict"):
        asm.ingest(dict(make_batch([0, 0], [False, False]).items()))
    assert (len(asm), asm.frames_buffered, asm.num_in_flight) == snapshot
    asm.ingest(make_batch([0], [True]))
    assert asm.emit(1)["obs"].tolist() == [[0, 1, 0]]


def test_bad_arguments() -> None:
    asm = TrajectoryAssembler()
    with pytest.raises(ValueError, match="traj_format must be one of"):
        asm.emit(0, traj_format="nested")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 0"):
        asm.emit(1)


def test_padding_steps_are_ignored() -> None:
    asm = TrajectoryAssembler()
    batch = make_batch([0, -1, 0], [False, False, True])
    asm.ingest(batch)
    assert asm.emit(1)["obs"].tolist() == [[0, 2]]


def test_memory_stays_bounded_by_what_is_buffered() -> None:
    asm = TrajectoryAssembler()
    stream = synthetic_rollout(4, 4000, 20.0, seed=0, first_is_init=True)
    for batch in chunk_stream(stream, 50, set_truncated=False):
        asm.ingest(batch)
        while len(asm) >= 8:
            asm.emit(8)
        # Capacity never exceeds a small multiple of the live steps (plus one batch).
        assert asm._ids.numel() <= max(4 * asm.frames_buffered, 1024)


# --------------------------------------------------------------- property test
@settings(max_examples=40, deadline=None)
@given(
    n_env=st.integers(1, 4),
    n_steps=st.integers(1, 80),
    mean_len=st.floats(1.0, 25.0),
    chunk=st.integers(1, 30),
    per_emit=st.integers(1, 5),
    set_truncated=st.booleans(),
    traj_format=st.sampled_from(["padded", "cat"]),
    seed=st.integers(0, 1000),
)
def test_stream_reassembles_every_episode_exactly(
    n_env, n_steps, mean_len, chunk, per_emit, set_truncated, traj_format, seed
) -> None:
    stream = synthetic_rollout(n_env, n_steps, mean_len, seed=seed, first_is_init=True)
    asm = TrajectoryAssembler()
    episodes: list[TensorDict] = []
    for batch in chunk_stream(stream, chunk, set_truncated=set_truncated):
        asm.ingest(batch)
        while len(asm) >= per_emit:
            episodes.extend(unpack(asm.emit(per_emit, traj_format=traj_format), traj_format))
    episodes.extend(unpack(asm.emit(traj_format=traj_format), traj_format))
    leftovers = asm.flush(traj_format=traj_format)
    fragments = [] if leftovers is None else unpack(leftovers, traj_format)
    assert asm.frames_buffered == 0 and len(asm) == 0

    original = stream.reshape(-1)
    seen = []
    for ep in episodes:
        ids = ep[TRAJ_IDS]
        assert (ids == ids[0]).all()
        expected = original[original[TRAJ_IDS] == ids[0]]
        # Exactly the original episode, in order, complete: is_init first, one env end, last.
        assert torch.equal(ep["observation"], expected["observation"])
        assert ep[IS_INIT][0].item()
        assert ep[DONE].view(-1).tolist() == [False] * (len(ep) - 1) + [True]
        assert torch.equal(ep[TRUNCATED], expected[TRUNCATED])
        assert not ep[CUT].any()
        seen.append(ep["observation"][:, 0])
    for frag in fragments:
        expected = original[original[TRAJ_IDS] == frag[TRAJ_IDS][0]]
        assert torch.equal(frag["observation"], expected["observation"])
        assert frag[CUT].tolist() == [False] * (len(frag) - 1) + [True]
        assert not frag[DONE].any()
        seen.append(frag["observation"][:, 0])
    # Every transition exactly once.
    all_steps = torch.cat(seen).to(torch.int64).sort().values if seen else torch.zeros(0)
    assert all_steps.tolist() == list(range(stream.numel()))


def unpack(out: TensorDict, traj_format: str) -> list[TensorDict]:
    """One TensorDict per episode, whatever the format."""
    if traj_format == "padded":
        return [row[row[MASK]].exclude(MASK) for row in out.unbind(0)]
    ends = torch.ones(len(out), dtype=torch.bool)
    ends[:-1] = out[TRAJ_IDS][1:] != out[TRAJ_IDS][:-1]
    bounds = [0, *(ends.nonzero().squeeze(1) + 1).tolist()]
    return [out[a:b] for a, b in itertools.pairwise(bounds)]


# ------------------------------------------------- ids are never reused (issue 11, item 10)
def state(asm: TrajectoryAssembler) -> tuple[int, int, int]:
    return len(asm), asm.num_in_flight, asm.frames_buffered


def test_ingesting_a_batch_twice_is_refused_and_changes_nothing() -> None:
    """Ingesting one batch twice used to queue its episodes twice: ``emit`` then returned rows
    of length 0."""
    batch = make_batch([0, 0, 1, 1, 1, 2], [False, True, False, False, True, False])
    asm = TrajectoryAssembler()
    assert asm.ingest(batch) == 2
    before = state(asm)
    with pytest.raises(LayoutError, match=r"trajectory id\(s\) \[0, 1\] that already completed"):
        asm.ingest(batch)
    assert state(asm) == before
    out = asm.emit()
    assert out[MASK].sum(1).tolist() == [2, 3]  # no empty rows
    assert out["obs"][out[MASK]].tolist() == [0, 1, 2, 3, 4]


def test_steps_for_an_emitted_episode_are_refused() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([0, 0, 1], [False, True, False]))
    asm.emit(1)  # episode 0 leaves the assembler; its id stays used
    before = state(asm)
    with pytest.raises(LayoutError, match=r"\[0\] that already completed"):
        asm.ingest(make_batch([1, 0], [False, False]))
    assert state(asm) == before
    asm.ingest(make_batch([1, 2], [True, False]))  # the assembler goes on normally
    assert asm.emit(1)["obs"][0].tolist() == [2, 0]


@pytest.mark.parametrize(
    ("ids", "done"),
    [
        ([5, 5], [True, False]),  # the step right after the end
        ([5, 5, 5], [True, False, True]),  # ... and a second end
        ([5, 6, 5], [True, False, False]),  # the id comes back after another one
        ([5, 6, 5], [True, False, True]),  # ... and ends again
    ],
)
def test_steps_after_an_episode_end_in_the_same_batch_are_refused(ids, done) -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([7], [False]))
    before = state(asm)
    with pytest.raises(LayoutError, match=r"\[5\] have steps after the step that ends them"):
        asm.ingest(make_batch(ids, done))
    assert state(asm) == before


def test_reset_forgets_the_completed_ids() -> None:
    asm = TrajectoryAssembler()
    batch = make_batch([0, 0], [False, True])
    asm.ingest(batch)
    asm.reset()
    assert asm.ingest(batch) == 1


def test_ids_below_minus_one_are_refused() -> None:
    asm = TrajectoryAssembler()
    with pytest.raises(LayoutError, match="below -1, the first -7 at flat position 2"):
        asm.ingest(make_batch([0, 0, -7, 0, 0], [False, False, False, False, True]))
    assert state(asm) == (0, 0, 0)


def test_batches_without_real_steps_add_nothing() -> None:
    asm = TrajectoryAssembler()
    asm.ingest(make_batch([3], [False]))
    before = state(asm)
    empty = TensorDict(
        {
            TRAJ_IDS: torch.zeros(2, 0, dtype=torch.int64),
            DONE: torch.zeros(2, 0, 1, dtype=torch.bool),
            "obs": torch.zeros(2, 0, dtype=torch.int64),
        },
        [2, 0],
    )
    assert asm.ingest(empty) == 0
    assert asm.ingest(make_batch([-1, -1], [True, False])) == 0  # all padding
    assert state(asm) == before


@settings(max_examples=40, deadline=None)
@given(
    n_env=st.integers(1, 4),
    n_steps=st.integers(2, 60),
    mean_len=st.floats(1.0, 10.0),
    chunk=st.integers(1, 20),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_replaying_any_chunk_with_a_completed_id_is_refused_and_changes_nothing(
    n_env, n_steps, mean_len, chunk, seed, data
) -> None:
    """Feed a collector-like stream, then ingest one of its earlier chunks again: refused
    exactly when that chunk holds a step of an episode that has completed since."""
    stream = synthetic_rollout(n_env, n_steps, mean_len, seed=seed, first_is_init=True)
    batches = chunk_stream(stream, chunk, set_truncated=False)
    upto = data.draw(st.integers(1, len(batches)))
    again = batches[data.draw(st.integers(0, upto - 1))]
    asm = TrajectoryAssembler()
    completed: set[int] = set()
    for batch in batches[:upto]:
        asm.ingest(batch)
        completed |= set(batch[TRAJ_IDS][batch[DONE][..., 0]].tolist())
    before = state(asm)
    if completed & set(again[TRAJ_IDS].reshape(-1).tolist()):
        with pytest.raises(LayoutError, match="already completed"):
            asm.ingest(again)
        assert state(asm) == before
