"""Loader: exact-once coverage across ranks, resumption, determinism, layouts, partial batches."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.schema import DatasetMeta, sparse_names
from data_pipeline.writer import Columns, ShardWriter, WriterOptions

N = 1003  # not divisible by 2, 3 or the batch sizes used


def write_indexed(directory, n=N, jagged=False, rows_per_file=300, row_group_rows=64):
    """Sample i: dense[0] = i, label = i % 2, cat_0 = i, cat_1 = 7 * i (+ a jagged cat_2: bag of i % 4 ids)."""
    idx = np.arange(n)
    dense = np.stack([idx, -idx], 1).astype(np.float32)  # (n, 2)
    sparse = [idx.astype(np.int64), 7 * idx.astype(np.int64)]
    if jagged:
        lens = idx % 4
        offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        vals = np.concatenate([np.arange(k) + 10 * i for i, k in enumerate(lens)]).astype(np.int64)
        sparse.append((vals, offs))
    meta = DatasetMeta(num_dense=2, sparse_names=sparse_names(len(sparse)), source="synthetic")
    w = ShardWriter(str(directory), meta, "list" if jagged else "onehot",
                    WriterOptions(rows_per_file=rows_per_file, row_group_rows=row_group_rows))
    full = Columns((idx % 2).astype(np.int8), dense, sparse)
    for a in range(0, n, 250):  # several writes, crossing row groups and files
        w.write(full.slice(a, min(n, a + 250)))
    return w.close()


def sample_ids(batches):
    return [int(x) for b in batches for x in b.dense[:, 0].tolist()]


@pytest.fixture
def data(tmp_path):
    files = write_indexed(tmp_path / "d")
    assert len(files) == 4
    return str(tmp_path / "d")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_exact_once_across_ranks(data, world, shuffle):
    seen = []
    for r in range(world):
        L = ParquetLoader(data, LoaderOptions(batch_size=37, rank=r, world_size=world, shuffle=shuffle,
                                              shuffle_window=100, read_rows=90, seed=5))
        batches = list(L)
        assert len(batches) == len(L)
        assert all(b.batch_size == 37 for b in batches[:-1]) and 0 < batches[-1].batch_size <= 37
        ids = sample_ids(batches)
        assert len(ids) == L.shard_size and abs(L.shard_size - N / world) < 1
        seen.extend(ids)
        for b in batches:  # every field of a sample agrees with its index
            i = b.dense[:, 0].long()
            assert torch.equal(b.labels, (i % 2).float()) and torch.equal(b.dense[:, 1], -b.dense[:, 0])
            b.sparse.check()
            B = b.batch_size
            assert torch.equal(b.sparse.values[:B], i) and torch.equal(b.sparse.values[B:], 7 * i)
            assert b.sparse.keys == ("cat_0", "cat_1") and torch.equal(b.sparse.lengths, torch.ones(2 * B, dtype=torch.int64))
    assert sorted(seen) == list(range(N))  # union is everything, no duplicates


def test_drop_last_and_len(data):
    L = ParquetLoader(data, LoaderOptions(batch_size=100, drop_last=True))
    b = list(L)
    assert len(b) == len(L) == 10 and all(x.batch_size == 100 for x in b)
    assert sample_ids(b) == list(range(1000))  # the last 3 samples are dropped, only under drop_last
    assert len(list(ParquetLoader(data, LoaderOptions(batch_size=100)))) == 11


@pytest.mark.parametrize("first_window", [0, 8])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("prefetch", [0, 4])
def test_resume_identical(data, shuffle, prefetch, first_window):
    """Resumed at positions inside and after the ramp of small first windows (8, 16, 32, then full:
    positions 29 and 145 fall in windows 2 and 4) as well as without one."""
    opts = dict(batch_size=29, rank=1, world_size=2, shuffle=shuffle, shuffle_window=64, read_rows=50, seed=3,
                prefetch_batches=prefetch, first_window=first_window)
    ref = ParquetLoader(data, LoaderOptions(**opts))
    full = [sample_ids(list(ref)) for _ in range(2)]  # two epochs
    assert ref.epoch == 2
    for stop in (0, 1, 5, 17):
        L = ParquetLoader(data, LoaderOptions(**opts))
        got = []
        it = iter(L)
        for _ in range(stop):
            got.extend(sample_ids([next(it)]))
        state = L.state_dict()
        del it
        L2 = ParquetLoader(data, LoaderOptions(**opts))
        L2.load_state_dict(state)
        got.extend(sample_ids(list(L2)))  # the rest of epoch 0
        assert got == full[0], stop
        assert sample_ids(list(L2)) == full[1]  # then epoch 1 as uninterrupted
    # a resumed loader may use another batch size: positions count samples
    L3 = ParquetLoader(data, LoaderOptions(**dict(opts, batch_size=64)))
    L3.load_state_dict(dict(state))
    assert sample_ids(list(L3)) == full[0][17 * 29:]


def test_state_mismatch_rejected(data):
    L = ParquetLoader(data, LoaderOptions(world_size=2))
    with pytest.raises(ValueError, match="world_size"):
        ParquetLoader(data, LoaderOptions(world_size=3)).load_state_dict(L.state_dict())
    # another window layout puts other samples before a position: refused by name
    ramp = ParquetLoader(data, LoaderOptions(shuffle=True, shuffle_window=64, first_window=8))
    with pytest.raises(ValueError, match="first_window"):
        ParquetLoader(data, LoaderOptions(shuffle=True, shuffle_window=64, first_window=0)).load_state_dict(
            ramp.state_dict())


def test_an_unshuffled_resume_takes_other_window_sizes(data):
    """Unshuffled, the order is the files' whatever the read windows: a state saved with another
    read_rows loads, and the rest of the epoch follows (before: refused for its first_window)."""
    a = ParquetLoader(data, LoaderOptions(batch_size=8, read_rows=64))
    it = iter(a)
    seen = sample_ids([next(it) for _ in range(5)])
    it.close()
    b = ParquetLoader(data, LoaderOptions(batch_size=8))
    b.load_state_dict(dict(a.state_dict(), first_window=16384))      # a state saved by an earlier Neo held it
    b.load_state_dict(a.state_dict())
    assert seen + sample_ids(list(b)) == sample_ids(list(ParquetLoader(data, LoaderOptions(batch_size=8))))


def test_close_ends_a_warm_up_no_iteration_took(data):
    import threading
    import time

    L = ParquetLoader(data, LoaderOptions(batch_size=8, shuffle=True, shuffle_window=64))
    L.warm_up()
    L.close()
    time.sleep(0.2)
    assert L._warm is None and not [t for t in threading.enumerate() if t.name.startswith("neo-data-warm")]


def test_id_limits_are_one_per_sparse_column(data):
    """A short list would leave the last columns unchecked: refused."""
    with pytest.raises(ValueError, match=r"id_limits has 1 entries for 2 sparse columns"):
        list(ParquetLoader(data, LoaderOptions(batch_size=8, id_limits=[10 ** 6])))


def test_determinism_and_epochs(data):
    o = LoaderOptions(batch_size=50, shuffle=True, shuffle_window=128, seed=11)
    a = ParquetLoader(data, o)
    b = ParquetLoader(data, o)
    e0a, e0b = sample_ids(list(a)), sample_ids(list(b))
    assert e0a == e0b and e0a != list(range(N)) and sorted(e0a) == list(range(N))
    e1 = sample_ids(list(a))
    assert e1 != e0a and sorted(e1) == list(range(N))
    c = ParquetLoader(data, LoaderOptions(batch_size=50, shuffle=True, shuffle_window=128, seed=12))
    assert sample_ids(list(c)) != e0a
    # shuffling stays within windows of 128 samples
    pos = {s: p for p, s in enumerate(e0a)}
    assert all(pos[s] // 128 == s // 128 for s in range(N))
    # unshuffled order is the file order
    assert sample_ids(list(ParquetLoader(data, LoaderOptions(batch_size=64)))) == list(range(N))


def test_jagged_layout(tmp_path):
    write_indexed(tmp_path / "j", jagged=True)
    L = ParquetLoader(str(tmp_path / "j"), LoaderOptions(batch_size=13, shuffle=True, shuffle_window=50))
    seen = []
    for b in L:
        b.sparse.check()
        d = b.sparse.to_dict()
        ids = b.dense[:, 0].long().tolist()
        seen.extend(ids)
        assert d["cat_0"] == [[i] for i in ids] and d["cat_1"] == [[7 * i] for i in ids]
        assert d["cat_2"] == [[10 * i + j for j in range(i % 4)] for i in ids]
    assert sorted(seen) == list(range(N))


def test_early_stop_releases_thread(data):
    L = ParquetLoader(data, LoaderOptions(batch_size=10, prefetch_batches=2))
    for k, _ in enumerate(L):
        if k == 3:
            break
    assert L.position == 40 and L.epoch == 0


def test_producers_left_running_are_stopped_at_exit(data):
    """An iteration left open (a run that raised mid-epoch keeps its iterator alive) leaves its
    producer blocked on a full queue; the exit hook stops and joins it, so that no thread is
    inside pyarrow or torch while the interpreter finalizes (that aborted the process)."""
    from data_pipeline import loader

    L = ParquetLoader(data, LoaderOptions(batch_size=10, prefetch_batches=1))
    it = iter(L)
    next(it)                                          # not closed: the producer waits for room
    (th,) = [t for t in loader._producers if t.name == "neo-data-loader"]
    assert th.is_alive()
    loader._stop_producers()
    assert not th.is_alive() and th not in loader._producers


def test_the_exit_hook_that_stops_producers_is_registered(data):
    """The hook above runs at exit: in a fresh interpreter, ``atexit``'s functions (run by hand,
    as the interpreter's exit runs them) leave no producer alive."""
    import subprocess
    from pathlib import Path

    code = ("import atexit, sys\n"
            "from data_pipeline import loader\n"
            "L = loader.ParquetLoader(sys.argv[1], loader.LoaderOptions(batch_size=10, prefetch_batches=1))\n"
            "it = iter(L)\n"
            "next(it)\n"
            "(th,) = [t for t in loader._producers if t.name == 'neo-data-loader']\n"
            "alive = th.is_alive()\n"
            "atexit._run_exitfuncs()\n"
            "print(alive, th.is_alive())\n")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", code, data], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "False"]


