"""Initial table values independent of grouping, order, splits and placement (neo.embedding.init).

The oracle for a region is the whole table drawn by fill_rows and sliced with plain
indexing; the whole table itself is checked against a from-scratch draw of its blocks.
"""

from __future__ import annotations

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.embedding.init import INIT_BLOCK_COLS, INIT_BLOCK_ROWS, TableRegion, block_seed, fill_rows

ROWS, DIM = 2 * INIT_BLOCK_ROWS + 123, INIT_BLOCK_COLS + 8      # 3 x 2 blocks, the last row and column short


def whole(name="t", rows=ROWS, dim=DIM, seed=5, scale=0.25) -> torch.Tensor:
    out = torch.empty(rows, dim)
    fill_rows(out, TableRegion.whole(name, rows, dim), seed, scale)
    return out


def test_a_whole_table_is_its_blocks_drawn_from_their_own_seeds():
    got = whole()
    rows = []
    for k, r0 in enumerate(range(0, ROWS, INIT_BLOCK_ROWS)):
        n = min(INIT_BLOCK_ROWS, ROWS - r0)
        row = []
        for j, c0 in enumerate(range(0, DIM, INIT_BLOCK_COLS)):
            g = torch.Generator().manual_seed(block_seed(5, "t", k, j))
            row.append(torch.rand(n, min(INIT_BLOCK_COLS, DIM - c0), generator=g) * 0.5 - 0.25)
        rows.append(torch.cat(row, dim=1))
    # torch.rand's affine map differs from uniform_(-s, s) in the last bit only
    torch.testing.assert_close(got, torch.cat(rows), rtol=0, atol=1e-7)
    assert got.abs().max() <= 0.25 and got.min() < -0.24 and got.max() > 0.24
    assert abs(float(got.mean())) < 0.01
    assert not torch.equal(got[:INIT_BLOCK_ROWS, :8], got[INIT_BLOCK_ROWS: 2 * INIT_BLOCK_ROWS, :8])
    assert not torch.equal(got[:INIT_BLOCK_ROWS, :8], got[:INIT_BLOCK_ROWS, INIT_BLOCK_COLS:])


@pytest.mark.parametrize("r0,rows,c0,cols", [
    (0, ROWS, 0, DIM), (0, 10, 0, DIM), (INIT_BLOCK_ROWS - 3, 7, 2, 5), (INIT_BLOCK_ROWS, INIT_BLOCK_ROWS, 0, DIM),
    (17, ROWS - 20, 11, 1), (ROWS - 1, 1, 0, 6), (5, 2 * INIT_BLOCK_ROWS, 6, 6), (9, 5000, 30, 4),
    (0, ROWS, INIT_BLOCK_COLS, 8), (100, 300, 28, 12),
])
def test_a_region_is_the_whole_tables_rows_and_columns(r0, rows, c0, cols):
    region = TableRegion("t", ROWS, DIM, r0, rows, c0, cols)
    out = torch.empty(rows, cols)
    fill_rows(out, region, 5, 0.25)
    assert torch.equal(out, whole()[r0:r0 + rows, c0:c0 + cols])


def test_chunks_of_a_region_are_its_rows():
    region = TableRegion("t", ROWS, DIM, 100, ROWS - 200, 3, 34)
    out = torch.empty(region.rows, region.cols)
    fill_rows(out, region, 5, 0.25)
    cuts = [0, 1, 999, INIT_BLOCK_ROWS - 100, INIT_BLOCK_ROWS - 99, 7000, region.rows]
    for a, b in zip(cuts, cuts[1:]):
        part = torch.empty(b - a, region.cols)
        fill_rows(part, region, 5, 0.25, start=a)
        assert torch.equal(part, out[a:b]), (a, b)


def test_the_seed_and_the_name_choose_the_values():
    base = whole()
    assert not torch.equal(base, whole(seed=6))
    assert not torch.equal(base, whole(name="u"))
    assert torch.equal(base, whole())
    assert block_seed(5, "t", 1, 0) == block_seed(5, "t", 1, 0) != block_seed(5, "t", 2, 0) != block_seed(5, "t", 2, 1)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_values_do_not_depend_on_the_threads(threads):
    region = TableRegion("t", ROWS, DIM, 7, ROWS - 9, 5, 33)
    out = torch.empty(region.rows, region.cols)
    fill_rows(out, region, 5, 0.25, threads=threads)
    assert torch.equal(out, whole()[7:ROWS - 2, 5:38])


