"""A cached table's row moves in C++ (``neo._C.cache_swap_rows``) and a batch's distinct rows
(``neo._C.unique_rows``) against their torch references.

Two :class:`TableCache` objects, one with ``kernel="auto"`` (the moves in C++ on the CPU) and one
with ``kernel="reference"`` (torch indexing), over stores holding the same rows, take the same
batches; between admissions each "trains" its batch's slots the same way (the rows written in
place, as the fused backward does). After every admission the slots, the stores, the dirty flags
and the counters must be the same, bit for bit: a victim not written back, a row read into the
wrong slot or a dirty flag wrong shows up in the store or the slots at once or later.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neo.config.embedding import TableConfig
from neo.cpp import cpu_kernels
from neo.embedding.cache import MmapStore
from neo.embedding.cache.prefetch import distinct_rows
from neo.embedding.cache.store import HostStore
from neo.embedding.cache.table_cache import TableCache
from neo.embedding.init import TableRegion

pytestmark = pytest.mark.skipif(cpu_kernels("cache_swap_rows") is None, reason="neo._C is not built")


def _pair(N: int, C: int, D: int, dtype: torch.dtype, rowwise: list, policy: str, store_dir=None):
    """Two caches of one table over stores initialized alike; the slots are strided views (rows of
    D inside rows of D + 3), as the slots of a group's buffer can be."""
    cfg = TableConfig("t", N, D, feature_names=("f",), placement="cached", cache_rows=C, cache_policy=policy)
    out = []
    for kernel in ("auto", "reference"):
        if store_dir is None:
            store = HostStore("t", N, D, dtype, rowwise)
        else:
            store = MmapStore("t", N, D, dtype, rowwise, str(store_dir))
        store.initialize(TableRegion.whole("t", N, D), 7, 0.5, [0.25] * len(rowwise))
        weights = torch.zeros(C, D + 3, dtype=dtype)[:, :D]
        states = [torch.zeros(C) if rw else torch.zeros(C, D + 1)[:, :D] for rw in rowwise]
        out.append(TableCache(cfg, weights, states, store, kernel=kernel))
    assert out[0].cpp and not out[1].cpp
    return out


def _same(a: TableCache, b: TableCache) -> None:
    for x, y in zip([a.weights, a.store.weights] + a.states + a.store.states,
                    [b.weights, b.store.weights] + b.states + b.store.states):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float16 else x,
                           y.view(torch.uint8) if y.dtype == torch.float16 else y)
    assert torch.equal(a.dirty, b.dirty)
    assert vars(a.stats) == {**vars(b.stats), "prefetch_s": a.stats.prefetch_s}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), policy=st.sampled_from(["lru", "lfu", "lookahead"]),
       dtype=st.sampled_from([torch.float32, torch.float16]),
       rowwise=st.sampled_from([[], [True], [False], [True, False]]), lag=st.integers(0, 2))
def test_cpp_moves_equal_the_reference(seed, policy, dtype, rowwise, lag):
    N, C, D = 300, 40, 4
    caches = _pair(N, C, D, dtype, rowwise, policy)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.unique(torch.randint(0, N if i % 3 else 60, (int(torch.randint(4, 14, (1,), generator=g)),),
                                          generator=g)) for i in range(30)]
    flying = []
    for i, rows in enumerate(batches):
        train = i % 4 != 3                                    # some batches are evaluation batches
        future = batches[i + 1:i + 4]
        results = [c.prefetch(rows, future, train=train) for c in caches]
        assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])
        slots = results[0][1]
        if train:                                             # the step updates its rows in place
            step = torch.randn(slots.numel(), D, generator=g)
            for c in caches:
                c.weights[slots] += step.to(dtype)
                for s in c.states:
                    s[slots] += 1.0
        _same(*caches)
        flying.append(results[0][0])
        while len(flying) > lag:
            seq = flying.pop(0)
            for c in caches:
                c.complete(seq)
    flushed = [c.flush() for c in caches]
    assert flushed[0] == flushed[1]
    _same(*caches)


