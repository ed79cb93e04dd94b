"""split_trajectories / cat_trajectories: invariants, TorchRL's defects fixed, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from splice import LayoutError, cat_trajectories, split_trajectories
from splice.layout import CUT, DONE, MASK, TRAJ_IDS
from splice.testing import synthetic_rollout

rollouts = st.builds(
    synthetic_rollout,
    n_env=st.integers(1, 5),
    n_steps=st.integers(1, 40),
    mean_len=st.floats(1.0, 15.0),
    seed=st.integers(0, 10_000),
    first_id=st.integers(0, 1_000),
)


def step_index(td: TensorDict) -> torch.Tensor:
    """The counting payload: the global step index of every step."""
    return td["observation"][..., 0].to(torch.int64)


def check_split(batch: TensorDict, out: TensorDict) -> None:
    """The invariants every split must satisfy, checked against the counting payload."""
    mask = out[MASK]
    ids = out[TRAJ_IDS]
    steps = step_index(out)
    flat_ids = batch[TRAJ_IDS].reshape(-1)
    # Every transition appears exactly once.
    assert int(mask.sum()) == batch.numel()
    assert sorted(steps[mask].tolist()) == list(range(batch.numel()))
    # Padding: ids -1, everything else zero; the mask is a prefix of each row.
    assert (ids[~mask] == -1).all() and (steps[~mask] == 0).all()
    lengths = mask.sum(1)
    assert (mask == (torch.arange(mask.shape[1]) < lengths[:, None])).all()
    # No row crosses a trajectory boundary; each id gets exactly one row, with all its steps.
    row_ids = ids[:, 0]
    assert (ids[mask] == row_ids.repeat_interleave(lengths)).all()
    assert row_ids.unique().numel() == out.shape[0]
    for row, traj in enumerate(row_ids.tolist()):
        assert lengths[row] == int((flat_ids == traj).sum())
        # Steps in time order within the row (the payload counts up, env row by env row).
        real = steps[row, : lengths[row]]
        assert (real[1:] > real[:-1]).all()
    # Rows in order of first appearance in the env-major flattening.
    first_seen = [flat_ids.tolist().index(t) for t in row_ids.tolist()]
    assert first_seen == sorted(first_seen)


@settings(max_examples=60, deadline=None)
@given(rollouts)
def test_split_invariants(batch: TensorDict) -> None:
    check_split(batch, split_trajectories(batch))


@settings(max_examples=60, deadline=None)
@given(rollouts)
def test_cat_inverts_split_exactly(batch: TensorDict) -> None:
    out = cat_trajectories(split_trajectories(batch))
    flat = batch.reshape(-1)
    # x reordered by trajectory: stable sort of the flat steps by their row.
    first_seen = {}
    for t in flat[TRAJ_IDS].tolist():
        first_seen.setdefault(t, len(first_seen))
    row = torch.tensor([first_seen[t] for t in flat[TRAJ_IDS].tolist()])
    expected = flat[torch.sort(row, stable=True).indices]
    assert set(out.keys(True, True)) == set(expected.keys(True, True))
    assert (out == expected).all()
    for key in expected.keys(True, True):
        assert out[key].dtype == expected[key].dtype


@settings(max_examples=40, deadline=None)
@given(rollouts, st.sampled_from([True, torch.strided, torch.jagged]))
def test_nested_has_mask_and_matches_padded(batch: TensorDict, layout) -> None:
    padded = split_trajectories(batch)
    nested = split_trajectories(batch, as_nested=layout)
    assert nested[MASK].is_nested
    assert nested.batch_size[0] == padded.batch_size[0]
    for key in padded.keys(True, True):
        rows = nested[key].unbind(0)
        lengths = padded[MASK].sum(1).tolist()
        assert [r.shape[0] for r in rows] == lengths
        for row, (values, n) in enumerate(zip(rows, lengths, strict=True)):
            assert (values == padded[key][row, :n]).all()
    # Nested back to cat equals padded back to cat.
    assert (cat_trajectories(nested) == cat_trajectories(padded)).all()


def test_strided_nested_pads_like_padded() -> None:
    # TorchRL's equivalence test: nested.to_padded_tensor() == padded (ids aside: we pad -1).
    batch = synthetic_rollout(3, 30, 6.0, seed=3)
    padded = split_trajectories(batch)
    repadded = split_trajectories(batch, as_nested=True).to_padded_tensor(padding=0)
    assert repadded.batch_size == padded.batch_size
    assert (repadded.exclude(TRAJ_IDS) == padded.exclude(TRAJ_IDS)).all()
    assert (repadded[TRAJ_IDS] == padded[TRAJ_IDS].clamp_min(0)).all()


def test_non_adjacent_repeated_ids_are_grouped_in_time_order() -> None:
    # TorchRL crashes here (pytorch/rl#2588): split_with_sizes gets [4, 2, 4] for 6 steps.
    ids = torch.tensor([0, 0, 1, 1, 0, 0])
    td = TensorDict({TRAJ_IDS: ids, "obs": torch.arange(6)}, batch_size=[6])
    out = split_trajectories(td)
    assert out["obs"].tolist() == [[0, 1, 4, 5], [2, 3, 0, 0]]
    assert out[TRAJ_IDS].tolist() == [[0, 0, 0, 0], [1, 1, -1, -1]]
    assert out[MASK].tolist() == [[True] * 4, [True, True, False, False]]


def test_padding_id_is_minus_one_not_a_valid_id() -> None:
    # TorchRL pads ids with 0, which is a real id.
    td = TensorDict({TRAJ_IDS: torch.tensor([0, 1, 1])}, batch_size=[3])
    assert split_trajectories(td)[TRAJ_IDS].tolist() == [[0, -1], [1, 1]]


def test_padding_steps_in_the_input_are_dropped() -> None:
    td = TensorDict(
        {TRAJ_IDS: torch.tensor([[3, 3, -1], [4, 5, 5]]), "x": torch.arange(6).view(2, 3)},
        batch_size=[2, 3],
    )
    td[MASK] = torch.tensor([[True, True, False], [True, False, True]])
    out = split_trajectories(td)
    assert out["x"].tolist() == [[0, 1], [3, 0], [5, 0]]
    assert out[MASK].sum().item() == 4


def test_ids_from_done_when_no_ids() -> None:
    done = torch.tensor([[False, True, False, False], [True, False, False, True]])
    td = TensorDict({("next", "done"): done.unsqueeze(-1), "x": torch.arange(8).view(2, 4)}, [2, 4])
    out = split_trajectories(td)
    assert out["traj_ids"].tolist() == [[0, 0, -1], [1, 1, -1], [2, -1, -1], [3, 3, 3]]
    assert out["x"].tolist() == [[0, 1, 0], [2, 3, 0], [4, 0, 0], [5, 6, 7]]
    assert "mask" in out.keys()


def test_key_resolution_matches_torchrl() -> None:
    ids = torch.tensor([0, 0, 1])
    # trajectory_key: mask next to it
    td = TensorDict({("a", "b", "ids"): ids}, batch_size=[3])
    out = split_trajectories(td, trajectory_key=("a", "b", "ids"))
    assert ("a", "b", "mask") in out.keys(True)
    # no collector entry, no prefix: root "traj_ids"/"mask"
    td = TensorDict({"traj_ids": ids}, batch_size=[3])
    assert "mask" in split_trajectories(td).keys()
    # explicit prefix
    td = TensorDict({("p", "traj_ids"): ids}, batch_size=[3])
    assert ("p", "mask") in split_trajectories(td, prefix="p").keys(True)
    # custom done key under "next"
    td = TensorDict({("next", "end"): torch.tensor([[True], [False], [False]])}, [3])
    assert split_trajectories(td, done_key="end")["traj_ids"].tolist() == [[0, -1], [1, 1]]


def test_multi_dim_batch_is_flattened_env_major() -> None:
    batch = synthetic_rollout(6, 10, 4.0, seed=2).reshape(2, 3, 10)
    check_split(batch.reshape(6, 10), split_trajectories(batch))
    assert (split_trajectories(batch) == split_trajectories(batch.reshape(6, 10))).all()


def test_empty_batch() -> None:
    td = TensorDict({TRAJ_IDS: torch.zeros(0, dtype=torch.int64)}, batch_size=[0])
    out = split_trajectories(td)
    assert out.batch_size == torch.Size([0, 0])


@pytest.mark.parametrize(
    ("td", "match"),
    [
        (TensorDict({"x": torch.zeros(3)}, [3]), "no trajectory ids at .*'traj_ids'.* no done"),
        (TensorDict({TRAJ_IDS: torch.zeros(3)}, [3]), "integer dtype .* got dtype torch.float32"),
        (TensorDict({TRAJ_IDS: torch.zeros(3, dtype=torch.bool)}, [3]), "integer dtype"),
        (TensorDict({TRAJ_IDS: torch.zeros(3, dtype=torch.complex64)}, [3]), "integer dtype"),
        (TensorDict({TRAJ_IDS: torch.zeros(3, 1, dtype=torch.long)}, [3]), r"shape \[3\], got"),
        (TensorDict({DONE: torch.zeros(2, 1, dtype=torch.bool)}, [2]), None),
        (TensorDict({TRAJ_IDS: torch.tensor(1)}, []), "at least one"),
    ],
)
def test_bad_input_raises_a_clear_error(td: TensorDict, match: str | None) -> None:
    if match is None:  # done-derived ids are fine: a control case
        split_trajectories(td)
        return
    with pytest.raises(LayoutError, match=match):
        split_trajectories(td)


@pytest.mark.parametrize("fn", [split_trajectories, cat_trajectories])
def test_a_dict_is_refused_with_a_type_error(fn) -> None:
    """Issue 10, bug 5: a plain dict gave ``AttributeError: 'dict' object has no attribute
    'ndim'``; a public function names the wrong type instead."""
    with pytest.raises(TypeError, match="expects a TensorDict, got dict"):
        fn({"observation": torch.zeros(3), TRAJ_IDS: torch.zeros(3, dtype=torch.long)})


def test_int32_ids_are_read_as_int64_and_kept_in_the_output() -> None:
    ids = torch.tensor([[3, 3, 5], [4, 4, 4]], dtype=torch.int32)
    out = split_trajectories(TensorDict({TRAJ_IDS: ids}, [2, 3]))
    assert out[TRAJ_IDS].dtype == torch.int32
    assert out[TRAJ_IDS].tolist() == [[3, 3, -1], [5, -1, -1], [4, 4, 4]]


def test_bad_nested_argument() -> None:
    td = TensorDict({TRAJ_IDS: torch.tensor([0, 1])}, [2])
    with pytest.raises(ValueError, match="as_nested must be"):
        split_trajectories(td, as_nested=torch.sparse_coo)


def test_cat_rejects_input_without_a_valid_mask() -> None:
    td = TensorDict({TRAJ_IDS: torch.zeros(2, 3, dtype=torch.long)}, [2, 3])
    with pytest.raises(LayoutError, match="missing mask key"):
        cat_trajectories(td)
    td[MASK] = torch.ones(2, 3)
    with pytest.raises(LayoutError, match=r"expected dtype torch\.bool"):
        cat_trajectories(td)
    with pytest.raises(LayoutError, match=r"expects \[n_traj, max_len\]"):
        cat_trajectories(td[0])


def test_input_is_not_modified() -> None:
    batch = synthetic_rollout(2, 20, 5.0, seed=1)
    before = batch.clone()
    split_trajectories(batch)
    split_trajectories(batch.exclude(TRAJ_IDS))
    assert (batch == before).all()
    assert set(batch.keys(True, True)) == set(before.keys(True, True))


def test_cut_flag_survives_the_split() -> None:
    batch = synthetic_rollout(2, 20, 5.0, seed=2)  # both rows end in a cut
    out = split_trajectories(batch)
    # Cut fragments are exactly the rows whose last real step carries the cut flag.
    lengths = out[MASK].sum(1)
    last_cut = out[CUT][torch.arange(out.shape[0]), lengths - 1]
    assert int(last_cut.sum()) == int(batch[CUT].sum()) == 2


def test_non_tensor_entries_are_refused_by_name() -> None:
    td = TensorDict({TRAJ_IDS: torch.tensor([0, 0, 1])}, [3])
    td.set_non_tensor("note", "hello")
    with pytest.raises(LayoutError, match=r"key 'note' holds .*not a tensor"):
        split_trajectories(td)


# ------------------------------------------------------ batches without real steps (issue 11)
def _no_real_steps() -> dict[str, TensorDict]:
    """Batches with nothing to split: empty ``[0]``, empty ``[B, 0]`` (ids or done flags), and
    all padding."""
    obs = {"observation": torch.zeros(2, 3, 4)}
    return {
        "empty [0]": TensorDict({TRAJ_IDS: torch.zeros(0, dtype=torch.int64)}, [0]),
        "empty [B, 0]": TensorDict(
            {TRAJ_IDS: torch.zeros(2, 0, dtype=torch.int64), "observation": torch.zeros(2, 0, 4)},
            [2, 0],
        ),
        "empty [B, 0], done only": TensorDict(
            {DONE: torch.zeros(2, 0, 1, dtype=torch.bool), "observation": torch.zeros(2, 0, 4)},
            [2, 0],
        ),
        "all padding [2, 3]": TensorDict({TRAJ_IDS: torch.full((2, 3), -1), **obs}, [2, 3]),
        "all masked [2, 3]": TensorDict(
            {TRAJ_IDS: torch.zeros(2, 3, dtype=torch.int64), MASK: torch.zeros(2, 3).bool(), **obs},
            [2, 3],
        ),
    }


@pytest.mark.parametrize("case", list(_no_real_steps()))
def test_batch_without_real_steps_gives_an_empty_padded_and_jagged_output(case: str) -> None:
    batch = _no_real_steps()[case]
    padded = split_trajectories(batch)
    assert padded.batch_size == torch.Size([0, 0])
    mask_key = MASK if "collector" in batch.keys() else "mask"  # done only: top-level keys
    assert padded[mask_key].shape == (0, 0)
    if "observation" in batch.keys():
        assert padded["observation"].shape == (0, 0, 4)  # the per-step shape is kept
    jagged = split_trajectories(batch, as_nested=torch.jagged)
    assert jagged.batch_size == torch.Size([0])
    for out in (padded, jagged):  # and both round-trip to an empty flat batch
        assert cat_trajectories(out).batch_size == torch.Size([0])


_CRASH_SCRIPT = """
import sys, torch
from tensordict import TensorDict
from splice import split_trajectories
from splice.layout import TRAJ_IDS
batch = {
    "all padding": TensorDict({TRAJ_IDS: torch.full((2, 3), -1)}, [2, 3]),
    "empty": TensorDict({TRAJ_IDS: torch.zeros(0, dtype=torch.int64)}, [0]),
}[sys.argv[1]]
try:
    split_trajectories(batch, as_nested=True)
