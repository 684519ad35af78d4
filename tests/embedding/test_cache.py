"""The embedding cache: cached tables train exactly like tables in fast memory.

The oracle is the same module with every table on the device (``placement: device``): after
every step the pooled outputs, and at the end every weight and optimizer-state value, must be
equal bit for bit (fp32), for every optimizer, policy and store, with evictions in every step,
prefetched ahead (on the cache's worker thread, as the training pipeline does) and not. The
index and its policies are checked against small hand-worked cases.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch

from neo.config.embedding import ConfigError, OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.embedding.cache import CacheCapacityError, CacheIndex, CacheStoreError, MmapStore
from neo.embedding.init import TableRegion
from neo.sparse import KeyedJaggedBatch

OPTS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "lamb"]


def make_tables(opt: str, cached: bool, policy: str = "lru", store: str = "host", cache_rows: int = 60,
                dtype: str = "fp32", sr: bool = True, lookahead: int = 2, wd: float = 0.01, pooling: str = "mean"):
    o = OptimizerConfig(opt, lr=0.05, weight_decay=wd if opt != "sgd" else 0.0,
                        initial_accumulator_value=0.1 if "adagrad" in opt else 0.0)
    kw = dict(placement="cached", cache_rows=cache_rows, cache_policy=policy, cache_store=store,
              cache_lookahead=lookahead) if cached else {}
    return [
        TableConfig("big", 500, 8, feature_names=("big1", "big2"), optimizer=o, dtype=dtype,
                    stochastic_rounding=sr, **kw),                          # two features, one cached table
        TableConfig("mean", 300, 12, pooling=pooling, optimizer=o, dtype=dtype, stochastic_rounding=sr,
                    **(dict(kw, cache_rows=cache_rows // 2 + 10) if cached else {})),
        TableConfig("dev", 50, 4, optimizer=o, dtype=dtype, stochastic_rounding=sr),   # stays on the device
    ]


def make_batch(gen: torch.Generator, B: int = 16, weighted: bool = False) -> KeyedJaggedBatch:
    keys = ("big1", "big2", "mean", "dev")
    rows = {"big1": 500, "big2": 500, "mean": 300, "dev": 50}
    vals, lens = [], []
    for k in keys:
        ln = torch.randint(0, 4, (B,), generator=gen)
        ids = torch.randint(0, rows[k], (int(ln.sum()),), generator=gen)
        hot = torch.rand(ids.numel(), generator=gen) < 0.3
        ids[hot] = torch.randint(0, 5, (int(hot.sum()),), generator=gen)     # duplicates in and across bags
        vals.append(ids)
        lens.append(ln)
    v = torch.cat(vals)
    w = torch.rand(v.numel(), generator=gen) + 0.5 if weighted else None
    return KeyedJaggedBatch(keys, v, torch.cat(lens), B, weights=w)


def train_pair(opt, backend="cpu", steps=12, prefetch="alternate", store_dir=None, **kw):
    """Train an all-on-device module and a cached one on the same batches; compare after every step."""
    dev = TableBatchedEmbedding(make_tables(opt, False, **{k: v for k, v in kw.items() if k in ("dtype", "sr", "wd", "pooling")}),
                                backend=backend, seed=3)
    cached = TableBatchedEmbedding(make_tables(opt, True, **kw), backend=backend, seed=3, store_dir=store_dir)
    gen = torch.Generator().manual_seed(11)
    batches = [make_batch(gen, weighted=(opt == "adagrad")) for _ in range(steps + 4)]
    evictions = []
    for i in range(steps):
        b = batches[i]
        before = cached.cache_stats()["big"].evictions
        if prefetch == "always" or (prefetch == "alternate" and i % 2 == 0):
            cached.prefetch(b, future=batches[i + 1:i + 3])
        grad = torch.randn(b.batch_size, dev.output_dim, generator=gen)
        out_dev, out_cached = dev(b), cached(b)
        assert torch.equal(out_dev, out_cached), f"step {i}: pooled outputs differ"
        (out_dev * grad).sum().backward()
        (out_cached * grad).sum().backward()
        evictions.append(cached.cache_stats()["big"].evictions - before)
    return dev, cached, evictions


def assert_same_tables(a, b):
    for t in a.tables:
        assert torch.equal(a.table_weight(t.name), b.table_weight(t.name)), f"table {t.name}: weights differ"
        sa, sb = a.table_optimizer_state(t.name), b.table_optimizer_state(t.name)
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"table {t.name}: optimizer state {k} differs"


@pytest.mark.parametrize("opt", OPTS)
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_cached_training_equals_device_training(opt, backend):
    dev, cached, evictions = train_pair(opt, backend)
    assert_same_tables(dev, cached)
    s = cached.cache_stats()["big"]
    assert s.misses > 0 and s.writebacks > 0 and s.hits > 0


@pytest.mark.parametrize("policy", ["lru", "lfu", "lookahead"])
def test_every_policy_is_exact_and_evicts_every_step(policy):
    dev, cached, evictions = train_pair("adagrad", "cpu", steps=10, prefetch="always", policy=policy)
    assert_same_tables(dev, cached)
    # The 60-row cache fills within the first three batches (about 36 distinct rows each, of 500;
    # whether two already overflow it depends on the draw: not at seeds shifted by 99991), and
    # from then on every step evicts.
    first = next((i for i, e in enumerate(evictions) if e > 0), len(evictions))
    assert first <= 2 and all(e > 0 for e in evictions[first:]), f"a step without evictions: {evictions}"


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copy_of_a_cached_module_trains_on_its_own(how):
    """A module with cached tables (host store), trained a few steps, then copied (deep copy,
    pickle, or torch.save and load): the copy, trained on the same later batches as a module whose
    tables are all on the device, stays equal to it; training the copy leaves the original
    untouched."""
    import copy
    import io
    import pickle

    dev, cached, _ = train_pair("adagrad", steps=4)
    if how == "deepcopy":
        twin = copy.deepcopy(cached)
    elif how == "pickle":
        twin = pickle.loads(pickle.dumps(cached))
    else:
        buf = io.BytesIO()
        torch.save(cached, buf)
        buf.seek(0)
        twin = torch.load(buf, weights_only=False)
    before = {t.name: cached.table_weight(t.name).clone() for t in cached.tables}
    gen = torch.Generator().manual_seed(5)
    for i in range(4):
        b = make_batch(gen, weighted=True)
        grad = torch.randn(b.batch_size, dev.output_dim, generator=gen)
        if i % 2 == 0:
            twin.prefetch(b)
        outs = [m(b) for m in (dev, twin)]
        assert torch.equal(outs[0], outs[1]), f"step {i}"
        for o in outs:
            (o * grad).sum().backward()
    assert_same_tables(dev, twin)
    for n, w in before.items():
        assert torch.equal(cached.table_weight(n), w), f"table {n}: the original moved with its copy"
    assert any(not torch.equal(before[n], dev.table_weight(n)) for n in before)      # the copy moved on
    b = make_batch(gen)
    (cached(b) * torch.randn(b.batch_size, dev.output_dim, generator=gen)).sum().backward()   # the original still trains


def test_a_module_with_tables_in_files_or_a_batch_in_flight_refuses_to_be_copied(tmp_path):
    import copy

    m = TableBatchedEmbedding(make_tables("sgd", True, store="mmap"), backend="cpu", seed=3, store_dir=str(tmp_path))
    with pytest.raises(TypeError, match=r"cached tables \['big', 'mean'\] keep their rows in files"):
        copy.deepcopy(m)
    m = TableBatchedEmbedding(make_tables("sgd", True), backend="cpu", seed=3)
    gen = torch.Generator().manual_seed(1)
    out = m(make_batch(gen))                     # looked up, backward not yet run: its slots are pinned
    with pytest.raises(TypeError, match=r"1 batch\(es\) in flight \(prefetched or looked up"):
        copy.deepcopy(m)
    out.sum().backward()
    twin = copy.deepcopy(m)                      # between steps
    assert twin._cache.in_flight == 0


def test_mmap_store_is_exact_and_leaves_no_file(tmp_path):
    dev, cached, _ = train_pair("rowwise_adagrad", "cpu", store="mmap", store_dir=str(tmp_path))
    assert_same_tables(dev, cached)
    assert os.listdir(tmp_path) == []           # the backing files are unlinked once mapped


def test_fp16_without_stochastic_rounding_is_exact():
    dev, cached, _ = train_pair("adam", "cpu", dtype="fp16", sr=False)
    assert_same_tables(dev, cached)


def test_fbgemm_backend_behind_the_cache():
    import fbgemm_gpu  # noqa: F401  (a test dependency: missing must fail, not skip)
    dev, cached, _ = train_pair("rowwise_adagrad", "fbgemm", steps=6, wd=0.0, pooling="sum")
    assert_same_tables(dev, cached)


def test_triton_data_path_matches_torch():
    """The Triton kernels (interpreted on CPU tensors without CUDA: tests/conftest.py, compiled on
    CUDA tensors with it) move rows exactly like torch indexing."""
    from neo.embedding.cache.moves import TorchMoves, TritonMoves

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        tm = TritonMoves()
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the Triton cache kernels do not load: {e}")
    ref = TorchMoves()
    gen = torch.Generator().manual_seed(0)
    for dtype, D in ((torch.float32, 12), (torch.float16, 8), (torch.bfloat16, 36), (torch.float32, 1)):
        buf = torch.randn(40, D, generator=gen).to(dtype).to(dev)
        buf = buf.squeeze(1) if D == 1 else buf
        slots = torch.tensor([3, 0, 39, 17], dtype=torch.int64, device=dev)
        assert torch.equal(tm.gather(buf, slots), ref.gather(buf, slots))
        rows = torch.randn(4, D, generator=gen).to(dtype).to(dev).reshape(ref.gather(buf, slots).shape)
        a, b = buf.clone(), buf.clone()
        tm.scatter(a, slots, rows)
        ref.scatter(b, slots, rows)
        assert torch.equal(a.view(torch.int16) if dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if dtype == torch.bfloat16 else b)
    slot_of_row = torch.randint(-1, 30, (100,), generator=gen, dtype=torch.int32).to(dev)
    ids = torch.tensor([0, 5, 99, -1, 100, 7, 7], dtype=torch.int64, device=dev)
    assert torch.equal(tm.slots_of(slot_of_row, ids, 100), ref.slots_of(slot_of_row, ids, 100))


def test_triton_backend_behind_the_cache():
    """The triton backend's kernels on the cache slots (under the interpreter without a GPU)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = ("import torch; from tests.embedding.test_cache import train_pair, assert_same_tables; "
            "d, c, _ = train_pair('adagrad', 'triton', steps=3); assert_same_tables(d, c); "
            "assert c._cache.caches['big'].moves.name == 'triton'; print('ok')")
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ------------------------------------------------------------------ the index and its policies
def admit(index, rows, future=()):
    return index.admit(torch.tensor(rows), [torch.tensor(f) for f in future])


