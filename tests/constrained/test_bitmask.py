"""Bitmask allocation and row helpers."""

from __future__ import annotations

import pytest
import torch

from constrained import allocate_bitmask, allow_only, allowed_token_ids, bitmask_width, fill_all_ones
from constrained.bitmask import check_bitmask


def test_allocate_shape_dtype_all_allowed():
    bitmask = allocate_bitmask(3, 49152 + 5)
    assert bitmask.shape == (3, 1537) and bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
    assert bitmask.is_pinned() == torch.cuda.is_available()
    assert allowed_token_ids(bitmask, 2, 49157) == list(range(49157))
    assert [bitmask_width(v) for v in (1, 32, 33, 64)] == [1, 1, 2, 2]


def test_allow_only_handles_sign_bit_and_fill_all_ones():
    bitmask = allocate_bitmask(2, 70)
    allow_only(bitmask, 1, [0, 31, 32, 63, 69])
    assert allowed_token_ids(bitmask, 1, 70) == [0, 31, 32, 63, 69]
    assert allowed_token_ids(bitmask, 0, 70) == list(range(70))
    allow_only(bitmask, 0, [])
    assert allowed_token_ids(bitmask, 0, 70) == []
    fill_all_ones(bitmask, [1])
    assert allowed_token_ids(bitmask, 1, 70) == list(range(70)) and allowed_token_ids(bitmask, 0, 70) == []
    fill_all_ones(bitmask)
    assert int((bitmask == -1).sum()) == bitmask.numel()


def test_check_bitmask():
    check_bitmask(allocate_bitmask(2, 64), 1, 64)
    for bitmask, row in [(allocate_bitmask(2, 64), 2), (allocate_bitmask(2, 65), 0),
                         (torch.zeros(2, 2, dtype=torch.int64), 0), (torch.zeros(1, 4, dtype=torch.int32)[:, ::2], 0)]:
        with pytest.raises(ValueError):
            check_bitmask(bitmask, row, 64)
