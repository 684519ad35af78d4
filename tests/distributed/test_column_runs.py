"""neo._C.column_runs (csrc/column_runs.cpp) against the torch copies (reference_runs) and a
plain element-by-element oracle: copies, scaled copies, adds in run order, strided rows,
several sources and targets, and bad runs or matrices refused naming them; and the partial sums
of the other paths added in the same rank order (comms.sum_in_rank_order)."""

import pytest
import torch

from neo.cpp import cpu_kernels
from neo.distributed.assemble import ColumnRuns, reference_runs

C = cpu_kernels("column_runs")
pytestmark = pytest.mark.skipif(C is None, reason="neo._C is not built")  # the build is part of setup


def _oracle(srcs, dsts, runs, scale):
    """Element by element in float64 bookkeeping of the fp32 result (run order, row by row)."""
    out = [d.clone() for d in dsts]
    for b in range(srcs[0].shape[0]):
        for si, sc, di, dc, n, add in runs:
            for j in range(n):
                v = srcs[si][b, sc + j]
                out[di][b, dc + j] = (out[di][b, dc + j] + v) if add else (v if scale == 1.0 else v * scale)
    return out


def _case(seed):
    g = torch.Generator().manual_seed(seed)
    B = 37
    big = torch.randn(B, 50, generator=g)
    srcs = [torch.randn(B, 24, generator=g), big[:, 5:40],                    # a view: row stride 50
            torch.randn(2 * B, 8, generator=g)[B:]]
    dsts = [torch.full((B, 30), float("nan")), torch.zeros(B, 70)[:, 3:60]]
    runs = [(0, 0, 0, 0, 7, 0), (1, 10, 0, 7, 9, 0), (2, 0, 0, 16, 8, 0),
            (0, 7, 0, 24, 6, 0), (1, 0, 0, 24, 6, 1), (2, 2, 0, 24, 6, 1),    # ((a + b) + c)
            (0, 13, 1, 0, 11, 0), (1, 20, 1, 40, 15, 0), (0, 23, 0, 29, 1, 0), (0, 0, 1, 11, 0, 0)]
    return srcs, dsts, runs


@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_the_kernel_equals_the_torch_copies_and_the_oracle_bit_for_bit(scale):
    runs_add = _case(0)[2]
    runs = runs_add if scale == 1.0 else [r for r in runs_add if not r[5]]   # scaled: copies only (as Assemble)
    srcs, dsts_k, _ = _case(0)
    _, dsts_r, _ = _case(0)
    _, dsts_o, _ = _case(0)
    want = _oracle(srcs, dsts_o, runs, scale)
    C.column_runs(srcs, dsts_k, torch.tensor(runs, dtype=torch.int64), scale)
    reference_runs(srcs, dsts_r, runs, scale)
    for k, r, w in zip(dsts_k, dsts_r, want):
        assert torch.equal(k.isnan(), w.isnan())                     # untouched columns stay as they were
        assert torch.equal(k.nan_to_num(7.0), w.nan_to_num(7.0))
        assert torch.equal(r.nan_to_num(7.0), w.nan_to_num(7.0))


def test_column_runs_dispatch_takes_the_kernel_or_the_torch_copies():
    srcs, dsts, runs = _case(1)
    ColumnRuns(runs)(srcs, dsts)                                     # fp32 CPU: the kernel
    _, ref, _ = _case(1)
    reference_runs(srcs, ref, runs)
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(dsts, ref))
    d64 = [d.double() for d in _case(1)[1]]                           # not fp32: the torch copies
    ColumnRuns(runs)([s.double() for s in srcs], d64)
    for a, b in zip(d64, ref):                                        # the adds in float64: close, not equal
        torch.testing.assert_close(a, b.double(), rtol=1e-6, atol=1e-6, equal_nan=True)
    t = torch.randn(37, 24).t().contiguous().t()                      # column stride 37: the torch copies
    out = torch.zeros(37, 30)
    ColumnRuns([(0, 2, 0, 5, 4, 0)])([t], [out])
    assert torch.equal(out[:, 5:9], t[:, 2:6]) and not out[:, :5].any()


@pytest.mark.parametrize("runs, srcs, dsts, message", [
    ([(0, 20, 0, 0, 5, 0)], None, None, "run 0 reaches past its matrices' columns"),
    ([(0, 0, 0, 0, 1, 0), (0, 0, 0, 28, 3, 0)], None, None, "run 1 reaches past its matrices' columns"),
    ([(3, 0, 0, 0, 1, 0)], None, None, "run 0 names a source or target that does not exist"),
    ([(0, 0, 2, 0, 1, 0)], None, None, "run 0 names a source or target that does not exist"),
    ([(0, 0, 0, 0, 1, 2)], None, None, "run 0 must copy (0) or add (1)"),
    ([(0, 0, 0, 0, 1, 0)], [torch.zeros(37, 24), torch.zeros(36, 24)], None, "source 1 has 36 rows, the first source 37"),
    ([(0, 0, 0, 0, 1, 0)], None, [torch.zeros(37, 30, dtype=torch.float64)], "target 0 must be a 2-D fp32 CPU tensor"),
    ([(0, 0, 0, 0, 1, 0)], None, [torch.zeros(30, 37).t()], "target 0 must have unit column stride"),
])
def test_bad_runs_and_matrices_are_refused_naming_them(runs, srcs, dsts, message):
    s, d, _ = _case(2)
    srcs = srcs or s
    dsts = dsts or d
    before = [t.clone() for t in dsts]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        C.column_runs(srcs, dsts, torch.tensor(runs, dtype=torch.int64), 1.0)
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(dsts, before))   # nothing written


@pytest.mark.parametrize("W", [1, 2, 3, 5, 8])
def test_partial_sums_add_up_in_rank_order(W):
    """comms.sum_in_rank_order (the row-wise sums of the per-type path, the shared-memory gradient
    AllReduce) against a left fold in numpy's float32: ((p0 + p1) + p2) ..., bit for bit, at world
    sizes where torch's own sum(0) would reorder (W >= 5 on small tensors)."""
    import numpy as np

    from neo.distributed.comms import sum_in_rank_order

    g = torch.Generator().manual_seed(W)
    parts = torch.randn(W, 3, 7, generator=g) * torch.logspace(-4, 4, 7)
    want = parts[0].numpy().copy()
    for q in range(1, W):
        want = np.add(want, parts[q].numpy(), dtype=np.float32)
    got = sum_in_rank_order(parts)
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))
    assert torch.equal(sum_in_rank_order(parts.to(torch.bfloat16)),
                       sum_in_rank_order(parts.to(torch.bfloat16).float()))     # the 16-bit wire: summed in fp32