def test_lru_evicts_the_least_recently_used():
    ix = CacheIndex("t", 10, 3, "lru")
    for rows in ([1], [2], [3], [1]):
        ix.complete(admit(ix, rows).seq)
    a = admit(ix, [4])                                   # 2 is the least recently used
    assert a.evicted_rows.tolist() == [2] and a.hits == 0
    assert sorted(ix.resident_rows()[0].tolist()) == [1, 3, 4]


def test_lfu_evicts_the_least_frequently_used():
    ix = CacheIndex("t", 10, 3, "lfu")
    for rows in ([1, 2, 3], [1, 2], [1, 3], [2]):
        ix.complete(admit(ix, rows).seq)
    a = admit(ix, [5])                                   # counts 1:3, 2:3, 3:2
    assert a.evicted_rows.tolist() == [3]


def test_lookahead_keeps_rows_the_window_needs_and_evicts_the_farthest():
    ix = CacheIndex("t", 10, 3, "lookahead")
    for rows in ([1, 2, 3], [1, 2, 3], [1, 2, 3]):
        ix.complete(admit(ix, rows).seq)
    a = admit(ix, [7], future=[[1], [2]])                 # 3 is needed by no batch of the window
    assert a.evicted_rows.tolist() == [3]
    ix.complete(a.seq)
    b = admit(ix, [8], future=[[1], [9], [2, 7]])          # 7 and 2 at distance 3, 1 at 1: LFU among the farthest
    assert b.evicted_rows.tolist() == [7]


