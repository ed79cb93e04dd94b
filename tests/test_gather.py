"""``take_rows`` equals ``index_select`` for every dtype, and keeps autograd working."""

from __future__ import annotations

import pytest
import torch

from splice._gather import take_rows

DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("shape", [(7,), (7, 1), (7, 3, 2)])
def test_take_rows_matches_index_select(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = (torch.arange(torch.Size(shape).numel()) % 5).reshape(shape).to(dtype)
    rows = torch.tensor([6, 0, 0, 3, 5])
    out = take_rows(x, rows)
    assert out.dtype == dtype
    assert out.is_contiguous()
    assert torch.equal(out, x.index_select(0, rows))
    out.zero_()  # a copy, never a view of the source
    assert torch.equal(x, (torch.arange(torch.Size(shape).numel()) % 5).reshape(shape).to(dtype))


def test_take_rows_non_contiguous_source() -> None:
    x = torch.arange(24).reshape(4, 6)[:, ::2]
    rows = torch.tensor([3, 1])
    assert torch.equal(take_rows(x, rows), x.index_select(0, rows))


def test_take_rows_keeps_gradients() -> None:
    x = torch.ones(4, 2, requires_grad=True)
    take_rows(x, torch.tensor([1, 1, 3])).sum().backward()
    assert x.grad is not None
    assert x.grad[:, 0].tolist() == [0.0, 2.0, 0.0, 1.0]
