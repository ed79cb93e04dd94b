"""The two grouping paths (CPU runs scan, accelerator sort) agree on any ids."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splice.trajectories._index import _group_by_runs, _group_by_sort, index_by_id, index_by_row

id_lists = st.lists(st.integers(0, 6), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(id_lists)
def test_runs_and_sort_paths_agree(ids: list[int]) -> None:
    keys = torch.tensor(ids)
    rank_runs, pos_runs = _group_by_runs(keys)
    rank_sort, pos_sort = _group_by_sort(keys)
    assert rank_runs.tolist() == rank_sort.tolist()
    assert pos_runs.tolist() == pos_sort.tolist()


@settings(max_examples=200, deadline=None)
@given(id_lists)
def test_index_matches_a_python_reference(ids: list[int]) -> None:
    order: dict[int, int] = {}
    seen: dict[int, int] = {}
    rows, pos = [], []
    for i in ids:
        order.setdefault(i, len(order))
        rows.append(order[i])
        pos.append(seen.get(i, 0))
        seen[i] = seen.get(i, 0) + 1
    ix = index_by_id(torch.tensor(ids))
    assert ix.row.tolist() == rows and ix.pos.tolist() == pos
    assert ix.lengths.tolist() == [seen[i] for i in order]
    assert ix.max_len == max(seen.values())
    assert ix.cat_is_identity() == (rows == sorted(rows))
    cat = [ids[j] for j in ix.cat_order().tolist()]
    assert cat == sorted(ids, key=lambda i: order[i])
    by_row = index_by_row(ix.row, ix.n_rows)
    assert by_row.pos.tolist() == pos and by_row.lengths.tolist() == ix.lengths.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-5, 40), max_size=50),
    st.lists(st.integers(-5, 40), max_size=10, unique=True),
    st.sampled_from([0, 1 << 40]),
)
def test_rank_in_matches_a_python_reference(values, test, offset) -> None:
    from splice.trajectories.assembler import _rank_in

    got = _rank_in(torch.tensor(values, dtype=torch.int64) + offset, torch.tensor(test) + offset)
    assert got.tolist() == [test.index(v) if v in test else -1 for v in values]
    # Ids far apart take the sort-based path.
    spread = torch.tensor(values, dtype=torch.int64) * (1 << 30)
    got = _rank_in(spread, torch.tensor(test, dtype=torch.int64) * (1 << 30))
    assert got.tolist() == [test.index(v) if v in test else -1 for v in values]