def test_rows_of_batches_in_flight_are_never_evicted():
    ix = CacheIndex("t", 10, 4, "lru")
    a = admit(ix, [1, 2])                                  # step i, still computing
    b = admit(ix, [3, 4])                                  # batch i+1, prefetched under it
    with pytest.raises(CacheCapacityError, match=r"table 't': a batch needs 1 distinct rows.*4 are pinned by 2 other"):
        admit(ix, [5])                                     # everything is pinned (the failed batch too)
    ix.complete(b.seq)                                     # completions in any order
    c = admit(ix, [5])
    assert c.evicted_rows.tolist() == [3]
    ix.complete(a.seq)


def test_cache_smaller_than_a_batch_is_a_clear_error():
    emb = TableBatchedEmbedding([TableConfig("t", 100, 4, placement="cached", cache_rows=3, cache_store="host")],
                                backend="cpu")
    batch = KeyedJaggedBatch.from_lists({"t": [[1, 2], [3, 4], [5]]})
    with pytest.raises(CacheCapacityError, match=r"table 't': a batch needs 5 distinct rows.*cache of 3 rows"):
        emb(batch)


def test_a_table_that_cannot_take_a_batch_leaves_the_others_unpinned():
    """Table b's cache is too small for the batch: the error names it, and table a's rows of that
    batch are released (before, they stayed pinned: load_state_dict refused, later batches found
    a's cache full of pinned slots; audit of 2026-11-30)."""
    tables = [TableConfig("a", 100, 4, placement="cached", cache_rows=10, cache_store="host"),
              TableConfig("b", 100, 4, placement="cached", cache_rows=3, cache_store="host")]
    emb = TableBatchedEmbedding(tables, backend="cpu")
    with pytest.raises(CacheCapacityError, match=r"table 'b': a batch needs 4 distinct rows"):
        emb(KeyedJaggedBatch.from_lists({"a": [[1], [2]], "b": [[1, 2], [3, 4]]}))
    assert emb._cache.in_flight == 0
    out = emb(KeyedJaggedBatch.from_lists({"a": [list(range(10, 15)), list(range(15, 20))], "b": [[1], [2]]}))
    with pytest.raises(RuntimeError) as e:                 # a batch in flight: that reason alone
        emb.load_state_dict(emb.state_dict())
    assert "1 prefetched batch(es) are in flight" in str(e.value) and "Unexpected key" not in str(e.value)
    out.sum().backward()                                   # a's 10 slots all free for it
    emb.load_state_dict(emb.state_dict())


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_batch_refilled_in_place_is_looked_up_anew(prefetch):
    """One batch object whose ids are overwritten in place every step (a loader reusing its
    buffers): the cached module reads the new ids, as the device one does (before, the rows of
    its first contents were memoized by the object's id: audit of 2026-11-30). The refills draw
    uniform ids (no hot rows), so the caches hold two whole batches (a prefetched one and the
    one refilled after it: at most 2 x 96 ids of table big, 2 x 48 of mean): with 60 rows, a
    refill of 61 distinct rows of big raised CacheCapacityError at --seed-shift 17."""
    dev = TableBatchedEmbedding(make_tables("adagrad", False), backend="cpu", seed=3)
    cached = TableBatchedEmbedding(make_tables("adagrad", True, cache_rows=200), backend="cpu", seed=3)
    gen = torch.Generator().manual_seed(7)
    batch = make_batch(gen)
    rows = {"big1": 500, "big2": 500, "mean": 300, "dev": 50}

    def refill():                                          # the same lengths, other ids, in place
        starts = batch.offset_per_key()
        for k, key in enumerate(batch.keys):
            lo, hi = starts[k], starts[k + 1]
            batch.values[lo:hi] = torch.randint(0, rows[key], (hi - lo,), generator=gen)

    for step in range(4):
        refill()
        if prefetch:
            cached.prefetch(batch)
            if step % 2:
                refill()                                   # refilled after its prefetch
        outs = [m(batch) for m in (dev, cached)]
        assert torch.equal(outs[0], outs[1]), f"step {step}"
        grad = torch.randn(outs[0].shape, generator=gen)
        for o in outs:
            (o * grad).sum().backward()
    assert_same_tables(dev, cached)
    assert cached._cache.in_flight == 0