@pytest.mark.parametrize("field, value", [("shuffle_window", 0), ("shuffle_window", -5), ("read_rows", -5),
                                          ("first_window", -1), ("prefetch_batches", -1), ("thread_nice", -1),
                                          ("thread_nice", 20)])
def test_window_options_out_of_range_are_refused(data, field, value):
    with pytest.raises(ValueError, match=rf"LoaderOptions\.{field} must be"):
        ParquetLoader(data, LoaderOptions(batch_size=10, **{field: value}))


@pytest.mark.parametrize("field, value", [("batch_size", 64.5), ("batch_size", "64"), ("rank", 1.0),
                                          ("world_size", None), ("prefetch_batches", True)])
def test_options_that_are_not_integers_are_named(data, field, value):
    with pytest.raises(TypeError, match=rf"LoaderOptions\.{field} must be an integer, got {value!r}"):
        ParquetLoader(data, LoaderOptions(**{field: value}))


@pytest.mark.parametrize("drop_last", [False, True])
def test_state_at_end_of_epoch_starts_next_epoch(data, drop_last):
    opts = LoaderOptions(batch_size=100, shuffle=True, shuffle_window=300, drop_last=drop_last)
    ref = ParquetLoader(data, opts)
    e0, e1 = sample_ids(list(ref)), sample_ids(list(ref))
    L = ParquetLoader(data, opts)
    it = iter(L)
    got = sample_ids([next(it) for _ in range(len(L))])  # every batch, generator not exhausted
    assert got == e0 and L.epoch == 0
    L2 = ParquetLoader(data, opts)
    L2.load_state_dict(L.state_dict())
    assert sample_ids(list(L2)) == e1 and L2.epoch == 2