except ValueError as error:
    print("ValueError:", error)
"""


@pytest.mark.parametrize("case", ["all padding", "empty"])
def test_strided_nested_split_without_real_steps_is_a_clear_error_not_a_segfault(case) -> None:
    """``as_nested=True`` on an all-padding ``[2, 3]`` or an empty ``[0]`` batch segfaulted
    (torch cannot view a buffer as a zero-row strided nested tensor); run in a subprocess so a
    regression cannot kill the test run."""
    run = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT, case],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 0, f"exit {run.returncode} (-11 is SIGSEGV): {run.stderr[-2000:]}"
    assert "ValueError: split_trajectories(as_nested=True): the batch has no real steps" in (
        run.stdout
    )
    assert "torch.jagged" in run.stdout  # it says what to use instead


# ------------------------------------------------------------ ids below -1 (issue 11, item 8)
def test_ids_below_minus_one_are_refused_not_dropped_and_joined() -> None:
    """``[0, 0, 0, 0, -7, 0, 0]`` was split into one row ``[0, 1, 2, 3, 5, 6]``: the -7 step
    silently dropped and the steps around it joined. -1 is the only padding id."""
    batch = TensorDict(
        {TRAJ_IDS: torch.tensor([0, 0, 0, 0, -7, 0, 0]), "observation": torch.arange(7)}, [7]
    )
    with pytest.raises(LayoutError, match=r"traj_ids.*below -1, the first -7 at flat position 4"):
        split_trajectories(batch)
    with pytest.raises(LayoutError, match="below -1"):
        split_trajectories(batch.reshape(1, 7), as_nested=torch.jagged)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 4), min_size=1, max_size=30))
def test_split_refuses_exactly_the_batches_with_ids_below_minus_one(ids: list[int]) -> None:
    batch = TensorDict(
        {TRAJ_IDS: torch.tensor(ids), "observation": torch.arange(len(ids))}, [len(ids)]
    )
    if min(ids) < -1:
        with pytest.raises(LayoutError, match="below -1"):
            split_trajectories(batch)
        return
    out = split_trajectories(batch)
    # Every real step exactly once, each row one id, in time order.
    real = [i for i, x in enumerate(ids) if x >= 0]
    assert sorted(out["observation"][out[MASK]].tolist()) == real
    for row in out.unbind(0):
        steps = row["observation"][row[MASK]].tolist()
        assert steps == sorted(steps)
        assert {ids[s] for s in steps} == {int(row[TRAJ_IDS][0])}
