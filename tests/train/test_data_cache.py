"""The synthetic data cache's leases and eviction (neo/train/data_cache.py): the least recently
used sets go until the cache fits ``data.synthetic.cache_max_gb``; a set any process reads (its
lease held), the run's own set, staging copies and other files stay."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import pytest

from neo.config import ConfigError
from neo.train.build import resolve_tables
from neo.train.data import prepare_data, synthetic_dir
from neo.train.data_cache import LEASE_FILE, evict, set_bytes, take_lease
from tests.train.test_trainer import tiny_config

ONE = types.SimpleNamespace(rank=0, world_size=1)


def _fake_set(cache: str, k: int, nbytes: int, used: float) -> str:
    """A complete set of ``nbytes`` payload bytes (plus its summary), last used at ``used``."""
    path = os.path.join(cache, f"synth-{k:012x}")
    os.makedirs(os.path.join(path, "train"))
    with open(os.path.join(path, "train", "part-0.parquet"), "wb") as f:
        f.write(b"x" * nbytes)
    with open(os.path.join(path, "summary.json"), "w") as f:
        f.write("{}")
    lease = os.path.join(path, LEASE_FILE)
    open(lease, "w").close()
    os.utime(lease, (used, used))
    return path


def _expected(sizes: dict, used: dict, keep: str, held: set, limit: int) -> set:
    """The oracle: oldest first, skipping ``keep`` and the held sets, until the total fits."""
    total, gone = sum(sizes.values()), set()
    for p in sorted(sizes, key=used.get):
        if total <= limit:
            break
        if p != keep and p not in held:
            gone.add(p)
            total -= sizes[p]
    return gone


@pytest.mark.parametrize("limit_sets", [0, 1, 2, 3, 6])
def test_the_least_recently_used_unleased_sets_go_until_the_cache_fits(tmp_path, limit_sets):
    cache = str(tmp_path)
    now = time.time()
    # six sets of 1000 bytes (+ 2 of summary), last used in the order 3, 0, 5, 1, 4, 2
    order = [3, 0, 5, 1, 4, 2]
    paths = [_fake_set(cache, k, 1000, now - 100 * (6 - order.index(k))) for k in range(6)]
    keep, held_path = paths[3], paths[5]                     # 3 is the oldest, 5 the third oldest
    staging = os.path.join(cache, f"synth-{7:012x}.tmp-123")
    os.makedirs(staging)
    other = os.path.join(cache, "notes.txt")
    open(other, "w").close()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); "
        "print('held', flush=True); sys.stdin.read()"), os.path.join(held_path, LEASE_FILE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        sizes = {p: set_bytes(p) for p in paths}
        used = {p: os.stat(os.path.join(p, LEASE_FILE)).st_mtime for p in paths}
        limit = limit_sets * 1002
        want = _expected(sizes, used, keep, {held_path}, limit)
        got = evict(cache, keep, limit)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert [e.path for e in got] == sorted(want, key=used.get)
    assert all(e.bytes == 1002 for e in got)
    for p in paths:
        assert os.path.exists(p) == (p not in want), p
    assert os.path.isdir(staging) and os.path.exists(other)
    assert not [n for n in os.listdir(cache) if ".evicted-" in n]
    assert keep in paths and held_path not in want


def test_a_reader_waiting_on_an_eviction_finds_no_set():
    """An eviction holds the set's lock; a reader that opened the lease file before the set was
    renamed away waits, then sees that the file it holds is no longer in place: no lease."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        path = _fake_set(cache, 1, 10, time.time())
        fd = os.open(os.path.join(path, LEASE_FILE), os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        result = {}
        reader = threading.Thread(target=lambda: result.setdefault("lease", take_lease(path)))
        reader.start()
        time.sleep(0.3)                                       # the reader is waiting on the lock
        os.rename(path, path + ".evicted-1")
        shutil.rmtree(path + ".evicted-1")
        os.close(fd)
        reader.join(timeout=30)
        assert result == {"lease": None}
        assert take_lease(path) is None                       # nothing in place: the caller generates


def test_a_run_evicts_older_sets_but_not_one_in_use(tmp_path):
    cache = str(tmp_path / "cache")
    messages = []

    def prepare(seed: int, limit: float):
        cfg = tiny_config(str(tmp_path), f"data.synthetic.seed={seed}", f"data.synthetic.cache_max_gb={limit}")
        return prepare_data(cfg, resolve_tables(cfg), ONE, log=messages.append), \
            synthetic_dir(cfg, resolve_tables(cfg))

    a, a_dir = prepare(1, 16)
    b, b_dir = prepare(2, 1e-9)                 # a is leased (its DataSpec lives): kept, over the limit
    assert os.path.isdir(a_dir) and os.path.isdir(b_dir)
    del a                                       # its lease released
    b.lease.release()
    os.utime(os.path.join(b_dir, LEASE_FILE), (1, 1))      # b now the least recently used
    c, c_dir = prepare(3, 1e-9)
    assert not os.path.exists(a_dir) and not os.path.exists(b_dir) and os.path.isdir(c_dir)
    removed = [m for m in messages if "removed synthetic set" in m]
    assert len(removed) == 2 and a_dir in removed[0] + removed[1] and b_dir in removed[0] + removed[1]
    assert "data.synthetic.cache_max_gb" in removed[0]
    assert sorted(os.listdir(cache)) == [os.path.basename(c_dir)]
    # the evicted set is generated again when asked for, identical
    again, again_dir = prepare(1, 0)
    assert again_dir == a_dir and again.train_paths and os.path.isdir(a_dir) and os.path.isdir(c_dir)


def test_without_flock_the_set_is_read_without_a_lease_and_nothing_evicted(tmp_path, monkeypatch):
    """A file system without flock (ENOLCK, as some network file systems answer): the run reads
    its set, says why it holds no lease, and evicts nothing."""
    import errno

    old, _ = _prepare_seed(tmp_path, 1)
    old.lease.release()
    os.utime(os.path.join(_prepare_seed(tmp_path, 1)[1], LEASE_FILE), (1, 1))

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    messages = []
    cfg = tiny_config(str(tmp_path), "data.synthetic.seed=2", "data.synthetic.cache_max_gb=1e-9")
    spec = prepare_data(cfg, resolve_tables(cfg), ONE, log=messages.append)
    assert spec.lease is None and spec.train_paths
    assert any("no lease on" in m and "No locks available" in m for m in messages), messages
    assert not any("removed synthetic set" in m for m in messages)
    assert len([n for n in os.listdir(tmp_path / "cache") if n.startswith("synth-")]) == 2


def _prepare_seed(tmp_path, seed: int):
    cfg = tiny_config(str(tmp_path), f"data.synthetic.seed={seed}")
    return prepare_data(cfg, resolve_tables(cfg), ONE, log=lambda *a: None), synthetic_dir(cfg, resolve_tables(cfg))


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_cache_limit_is_named(tmp_path, value):
    with pytest.raises(ConfigError, match="data.synthetic.cache_max_gb"):
        tiny_config(str(tmp_path), f"data.synthetic.cache_max_gb={value}")


def test_an_evictor_whose_lock_comes_after_the_set_was_made_again_keeps_it(tmp_path, monkeypatch):
    """Evictor C opens X's lease file; meanwhile X is evicted and made again (a new lease file);
    C's exclusive lock then holds the old file: X is not removed."""
    from neo.train import data_cache

    cache = str(tmp_path)
    x = _fake_set(cache, 1, 100, 1.0)
    keep = _fake_set(cache, 2, 10, time.time())
    real = fcntl.flock

    def remade_first(fd, op):
        if op & fcntl.LOCK_EX:
            shutil.rmtree(x)
            _fake_set(cache, 1, 100, time.time())           # another run made X again
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", remade_first)
    assert data_cache.evict(cache, keep, 0) == []
    monkeypatch.setattr(fcntl, "flock", real)
    assert os.path.exists(os.path.join(x, "summary.json"))


def test_locks_that_fail_or_sets_this_process_reads_are_kept(tmp_path, monkeypatch):
    import errno

    from neo.train import data_cache

    cache = str(tmp_path)
    a = _fake_set(cache, 1, 100, 1.0)
    b = _fake_set(cache, 2, 100, 2.0)
    keep = _fake_set(cache, 3, 10, time.time())
    lease = take_lease(b)                                 # this process reads b
    real = fcntl.flock

    def emulated(fd, op):          # NFS: flock emulated by fcntl locks, which belong to the process
        if op & fcntl.LOCK_EX and os.fstat(fd).st_ino == os.stat(os.path.join(a, LEASE_FILE)).st_ino:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return None if op & fcntl.LOCK_EX else real(fd, op)

    monkeypatch.setattr(fcntl, "flock", emulated)
    assert data_cache.evict(cache, keep, 0) == []          # a: its lock failed; b: this process's lease
    monkeypatch.setattr(fcntl, "flock", real)
    assert os.path.isdir(a) and os.path.isdir(b)
    lease.release()
    assert [e.path for e in data_cache.evict(cache, keep, 0)] == [a, b]


def test_what_an_interrupted_eviction_left_is_removed_and_names_are_matched_whole(tmp_path):
    cache = str(tmp_path)
    keep = _fake_set(cache, 3, 10, time.time())
    left = os.path.join(cache, f"synth-{1:012x}.evicted-999999")
    os.makedirs(os.path.join(left, "train"))
    odd = os.path.join(cache, f"synth-{2:012x}\n")
    os.makedirs(odd)
    with open(os.path.join(odd, "summary.json"), "w") as f:
        f.write("{}")
    assert evict(cache, keep, 0) == []
    assert not os.path.exists(left) and os.path.isdir(odd) and os.path.isdir(keep)


def test_the_run_leases_again_when_its_set_was_made_again_between_check_and_lease(tmp_path, monkeypatch):
    from neo.train import data_cache

    cfg = tiny_config(str(tmp_path))
    tables = resolve_tables(cfg)
    prepare_data(cfg, tables, ONE, log=lambda *a: None).lease.release()
    real, calls = data_cache.take_lease, []

    def raced_once(path):
        calls.append(path)
        return None if len(calls) == 1 else real(path)     # the first: lost to an eviction and remake

    monkeypatch.setattr(data_cache, "take_lease", raced_once)
    spec = prepare_data(cfg, tables, ONE, log=lambda *a: None)
    assert spec.lease is not None and len(calls) == 2


def test_a_lease_is_shared_by_copies_and_not_pickled(tmp_path):
    import copy
    import pickle

    path = _fake_set(str(tmp_path), 1, 10, time.time())
    lease = take_lease(path)
    assert copy.copy(lease) is lease and copy.deepcopy({"l": lease})["l"] is lease
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(lease)
    lease.release()
    lease.release()                                       # a second release does nothing
