"""copy_into: a graph's static inputs filled by one multi-tensor copy per dtype pair, with
the values dst.copy_(src) would give, views (a prefix of a larger buffer) included."""

from __future__ import annotations

import pytest
import torch

from gearshift.runner.graphs import copy_into


def test_copies_every_pair_across_dtypes_and_into_views():
    big = torch.zeros(16, dtype=torch.int64)
    dsts = [big[:5], torch.zeros(3, dtype=torch.int32), torch.zeros(2, 4),
            torch.zeros(7, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)]
    srcs = [torch.arange(5), torch.tensor([7, 8, 9], dtype=torch.int32), torch.randn(2, 4),
            torch.arange(7) * 3, torch.tensor([1, 2, 3], dtype=torch.int32)]  # int32 -> int64
    copy_into(dsts, srcs)
    for d, s in zip(dsts, srcs):
        assert d.dtype != s.dtype or torch.equal(d, s)
        assert torch.equal(d, s.to(d.dtype))
    assert big[5:].eq(0).all()  # only the view was written


def test_pairs_must_match():
    with pytest.raises(ValueError):
        copy_into([torch.zeros(2)], [])
