"""The cache index's admissions in C++ (``neo._C.cache_admit``, ``cache_victims``) against the torch reference.

Two indexes, one with ``kernel="auto"`` (C++ on the CPU) and one with
``kernel="reference"`` (torch operations), take the same admissions: every admission and the
index state after it must be the same, slot for slot. Small caches, batches that overlap, lru
keys tied by batch, and batches left in flight make ties, pinned slots and the window's widening
common; the larger cache (12,000 slots) takes the C++ path's sampled threshold (a small one
scans every slot).
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neo.cpp import cpu_kernels
from neo.embedding.cache import CacheCapacityError, CacheIndex

pytestmark = pytest.mark.skipif(cpu_kernels("cache_admit") is None, reason="neo._C is not built")


def _batches(seed: int, count: int, hot: int, size: int, N: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.cat([torch.randint(0, hot, (size,), generator=g), torch.randint(0, N, (size // 3,), generator=g)])
        out.append(torch.unique(ids))
    return out


def _same_admission(a, b) -> None:
    assert a.seq == b.seq and a.hits == b.hits
    for name in ("rows", "slots", "miss_rows", "fill_slots", "evicted_rows", "evicted_slots"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), policy=st.sampled_from(["lru", "lfu", "lookahead"]),
       window=st.integers(0, 6), lag=st.integers(0, 2), hot=st.sampled_from([0.08, 0.15, 0.5]),
       size=st.sampled_from([4, 12, 20]), large=st.booleans())
def test_cpp_admissions_equal_the_reference(seed, policy, window, lag, hot, size, large):
    N, C, size = (40_000, 12_000, size * 100) if large else (400, 48, size)
    fast = CacheIndex("t", N, C, policy, kernel="auto")
    ref = CacheIndex("t", N, C, policy, kernel="reference")
    assert fast.cpp and not ref.cpp and (policy != "lookahead" or (fast._window.cpp and not ref._window.cpp))
    batches = _batches(seed, 40, int(hot * N), size, N)
    flying = []
    for i, rows in enumerate(batches):
        future = batches[i + 1:i + 1 + window]
        try:
            a = fast.admit(rows, future)
        except CacheCapacityError as e:
            with pytest.raises(CacheCapacityError, match=re.escape(str(e))):
                ref.admit(rows, future)
            a = None
        if a is not None:
            _same_admission(a, ref.admit(rows, future))
        for name in ("slot_of_row", "row_of_slot", "key", "count", "_free"):
            assert torch.equal(getattr(fast, name), getattr(ref, name)) if getattr(ref, name) is not None \
                else getattr(fast, name) is None, name
        assert fast._in_flight.keys() == ref._in_flight.keys()
        if policy == "lookahead":
            assert torch.equal(fast._window.mask, ref._window.mask)
        if a is not None:
            flying.append(a.seq)
        while len(flying) > lag:
            s = flying.pop(0)
            fast.complete(s)
            ref.complete(s)


@pytest.mark.parametrize("policy", ["lru", "lfu", "lookahead"])
def test_cpp_admission_that_cannot_fit_fails_as_the_reference_does(policy):
    """8 slots, 5 pinned by a batch in flight: a batch of 6 new rows cannot be admitted. Both
    raise the same error, leave the same state (the counts bumped, nothing else), and admit the
    batch once the other completes."""
    idx = {k: CacheIndex("t", 100, 8, policy, kernel=k) for k in ("auto", "reference")}
    errors = {}
    for k, ix in idx.items():
        ix.admit(torch.arange(5))
        with pytest.raises(CacheCapacityError) as e:
            ix.admit(torch.arange(10, 16), [torch.arange(10, 12)])
        errors[k] = str(e.value)
        ix.complete(1)
        ix.admit(torch.arange(10, 16), [torch.arange(10, 12)])
    assert errors["auto"] == errors["reference"] and "3 free and 0 evictable" in errors["auto"]
    for name in ("slot_of_row", "row_of_slot", "key", "_free"):
        assert torch.equal(getattr(idx["auto"], name), getattr(idx["reference"], name)), name


def test_cpp_victims_break_ties_by_row_and_widen_the_window():
    """A cache of 8 slots filled by one batch (lru: one key for all 8), then a batch of 3 misses:
    the 3 lowest rows go. With a window that needs the 5 lowest rows, the next 3 go instead."""
    for kernel in ("auto", "reference"):
        idx = CacheIndex("t", 100, 8, "lru", kernel=kernel)
        idx.admit(torch.tensor([90, 80, 70, 60, 50, 40, 30, 20]).sort().values)
        idx.complete(1)
        a = idx.admit(torch.tensor([1, 2, 3]))
        assert sorted(a.evicted_rows.tolist()) == [20, 30, 40], kernel
        idx.complete(2)
        la = CacheIndex("t", 100, 8, "lookahead", kernel=kernel)
        la.admit(torch.tensor([20, 30, 40, 50, 60, 70, 80, 90]))
        la.complete(1)
        future = [torch.tensor([20, 30]), torch.tensor([40, 50, 60])]
        b = la.admit(torch.tensor([1, 2, 3]), future)
        assert sorted(b.evicted_rows.tolist()) == [70, 80, 90], kernel


def test_cpp_victims_check_their_arguments():
    from neo import _C

    key = torch.zeros(4, dtype=torch.int64)
    rows = torch.arange(4)
    with pytest.raises(RuntimeError, match="pinned slot 9 outside"):
        _C.cache_victims(key, torch.tensor([9]), 1, rows)
    with pytest.raises(RuntimeError, match="key must be a contiguous 1-D CPU Long tensor"):
        _C.cache_victims(key.int(), torch.tensor([0]), 1, rows)
    with pytest.raises(RuntimeError, match="window_mask and bit_value go together"):
        _C.cache_victims(key, torch.tensor([0]), 1, rows, torch.zeros(4, dtype=torch.int64))
    slots, evictable = _C.cache_victims(key, torch.tensor([0, 0, 1]), 3, rows)
    assert evictable == 2 and slots.numel() == 0
    idx = CacheIndex("t", 100, 8, "lfu")
    with pytest.raises(RuntimeError, match=r"rows must be sorted, unique and in \[0, 100\): entry 1 is 3"):
        _C.cache_admit(torch.tensor([5, 3]), 1, idx.slot_of_row, idx.row_of_slot, idx.key, idx.count, idx._free,
                       idx._free[:0])
    with pytest.raises(RuntimeError, match=r"entry 0 is 100"):
        _C.cache_admit(torch.tensor([100]), 1, idx.slot_of_row, idx.row_of_slot, idx.key, idx.count, idx._free,
                       idx._free[:0])
    with pytest.raises(RuntimeError, match=r"pinned slot 99 outside \[0, 8\)"):
        _C.cache_admit(torch.tensor([5]), 1, idx.slot_of_row, idx.row_of_slot, idx.key, idx.count, idx._free,
                       torch.tensor([99]))
    assert int(idx.count.sum()) == 0 and bool((idx.slot_of_row == -1).all())     # refused before any change


def _brute_force(key, pinned, need, row_of_slot):
    """The definition: the evictable slots' need smallest (key, row); below the cut in slot order,
    then the ties at the cut (by row where some stay)."""
    never = (1 << 63) - 1
    ev = [s for s in range(len(key)) if key[s] != never and s not in set(pinned)]
    cut = sorted(key[s] for s in ev)[need - 1]
    below = [s for s in ev if key[s] < cut]
    ties = [s for s in ev if key[s] == cut]
    if need - len(below) < len(ties):
        ties = sorted(ties, key=lambda s: row_of_slot[s])
    return below + ties[:need - len(below)]


@pytest.mark.parametrize("case", ["unsampled_slots_smaller", "sampled_slots_smaller", "all_tied", "random"])
def test_cpp_victims_on_crafted_keys(case):
    """Keys the sampled threshold misjudges (the slots it does not sample hold the smallest keys,
    or it samples only small ones and must scan again), ties everywhere, and random keys."""
    from neo import _C

    C = 10_000                                              # the sample takes every second slot
    g = torch.Generator().manual_seed(7)
    s = torch.arange(C)
    key = {"unsampled_slots_smaller": torch.where(s % 2 == 1, s, 10**9 + s),
           "sampled_slots_smaller": torch.where(s % 2 == 0, s, 10**9 + s),
           "all_tied": torch.full((C,), 5, dtype=torch.int64),
           "random": torch.randint(0, 300, (C,), generator=g)}[case]
    key[torch.randperm(C, generator=g)[:50]] = (1 << 63) - 1          # never-used slots
    row_of_slot = torch.randperm(10 * C, generator=g)[:C]
    pinned = torch.randint(0, C, (700,), generator=g)
    for need in (1, 37, 2_500, 4_000):
        got, evictable = _C.cache_victims(key, pinned, need, row_of_slot)
        assert evictable == C - len(set(pinned.tolist()) | set(torch.nonzero(key == (1 << 63) - 1).flatten().tolist()))
        assert got.tolist() == _brute_force(key.tolist(), pinned.tolist(), need, row_of_slot.tolist()), (case, need)
