"""Row-range bucketization of the input distribution: neo._C against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

from neo import _C
from neo.cpp import use_cpu_isa
from neo.distributed import input_dist
from neo.distributed.input_dist import bucketize_rows, bucketize_rows_reference


def _batch(seed: int, B: int, rows: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 12, (B,), generator=g)
    lens[::7] = 0                                                    # empty bags
    off = torch.zeros(B + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=off[1:])
    ids = torch.randint(-3, rows + 3, (int(off[-1]),), generator=g).to(dtype)   # a few outside every shard
    return ids, off, torch.rand(ids.numel(), generator=g)


@pytest.mark.parametrize("isa", _C.cpu_isa_supported())   # every ISA variant of the kernel this machine runs
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bounds", [[0, 50], [0, 17, 50], [0, 10, 11, 30, 50], list(range(0, 51, 2)), [5, 20]])
def test_bucketize_matches_reference(dtype, bounds, isa):
    assert input_dist._C is not None, "neo._C is not built: the kernel under test is missing"
    ids, off, w = _batch(len(bounds), 64, 50, dtype)
    for weights in (None, w):
        with use_cpu_isa(isa):
            got = bucketize_rows(ids, off, bounds, weights)
        ref = bucketize_rows_reference(ids, off, bounds, weights)
        assert len(got) == len(ref) == len(bounds) - 1
        for (gl, gi, gw), (rl, ri, rw) in zip(got, ref):
            assert torch.equal(gl, rl) and torch.equal(gi, ri) and gi.dtype == dtype
            assert (gw is None and rw is None) or torch.equal(gw, rw)


def test_bucketize_keeps_order_and_rebases():
    ids = torch.tensor([7, 1, 5, 9, 0, 6], dtype=torch.int64)
    off = torch.tensor([0, 3, 3, 6])                                 # bags [7, 1, 5], [], [9, 0, 6]
    (l0, i0, _), (l1, i1, _) = bucketize_rows(ids, off, [0, 5, 10])
    assert l0.tolist() == [1, 0, 1] and i0.tolist() == [1, 0]
    assert l1.tolist() == [2, 0, 2] and i1.tolist() == [2, 0, 4, 1]


def test_bucketize_rejects_inconsistent_offsets():
    with pytest.raises(RuntimeError, match="bag_offsets span 5 ids, values holds 4"):
        input_dist._C.bucketize_rows(torch.zeros(4, dtype=torch.int64), torch.tensor([0, 5]), torch.tensor([0, 9]))
    with pytest.raises(RuntimeError, match="bounds must increase"):
        input_dist._C.bucketize_rows(torch.zeros(4, dtype=torch.int64), torch.tensor([0, 4]), torch.tensor([0, 9, 9]))