def test_cpp_moves_write_back_into_a_mapped_file(tmp_path):
    """The same through an mmap store (rows in a file): every row the reference writes back and
    reads again is the C++ path's too, and flushing leaves both files alike."""
    caches = _pair(500, 30, 8, torch.float32, [True], "lookahead", store_dir=tmp_path)
    g = torch.Generator().manual_seed(3)
    for i in range(25):
        rows = torch.unique(torch.randint(0, 500, (20,), generator=g))
        seq, slots = caches[0].prefetch(rows)
        assert torch.equal(slots, caches[1].prefetch(rows)[1])
        for c in caches:
            c.weights[slots] *= 1.5
            c.complete(seq)
        _same(*caches)
    assert caches[0].flush() == caches[1].flush() > 0
    _same(*caches)


def test_cpp_moves_check_everything_before_the_first_copy():
    from neo import _C

    slots, store = torch.zeros(4, 3), torch.arange(30, dtype=torch.float32).view(10, 3)
    dirty = torch.ones(4, dtype=torch.bool)
    i = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    with pytest.raises(RuntimeError, match=r"fill_rows\[1\] = 10 is outside \[0, 10\)"):
        _C.cache_swap_rows([slots], [store], dirty, i(0), i(2), i(0, 1), i(5, 10))
    with pytest.raises(RuntimeError, match=r"evicted_slots\[0\] = 4 is outside \[0, 4\)"):
        _C.cache_swap_rows([slots], [store], dirty, i(4), i(2), i(0), i(5))
    with pytest.raises(RuntimeError, match=r"pair 0: the cache's rows \(Double, 24 bytes\)"):
        _C.cache_swap_rows([slots.double()], [store], dirty, i(0), i(2), i(0), i(5))
    with pytest.raises(RuntimeError, match="rows of store_bufs\\[0\\] must be contiguous"):
        _C.cache_swap_rows([slots], [store.t().contiguous().t()], dirty, i(0), i(2), i(0), i(5))
    assert bool(dirty.all()) and not slots.any() and torch.equal(store.flatten(), torch.arange(30.0))
    # one victim (slot 0, dirty) goes to row 2, row 5 comes into slot 0, slot 1 marked dirty
    slots[0] = 7.0
    dirty[:] = torch.tensor([True, False, False, False])
    assert _C.cache_swap_rows([slots], [store], dirty, i(0), i(2), i(0), i(5), i(1)) == 1
    assert store[2].tolist() == [7.0] * 3 and slots[0].tolist() == [15.0, 16.0, 17.0]
    assert dirty.tolist() == [False, True, False, False]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 2, 7, 300, 5000]),
       num_rows=st.sampled_from([1, 3, 100, 2_000_000, 1 << 32]), bad=st.sampled_from([0.0, 0.1, 1.0]))
def test_distinct_rows_equal_torch_unique(seed, n, num_rows, bad):
    """Sorted distinct valid ids and each id's position among them (-1: outside the table), as
    torch.unique over the valid ids gives them; with repeats, ids out of range on both sides, and
    tables of 1 row to 2^32 (every digit width of the radix sort)."""
    g = torch.Generator().manual_seed(seed)
    hot = torch.randint(0, min(num_rows, 50), (n,), generator=g)
    wide = (torch.rand(n, generator=g, dtype=torch.float64) * num_rows).long()
    ids = torch.where(torch.rand(n, generator=g) < 0.5, hot, wide)
    out = torch.rand(n, generator=g) < bad
    ids = torch.where(out, torch.where(torch.rand(n, generator=g) < 0.5, -1 - ids, ids + num_rows), ids)
    assert cpu_kernels("unique_rows") is not None                   # the C++ path is the one tested
    rows, where = distinct_rows(ids, num_rows)
    ref_rows, ref_where = distinct_rows(ids, num_rows, kernel="reference")
    assert rows.dtype == where.dtype == torch.int64
    assert torch.equal(rows, ref_rows) and torch.equal(where, ref_where)
    valid = (ids >= 0) & (ids < num_rows)
    assert torch.equal(rows[where[valid]], ids[valid]) and bool((where[~valid] == -1).all())
    if num_rows < 1 << 30:                                          # int32 ids give the same
        rows32, where32 = distinct_rows(ids.int(), num_rows)
        assert torch.equal(rows32, rows) and torch.equal(where32, where)
