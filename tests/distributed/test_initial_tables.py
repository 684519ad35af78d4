"""A sharded model starts at the unsharded model's tables, under any plan and world size.

Tables of several init blocks (neo.embedding.init.INIT_BLOCK_ROWS) so that row shards start
and end inside blocks; one of them cached on a memory-mapped store. Oracle: the unsharded
TableBatchedEmbedding with the same seed, in the pytest process. The shards are gathered
with ``full_weights`` (an AllReduce of zero-padded shards) and compared bit for bit.
"""

from __future__ import annotations

import datetime
from dataclasses import replace

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.embedding import TableBatchedEmbedding
from neo.embedding.init import INIT_BLOCK_ROWS
from tests.multiprocess import run_multiprocess

SEED = 11


def _tables():
    ada = OptimizerConfig("adagrad", lr=0.1)
    rows = [2 * INIT_BLOCK_ROWS + 301, INIT_BLOCK_ROWS + 7, 3 * INIT_BLOCK_ROWS - 5, 900, 1500, 2 * INIT_BLOCK_ROWS + 1]
    dims = [16, 48, 8, 8, 16, 8]           # t1 split by columns across a column block's edge (32)
    out = [TableConfig(f"t{i}", r, d, feature_names=(f"f{i}",), optimizer=ada) for i, (r, d) in enumerate(zip(rows, dims))]
    out[5] = replace(out[5], placement="cached", cache_rows=700, cache_store="mmap")
    out[3] = replace(out[3], dtype="fp16")
    return out


PLANS = {
    "row and column": {"t0": "row_wise", "t1": "column_wise", "t2": "row_wise", "t3": "table_wise",
                       "t4": "data_parallel", "t5": "row_wise"},
    "by node": {"t0": "table_row_wise", "t1": "table_column_wise", "t2": "column_wise", "t3": "row_wise",
                "t4": "table_wise", "t5": "table_wise"},
}


def _initial(rank, world_size, local_world_size, plan_name, store_dir):
    pg = ProcessGroups.build(local_world_size, timeout=datetime.timedelta(seconds=60))
    ts = _tables()
    sec = ShardedEmbeddingCollection(ts, even_plan(ts, PLANS[plan_name], world_size, local_world_size), pg,
                                     backend="auto", seed=SEED, store_dir=f"{store_dir}/rank{rank}")
    return sec.full_weights()


@pytest.mark.parametrize("world_size,local_world_size,plan_name", [
    (2, 2, "row and column"), (4, 2, "row and column"), (4, 2, "by node"),
])
def test_every_plan_starts_at_the_unsharded_tables(tmp_path, world_size, local_world_size, plan_name):
    got = run_multiprocess(_initial, world_size, local_world_size, plan_name, str(tmp_path), timeout_s=120)
    ref = TableBatchedEmbedding(_tables(), backend="reference", seed=SEED, store_dir=str(tmp_path))
    for t in _tables():
        expected = ref.table_weight(t.name).to(torch.float32)
        for r, per_rank in enumerate(got):
            assert torch.equal(per_rank[t.name], expected), f"{plan_name}, W {world_size}: table {t.name} on rank {r}"
