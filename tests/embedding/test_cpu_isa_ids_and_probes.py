"""Per-ISA variants (csrc/cpu_isa.h) of the CPU kernels beside the embedding's: every
variant this machine runs, against a plain-torch reference.

- bucketization of ids into row-range shards (the input distribution's) and the ids' range
  check equal the reference, bad ids included;
- the gather probe (tools/bench_gather_probe.py) reads exactly the rows it is given, its
  latency chain (chase_probe, not per variant) follows the rows' links, and the
  dot interaction's traffic probe (tools/bench_interaction.py --bounds) reads every input and
  writes every output.

(Variant selection and portability: test_cpu_isa_selection.py; the embedding kernels per
variant: test_cpu_isa.py.)
"""

from __future__ import annotations

import pytest
import torch

import neo._C as C  # a missing build must fail here, not skip
from neo.cpp import use_cpu_isa

VARIANTS = C.cpu_isa_supported()


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_bucketize_matches_the_reference(isa, dtype):
    from neo.distributed.input_dist import bucketize_rows, bucketize_rows_reference

    g = torch.Generator().manual_seed(1)
    lens = torch.randint(0, 9, (200,), generator=g)
    off = torch.zeros(201, dtype=torch.int64)
    torch.cumsum(lens, 0, out=off[1:])
    ids = torch.randint(-2, 1000, (int(off[-1]),), generator=g).to(dtype)
    for bounds in ([0, 1000], [0, 333, 1000], [0] + list(range(10, 1000, 50)) + [1000]):   # 1, 2, 21 shards
        with use_cpu_isa(isa):
            got = bucketize_rows(ids, off, bounds, None)
        for (gl, gi, _), (rl, ri, _) in zip(got, bucketize_rows_reference(ids, off, bounds, None)):
            assert torch.equal(gl, rl) and torch.equal(gi, ri)


def _ids_with_bad_ones(g: torch.Generator, F: int, B: int, rows: list, dtype: torch.dtype):
    """A feature-major batch of F features x B bags (some empty, one feature with no ids at all)
    whose ids are mostly in range, with negatives, ids at the table's size, and (int64) ids past
    2^31 mixed in: about 2-3.5% drawn at random, and one of each kind planted in feature 0 (so that
    a batch of one sample, whose few ids may draw none, still has every kind)."""
    lens = torch.randint(0, 40, (F * B,), generator=g)
    lens[0] = max(int(lens[0]), 4)                                          # room for the planted ones
    lens[B:2 * B] = 0                                                       # feature 1: no ids
    off = torch.zeros(F * B + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=off[1:])
    n = int(off[-1])
    limit = torch.repeat_interleave(torch.tensor(rows), lens.view(F, B).sum(1))
    ids = (torch.rand(n, generator=g) * limit).to(torch.int64)
    pick = torch.rand(n, generator=g)
    ids[pick < 0.01] = -1 - torch.randint(0, 5, (int((pick < 0.01).sum()),), generator=g)
    ids[(pick >= 0.01) & (pick < 0.02)] = limit[(pick >= 0.01) & (pick < 0.02)]
    if dtype == torch.int64:
        ids[(pick >= 0.02) & (pick < 0.03)] = 2 ** 31 + 7
        ids[(pick >= 0.03) & (pick < 0.035)] = -(2 ** 40)
    ids[0], ids[1] = -1, rows[0]                                            # feature 0's first bag
    if dtype == torch.int64:
        ids[2], ids[3] = 2 ** 31 + 7, -(2 ** 40)
    return ids.to(dtype), off


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_id_check_matches_the_reference(isa, dtype, threads):
    """The range check of the input distribution and the lookups (``neo._C.check_id_ranges``
    through ``count_bad_ids`` / ``count_bad_ids_to_int32``) counts per feature what the torch
    reference counts, and narrows the ids to int32 as ``clamp(-1, 2^31 - 1)`` does; on batches
    large enough to be cut into chunks across threads (one chunk of 64k ids a thread)."""
    from neo.embedding.checks import count_bad_ids, count_bad_ids_reference, count_bad_ids_to_int32

    g = torch.Generator().manual_seed(3)
    rows = [1000, 7, 250_000, 1, 60_000]
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for B in (1, 64, 3000):                                              # 3000: ~300k ids
            ids, off = _ids_with_bad_ones(g, len(rows), B, rows, dtype)
            r = torch.tensor(rows)
            expected = count_bad_ids_reference(ids.to(torch.int64), off, B, r)
            assert int(expected.sum()) > 0 and int(expected[1]) == 0
            with use_cpu_isa(isa):
                got = count_bad_ids(ids, off, B, r)
                got2, narrowed = count_bad_ids_to_int32(ids, off, B, r)
            assert torch.equal(got, expected) and torch.equal(got2, expected)
            assert narrowed.dtype == torch.int32
            assert torch.equal(narrowed, ids.to(torch.int64).clamp(-1, 2 ** 31 - 1).to(torch.int32))
    finally:
        torch.set_num_threads(prev)


