"""MLPerf multi-hot: bit-identical to the reference method; conversion of one-hot Parquet."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.multihot import MultiHotOptions, MultiHotTables, convert_to_multihot
from data_pipeline.schema import MLPERF_MULTI_HOT_SIZES, MLPERF_TABLE_SIZES, DatasetMeta, sparse_names
from data_pipeline.writer import Columns, ShardWriter, WriterOptions

SIZES = [3, 1, 5, 2]
ROWS = [1000, 7, 40000, 3]


def reference_tables(rows, sizes, seed=0):
    """The MLPerf reference's construction, written out independently: one global legacy stream,
    table after table, column 0 = the id itself."""
    np.random.seed(seed)
    out = []
    for n, k in zip(rows, sizes):
        ids = np.arange(n)[:, None]
        extra = np.random.randint(0, n, size=(n, k - 1))
        out.append(np.concatenate([ids, extra], axis=-1))
    return out


def test_mlperf_constants():
    assert len(MLPERF_MULTI_HOT_SIZES) == len(MLPERF_TABLE_SIZES) == 26
    assert sum(MLPERF_MULTI_HOT_SIZES) == 214 and MLPERF_TABLE_SIZES[0] == 40000000


@pytest.mark.parametrize("chunk", [1 << 20, 333])
def test_bit_identical_to_reference(tmp_path, chunk):
    ref = reference_tables(ROWS, SIZES)
    in_mem = MultiHotTables(MultiHotOptions(sizes=SIZES, table_sizes=ROWS, chunk_rows=chunk))
    on_disk = MultiHotTables(MultiHotOptions(sizes=SIZES, table_sizes=ROWS, chunk_rows=chunk,
                                             cache_dir=str(tmp_path), memory_limit_bytes=0))
    again = MultiHotTables(MultiHotOptions(sizes=SIZES, table_sizes=ROWS, cache_dir=str(tmp_path),
                                           memory_limit_bytes=0))  # reuses the cache
    rng = np.random.default_rng(0)
    for f, (n, k) in enumerate(zip(ROWS, SIZES)):
        ids = rng.integers(0, 10 * n, 500)  # folded modulo n, like MLPerf's hashes
        want = ref[f][ids % n]
        for t in (in_mem, on_disk, again):
            got = t.expand(f, ids)
            assert got.shape == (500, k) and got.dtype == np.int64
            np.testing.assert_array_equal(got, want)


def test_convert_parquet(tmp_path):
    n = 1000
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, r, n) for r in ROWS]
    meta = DatasetMeta(num_dense=3, sparse_names=sparse_names(4), source="criteo")
    w = ShardWriter(str(tmp_path / "one"), meta, "onehot", WriterOptions(row_group_rows=300))
    w.write(Columns(np.zeros(n, np.int8), np.ones((n, 3), np.float32), ids))
    w.close()
    s = convert_to_multihot(str(tmp_path / "one"), str(tmp_path / "multi"),
                            MultiHotOptions(sizes=SIZES, table_sizes=ROWS), WriterOptions(row_group_rows=256))
    assert s["rows"] == n
    ref = reference_tables(ROWS, SIZES)
    L = ParquetLoader(str(tmp_path / "multi"), LoaderOptions(batch_size=128))
    assert L.meta.multi_hot_sizes == SIZES and L.meta.source == "multihot"
    start = 0
    for b in L:
        b.sparse.check()
        B = b.batch_size
        assert b.sparse.length_per_key() == [B * k for k in SIZES]
        for f in range(4):
            v, lengths, _ = b.sparse.feature(f"cat_{f}")
            np.testing.assert_array_equal(v.numpy().reshape(B, SIZES[f]), ref[f][ids[f][start:start + B]])
        start += B
    assert start == n