def test_bad_regions_and_outputs_are_named():
    with pytest.raises(ValueError, match="table 't'.*not inside"):
        TableRegion("t", 10, 4, 8, 3, 0, 4)
    with pytest.raises(ValueError, match="table 't'.*not inside"):
        TableRegion("t", 10, 4, 0, 10, 2, 3)
    region = TableRegion.whole("t", 10, 4)
    with pytest.raises(ValueError, match="table 't'.*float32"):
        fill_rows(torch.empty(10, 4, dtype=torch.float16), region, 0, 0.1)
    with pytest.raises(ValueError, match="table 't'.*outside"):
        fill_rows(torch.empty(4, 4), region, 0, 0.1, start=8)


def _tables(order, dtype="fp32"):
    specs = {"a": (ROWS, 40, "sgd"), "b": (300, 16, "adagrad"), "c": (INIT_BLOCK_ROWS + 1, 8, "sgd")}
    return [TableConfig(n, specs[n][0], specs[n][1], feature_names=(n,), dtype=dtype,
                        optimizer=OptimizerConfig(specs[n][2], lr=0.1)) for n in order]


def test_a_table_starts_alike_alone_grouped_and_in_any_order():
    together = TableBatchedEmbedding(_tables("abc"), backend="reference", seed=3)
    reordered = TableBatchedEmbedding(_tables("cba"), backend="reference", seed=3)
    for t in _tables("abc"):
        alone = TableBatchedEmbedding([t], backend="reference", seed=3)
        expected = whole(t.name, t.num_rows, t.dim, seed=3, scale=t.num_rows ** -0.5)
        assert torch.equal(alone.table_weight(t.name), expected), t.name
        assert torch.equal(together.table_weight(t.name), expected), t.name
        assert torch.equal(reordered.table_weight(t.name), expected), t.name


def test_fp16_tables_start_at_the_fp32_values_rounded():
    half = TableBatchedEmbedding(_tables("ab", dtype="fp16"), backend="reference", seed=3)
    for t in _tables("ab"):
        expected = whole(t.name, t.num_rows, t.dim, seed=3, scale=t.num_rows ** -0.5).half()
        assert torch.equal(half.table_weight(t.name).to(torch.float16), expected)


def test_a_shard_table_starts_at_its_region_of_the_table():
    t = _tables("a")[0]
    shard = TableConfig("a#1", 5000, 4, feature_names=("a#1",), init_scale=t.num_rows ** -0.5,
                        optimizer=t.optimizer)
    region = TableRegion("a", t.num_rows, t.dim, 3000, 5000, 30, 4)
    emb = TableBatchedEmbedding([shard], backend="reference", seed=3, regions={"a#1": region})
    full = TableBatchedEmbedding([t], backend="reference", seed=3).table_weight("a")
    assert torch.equal(emb.table_weight("a#1"), full[3000:8000, 30:34])
    with pytest.raises(ValueError, match="regions: table 'a#1' is 5000 x 4, but its region of 'a' is 5000 x 8"):
        TableBatchedEmbedding([shard], backend="reference", regions={"a#1": TableRegion("a", ROWS, 8, 0, 5000, 0, 8)})
    with pytest.raises(ValueError, match="regions: no table 'zz'"):
        TableBatchedEmbedding([shard], backend="reference", regions={"zz": region})


@pytest.mark.parametrize("store", ["host", "mmap"])
def test_a_cached_table_starts_at_the_values_of_one_in_memory(tmp_path, store):
    t = _tables("a")[0]
    from dataclasses import replace
    cached = replace(t, placement="cached", cache_rows=512, cache_store=store)
    emb = TableBatchedEmbedding([cached], backend="reference", seed=3, store_dir=str(tmp_path))
    mem = TableBatchedEmbedding([t], backend="reference", seed=3)
    assert torch.equal(emb.table_weight("a"), mem.table_weight("a"))