def test_id_check_refuses_inconsistent_arguments():
    """Starts that do not cover the ids, or that decrease, are refused with the argument named
    (never a read past the ids)."""
    ids = torch.arange(10)
    rows = torch.tensor([5, 5])
    with pytest.raises(RuntimeError, match="starts run from 0 to 9, values holds 10"):
        C.check_id_ranges(ids, torch.tensor([0, 4, 9]), rows)
    with pytest.raises(RuntimeError, match="starts decrease at feature 1"):
        C.check_id_ranges(ids, torch.tensor([0, 11, 10]), rows)
    with pytest.raises(RuntimeError, match="F \\+ 1 = 3 entries"):
        C.check_id_ranges(ids, torch.tensor([0, 10]), rows)
    with pytest.raises(RuntimeError, match="int32/int64"):
        C.check_id_ranges(ids.float(), torch.tensor([0, 4, 10]), rows)


@pytest.mark.parametrize("isa", VARIANTS)
def test_gather_probe_reads_the_rows_it_is_given(isa):
    """The probe's checksum is the sum, per vector lane, of the 32-bit words of the rows read
    (wrapping at 2^32): recomputed here for the variant's lane count, on one thread."""
    lanes = {"baseline": 4, "avx2": 8, "avx512": 16}[isa]
    g = torch.Generator().manual_seed(2)
    table = torch.randint(-(2 ** 31), 2 ** 31 - 1, (500, 64), dtype=torch.int32, generator=g)   # rows of 256 B
    ids = torch.randint(0, 500, (3000,), generator=g)
    words = table[ids].view(-1, lanes).to(torch.int64) & 0xFFFFFFFF
    expected = int(((words.sum(0) & 0xFFFFFFFF)).sum())
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with use_cpu_isa(isa):
            for near, far in ((0, 0), (16, 0), (16, 128)):
                assert C.gather_probe(table, 256, ids, near, far) == expected
            for hint, every in ((0, 1), (2, 1), (1, 2), (1, 3)):   # the far prefetch's variants (--wide)
                assert C.gather_probe(table, 256, ids, 16, 128, hint, every) == expected
    finally:
        torch.set_num_threads(prev)
    with pytest.raises(RuntimeError, match="ids must lie in"):
        C.gather_probe(table, 256, torch.tensor([500]), 0, 0)
    bad = ids.clone()
    bad[[7, 1500, 2999]] = torch.tensor([-1, 500, 2 ** 40])   # counted in the gather's loop, their rows not read
    for near, far in ((0, 0), (16, 128)):
        with pytest.raises(RuntimeError, match=r"ids must lie in \[0, 500\): 3 of 3000 do not"):
            C.gather_probe(table, 256, bad, near, far)
    with pytest.raises(RuntimeError, match="far_hint must be 0, 1 or 2"):
        C.gather_probe(table, 256, ids, 16, 128, 3, 1)
    with pytest.raises(RuntimeError, match="far_every must be >= 1"):
        C.gather_probe(table, 256, ids, 16, 128, 1, 0)