def test_bad_ids_are_named_before_anything_moves():
    from neo.embedding import EmbeddingInputError

    emb = TableBatchedEmbedding([TableConfig("t", 100, 4, placement="cached", cache_rows=10, cache_store="host")],
                                backend="cpu")
    with pytest.raises(EmbeddingInputError, match=r"feature 't' \(table 't'\): id 100 at sample 1"):
        emb(KeyedJaggedBatch.from_lists({"t": [[1], [100]]}))
    assert emb.cache_stats()["t"].accesses == 0


def test_config_errors_name_the_table_and_numbers():
    with pytest.raises(ConfigError, match=r"table 't': cache_rows must be an integer in \[1, num_rows=10\], got 11"):
        TableConfig("t", 10, 4, placement="cached", cache_rows=11)
    with pytest.raises(ConfigError, match="table 't': give cache_rows .* or cache_load_factor"):
        TableConfig("t", 10, 4, placement="cached", cache_rows=5, cache_load_factor=0.5)
    with pytest.raises(ConfigError, match="placement is 'device'"):
        TableConfig("t", 10, 4, cache_rows=5)
    with pytest.raises(ConfigError, match=r"cache_policy: 'fifo' is not one of \['lru', 'lfu', 'lookahead'\]"):
        TableConfig("t", 10, 4, placement="cached", cache_policy="fifo")