def test_reader_error_reaches_the_consumer(tmp_path):
    files = write_indexed(tmp_path / "e")
    L = ParquetLoader(str(tmp_path / "e"), LoaderOptions(batch_size=100, prefetch_batches=2))
    with open(files[1], "r+b") as f:  # corrupt the second file after the footers were read
        f.truncate(100)
    got = []
    with pytest.raises(Exception):
        for b in L:
            got.extend(sample_ids([b]))
    assert got == list(range(len(got))) and len(got) < 300  # the first file's samples, then the error
    assert L.epoch == 0


def test_a_file_damaged_after_the_loader_was_built_is_named(tmp_path):
    from data_pipeline.schema import DataFileError

    files = write_indexed(tmp_path / "e")
    L = ParquetLoader(str(tmp_path / "e"), LoaderOptions(batch_size=100, prefetch_batches=0))
    with open(files[1], "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataFileError, match=rf"{files[1]} row group 0: unreadable"):
        list(L)


@pytest.mark.parametrize("first", [0, 16])
@pytest.mark.parametrize("prefetch", [0, 3])
def test_shuffle_order_is_the_documented_one(tmp_path, prefetch, first):
    """Window k of a rank's range, permuted by default_rng([seed, epoch, k]), batches cut across
    windows: computed here from the sample indices alone (windows span row groups and files).
    With ``first_window``, the windows are 16, 32, 64 samples, then 70 each."""
    write_indexed(tmp_path / "o", jagged=True, rows_per_file=300, row_group_rows=64)
    seed, win, B, world, rank = 5, 70, 16, 2, 1
    L = ParquetLoader(str(tmp_path / "o"), LoaderOptions(batch_size=B, shuffle=True, shuffle_window=win, seed=seed,
                                                        rank=rank, world_size=world, prefetch_batches=prefetch,
                                                        first_window=first))
    lo, hi = rank * N // world, (rank + 1) * N // world
    sizes = ([16, 32, 64] if first else []) + [win] * (hi - lo)      # more than enough windows
    starts = np.cumsum([0] + sizes)
    for epoch in (0, 1):
        want = []
        for k, a in enumerate(int(x) for x in starts if x < hi - lo):
            n = min(sizes[k], hi - lo - a)
            want.extend((lo + a + np.random.default_rng([seed, epoch, k]).permutation(n)).tolist())
        got = [b for b in L]
        assert sample_ids(got) == want
        for b in got:
            ids = b.dense[:, 0].long().tolist()
            assert b.sparse.to_dict()["cat_2"] == [[10 * i + j for j in range(i % 4)] for i in ids]


@pytest.mark.parametrize("shuffle", [False, True])
def test_warm_up_changes_no_batch(data, shuffle):
    opts = dict(batch_size=29, rank=1, world_size=2, shuffle=shuffle, shuffle_window=64, read_rows=50, seed=3,
                prefetch_batches=2)
    ref = ParquetLoader(data, LoaderOptions(**opts))
    full = [sample_ids(list(ref)) for _ in range(2)]
    warm = ParquetLoader(data, LoaderOptions(**opts))
    warm.warm_up()                                     # the first window is read before the iteration
    assert warm._warm is not None and warm._warm[0] == 0
    assert sample_ids(list(warm)) == full[0] and warm._warm is None
    warm.warm_up()                                     # epoch 0 is done: the next iteration starts epoch 1
    assert sample_ids(list(warm)) == full[1]
    # a warm read of another window (position moved after it) is dropped, not used
    state = {**ref.state_dict(), "epoch": 0, "position": 5 * 29}
    moved = ParquetLoader(data, LoaderOptions(**opts))
    moved.warm_up()
    moved.load_state_dict(state)                       # window 2 (145 // 64), not the warmed window 0
    assert sample_ids(list(moved)) == full[0][5 * 29:]


def test_decode_seconds_times_the_rank_s_row_group_and_changes_no_batch(data):
    """Files of 300 rows in row groups of 64: rank 1 of 2 begins at sample 1003 // 2 = 501, row 201
    of file 1, in its row group 3 (rows 192-255); a file's last group holds the rest (44 rows)."""
    opts = dict(batch_size=29, rank=1, world_size=2, shuffle=True, shuffle_window=64, seed=3, prefetch_batches=0)
    ref = sample_ids(list(ParquetLoader(data, LoaderOptions(**opts))))
    timed = ParquetLoader(data, LoaderOptions(**opts))
    it = iter(timed)
    first = sample_ids([next(it)])
    it.close()
    seconds, rows = timed.decode_seconds()
    assert rows == 64 and seconds >= 0.0
    tail = ParquetLoader(data, LoaderOptions(**dict(opts, rank=5, world_size=9)))   # 557: row 257 of file 1
    assert tail.decode_seconds()[1] == 300 - 4 * 64
    last = ParquetLoader(data, LoaderOptions(**dict(opts, rank=25, world_size=26)))  # 964: file 3 (900-1002), group 1
    assert last.decode_seconds()[1] == 103 - 64
    timed.set_epoch(0)
    assert first == ref[:29] and sample_ids(list(timed)) == ref


def test_closing_early_leaves_the_unneeded_read_running_and_the_next_read_waits_for_it(data):
    """A run that stops mid-window closes its iteration while the producer may be reading the next
    window: the close must not wait for that read (a third of the tiny MLPerf run's timed steps),
    and reads must still never overlap (the loader has one open file)."""
    import threading
    import time

    opts = LoaderOptions(batch_size=10, shuffle=True, shuffle_window=64, seed=1, prefetch_batches=2)
    expected = sample_ids(list(ParquetLoader(data, opts)))
    L = ParquetLoader(data, opts)
    gate, safety = threading.Event(), threading.Timer(20.0, lambda: gate.set())
    active, most, reads = [0], [0], []
    lock = threading.Lock()
    real = L._read_window

    def read(k):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if k == 1:
                gate.wait()                  # window 1 (the read-ahead) is slow,
                time.sleep(0.2)              # still reading when the next iteration starts
            return real(k)
        finally:
            with lock:
                active[0] -= 1
                reads.append(k)

    L._read_window = read
    safety.start()
    try:
        got = []
        for b in L:                          # window 0 holds 64 samples: 6 whole batches
            got.append(b)
            if len(got) == 3:
                break
        assert not gate.is_set() and 1 not in reads     # closed while window 1 was still being read
        assert L.position == 30
        gate.set()
        rest = list(L)                       # resumes at 30, after the left-over read is done
        assert most[0] == 1                  # never two reads at once
        assert sample_ids(got + rest) == expected
    finally:
        gate.set()
        safety.cancel()


def test_close_joins_the_reader_an_early_stop_left(data):
    """A command that reads a few batches then exits (neo cache-report) closes the iterator and
    the loader: no reader thread is left for interpreter shutdown (it aborted the process with
    exit 134 in 3 runs of 5, found by the audit of 2026-11-29)."""
    from data_pipeline import loader

    L = ParquetLoader(data, LoaderOptions(batch_size=10, prefetch_batches=1))
    it = iter(L)
    next(it)
    (th,) = [t for t in loader._producers if t.name == "neo-data-loader"]
    it.close()
    L.close()
    assert not th.is_alive()
    assert [b.batch_size for b, _ in zip(L, range(2))] == [10, 10]      # iterating again works
    L.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.parametrize("nice", [0, 7])
def test_background_threads_stand_thread_nice_below_the_builder(data, nice):
    """The producer and the window reader run ``thread_nice`` below the thread that built the
    loader (the builder keeps its own), and give the same batches either way."""
    from data_pipeline import loader

    base = loader.thread_nice()
    seen = {}

    def note():
        seen[threading.current_thread().name.split("_")[0]] = loader.thread_nice()

    L = ParquetLoader(data, LoaderOptions(batch_size=10, shuffle=True, prefetch_batches=2, thread_nice=nice))
    reads = L._read_window

    def read(k):
        note()
        return reads(k)

    L._read_window = read
    to_batch = L._to_batch

    def make(cols):
        note()
        return to_batch(cols)

    L._to_batch = make
    got = sample_ids(L)
    assert got == sample_ids(ParquetLoader(data, LoaderOptions(batch_size=10, shuffle=True)))
    assert seen == {"neo-data-loader": min(19, base + nice), "neo-data-read": min(19, base + nice)}
    assert loader.thread_nice() == base