def test_chase_probe_follows_the_links_it_is_given():
    """neo._C.chase_probe (the memory latency) ends where following each row's first 8 bytes
    as the next row's index ends, step by step in Python; a link out of the table is an error
    naming the step."""
    g = torch.Generator().manual_seed(4)
    rows, row_bytes = 300, 128
    table = torch.randint(0, 2 ** 31, (rows, row_bytes // 8), dtype=torch.int64, generator=g)
    table[:, 0] = torch.randint(0, rows, (rows,), generator=g)     # any links, cycles and all
    for start, steps in ((0, 0), (5, 1), (17, 7), (299, 1000)):
        row = start
        for _ in range(steps):
            row = int(table[row, 0])
        assert C.chase_probe(table, row_bytes, start, steps) == row
    table[:, 0] = torch.arange(1, rows + 1)                          # row r links to r + 1: the last row out
    assert C.chase_probe(table, row_bytes, 290, 9) == 299
    with pytest.raises(RuntimeError, match=r"step 9 reads row 299, whose next row lies outside \[0, 300\)"):
        C.chase_probe(table, row_bytes, 290, 10)
    with pytest.raises(RuntimeError, match="start must lie in"):
        C.chase_probe(table, row_bytes, 300, 1)
    with pytest.raises(RuntimeError, match="row_bytes must be a positive multiple of 8"):
        C.chase_probe(table, 12, 0, 1)


def _traffic_sums(spans, lanes):
    """The traffic probe's per-lane sum over spans (B, m_i) (kernels/probe.h traffic_sum): each
    span's whole vectors lane by lane, plus the sum of its tail in every lane. Exact here:
    the values are small integers."""
    acc = 0
    for x in spans:
        full = x.shape[1] // lanes * lanes
        acc = acc + x[:, :full].reshape(x.shape[0], -1, lanes).sum(1) + x[:, full:].sum(1, keepdim=True)
    return acc                                                                      # (B, lanes)


def _traffic_fill(acc, m, lanes):
    """What traffic_fill writes into m floats: the lanes repeated over the whole vectors, zeros after."""
    full = m // lanes * lanes
    return torch.cat([acc.repeat(1, full // lanes), acc.new_zeros(acc.shape[0], m - full)], dim=1)


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("F, D, B", [(5, 13, 70), (26, 64, 700)])   # tails; the streaming stores (>= 4 MiB)
def test_interaction_traffic_probe_reads_every_input_and_writes_every_output(isa, F, D, B):
    """neo._C.interaction_traffic_forward / _backward (tools/bench_interaction.py --bounds) read
    all the bytes the fused kernels read and write every element they write: their outputs
    are sums over every input element, recomputed here lane by lane."""
    lanes = {"baseline": 4, "avx2": 8, "avx512": 16}[isa]
    g = torch.Generator().manual_seed(3)
    n = F + 1
    W = D + n * (n - 1) // 2
    dense, pooled, grad = (torch.randint(-8, 8, shape, generator=g).float() for shape in ((B, D), (B, F * D), (B, W)))
    with use_cpu_isa(isa):
        out = C.interaction_traffic_forward(dense, pooled, F)
        gd, gp = C.interaction_traffic_backward(grad, dense, pooled, F)
    assert torch.equal(out, _traffic_fill(_traffic_sums([dense, pooled], lanes), W, lanes))
    acc = _traffic_sums([grad, dense, pooled], lanes)
    assert torch.equal(gd, _traffic_fill(acc, D, lanes))
    assert torch.equal(gp, _traffic_fill(acc, F * D, lanes))