def test_a_cache_holding_every_row_warns():
    with pytest.warns(UserWarning, match=r"table 't': its cache of 10 rows holds all 10 rows"):
        TableBatchedEmbedding([TableConfig("t", 10, 4, placement="cached", cache_load_factor=1.0,
                                           cache_store="host")])


def test_store_errors_name_the_table_path_and_bytes(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheStoreError, match=r"table 't': cannot create its backing file in .*a_file"):
        MmapStore("t", 1000, 8, torch.float32, [False], str(blocker / "sub"))

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(CacheStoreError, match=r"table 't': its backing file needs 64000 bytes \(0\.00 GiB\) but .* free"):
        MmapStore("t", 1000, 8, torch.float32, [False], str(tmp_path / "store"))
    assert os.listdir(tmp_path / "store") == []           # no half-written file left behind
    with pytest.raises(CacheStoreError, match=r"table 'big'.*mmap needs a directory"):
        TableBatchedEmbedding([TableConfig("big", 10, 4, placement="cached", cache_rows=5, cache_store="mmap")])


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_mmap_store_releases_the_pages_it_touched(tmp_path):
    store = MmapStore("t", 1 << 16, 256, torch.float32, [], str(tmp_path), trim_bytes=1 << 40)   # 64 MiB
    base = _rss_file_kib()
    store.write(torch.arange(1 << 16), torch.ones(1 << 16, 256), [])
    grown = _rss_file_kib()
    store.trim()
    assert grown - base > 32 * 1024 and _rss_file_kib() - base < 8 * 1024, (base, grown, _rss_file_kib())
    assert float(store.read(torch.tensor([5]))[0].sum()) == 256.0     # the data stayed


@pytest.mark.parametrize("trim_mib", [8, 1 << 20])
def test_an_mmap_store_keeps_its_initialized_pages_mapped_up_to_its_bound(tmp_path, trim_mib):
    """Initialization writes a 64 MiB store: under a larger trim_bytes its pages stay mapped (the
    training steps then read and write back rows with no page fault each); under 8 MiB the
    store's resident pages stay near that bound while it is written."""
    base = _rss_file_kib()
    store = MmapStore("t", 1 << 16, 256, torch.float32, [], str(tmp_path), trim_bytes=trim_mib << 20)
    store.initialize(TableRegion.whole("t", 1 << 16, 256), 0, 0.1, [])
    grown = _rss_file_kib() - base
    if trim_mib == 8:
        assert grown < 3 * 8 * 1024, grown                  # one init chunk (16 MiB) past the bound at most
    else:
        assert grown > 56 * 1024, grown
    assert abs(float(store.read(torch.tensor([7]))[0].abs().max()) - 0.1) < 0.01      # the data is there


def test_an_mmap_store_does_not_trim_at_every_access_when_other_mappings_grow(tmp_path, monkeypatch):
    """Other file-backed memory (a data file read through mmap) counts once against the store's
    trim_bytes: after a trim the store measures from there (before, every later access trimmed
    the whole mapping: audit of 2026-11-30)."""
    import mmap as mmap_module

    store = MmapStore("t", 1 << 12, 64, torch.float32, [], str(tmp_path), trim_bytes=8 << 20)
    other = tmp_path / "data.bin"
    other.write_bytes(b"\1" * (32 << 20))
    with open(other, "rb") as f:
        mapped = mmap_module.mmap(f.fileno(), 0, prot=mmap_module.PROT_READ)
        _ = sum(mapped[i] for i in range(0, len(mapped), mmap_module.PAGESIZE))     # 32 MiB resident, not ours
        trims = []
        monkeypatch.setattr(store, "trim", lambda real=store.trim: trims.append(1) or real())
        for k in range(20):
            store.read(torch.tensor([k]))
        mapped.close()
    assert len(trims) <= 1, len(trims)


def test_stats_reconcile_and_flush_writes_every_dirty_row():
    dev, cached, _ = train_pair("sgd", "cpu", steps=8)
    s = cached.cache_stats()["big"]
    row_bytes = cached._cache.caches["big"].store.row_bytes
    assert s.accesses == s.hits + s.misses and s.evictions <= s.misses
    assert s.bytes_in == s.misses * row_bytes and s.bytes_out == s.writebacks * row_bytes
    dirty = int(cached._cache.caches["big"].dirty.sum())
    assert cached.flush_cache() >= dirty > 0
    assert int(cached._cache.caches["big"].dirty.sum()) == 0


def test_cached_tables_look_up_under_inference_mode():
    """Tensors made under torch.inference_mode keep no version counter (the batch stamp reads it):
    a cached module serves there as a device one does (review of 2026-11-30)."""
    dev = TableBatchedEmbedding(make_tables("sgd", False), backend="cpu", seed=3)
    cached = TableBatchedEmbedding(make_tables("sgd", True), backend="cpu", seed=3)
    with torch.inference_mode():
        batch = make_batch(torch.Generator().manual_seed(2))
        cached.prefetch(batch)
        assert torch.equal(cached(batch), dev(batch))
        assert torch.equal(cached(batch), dev(batch))          # not prefetched: done there and then
    assert cached._cache.in_flight == 0


def test_prefetch_takes_the_batch_objects_the_steps_look_up():
    """A torchrec KeyedJaggedTensor would be converted anew by the lookup and its prefetch never
    taken (rows left pinned): refused with the way to do it (before: an AttributeError)."""
    torchrec = pytest.importorskip("torchrec")
    m = TableBatchedEmbedding(make_tables("sgd", True), backend="cpu", seed=3)
    batch = make_batch(torch.Generator().manual_seed(1))
    with pytest.raises(TypeError, match=r"convert a torchrec KeyedJaggedTensor once with neo\.sparse\.as_batch"):
        m.prefetch(batch.to_torchrec())
    assert isinstance(batch.to_torchrec(), torchrec.KeyedJaggedTensor)
    m.prefetch(batch)
    m(batch).sum().backward()
    assert m._cache.in_flight == 0
