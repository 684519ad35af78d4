"""Static layout of a sharded collection: which (shard, feature) *slots* live on which rank.

A slot is one feature of one shard: the unit that input distribution routes ids to and
that the local table-batched module pools. Every rank computes the same layout from the
plan, so it knows what every other rank holds without communicating.

Worked example: table ``t`` (100 rows, D 16, features ``a``, ``b``) row-wise on 2 ranks,
table ``u`` (10 rows, D 8, feature ``u``) table-wise on rank 1::

    slots_on[0] = [t#0/a (rows 0..49), t#0/b (rows 0..49)]
    slots_on[1] = [u#0/u, t#1/a (rows 50..99), t#1/b (rows 50..99)]
    local module of rank 1: tables u#0 (10 x 8, feature u#0) and t#1 (50 x 16, features a#1, b#1);
    its pooled output (W * B, 8 + 16 + 16): columns of u#0, a#1, b#1 (the local slot order:
    by output distribution (OUTPUT_GROUP: table-wise before row-wise), then table order)
    global output columns (B, 40): a 0..15, b 16..31, u 32..39 (table order, then feature order)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence

import torch

from neo.config.embedding import PoolingMode, TableConfig
from neo.distributed.plan_view import PlanView, ShardingType
from neo.embedding.init import TableRegion

__all__ = ["Slot", "SlotLayout", "OUTPUT_GROUP"]

OUTPUT_GROUP = {t: t.output_group for t in ShardingType}
"""Output distribution of each sharding type (``ShardingType.output_group``); a rank's slots are
ordered by it, then by table."""


@dataclass(frozen=True)
class Slot:
    """One feature of one shard, on one rank."""

    table: str
    feature: str
    sharding_type: ShardingType
    shard: int
    """Index of the shard among its table's shards."""
    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    table_rows: int
    """Rows of the full table (ids are checked against it at the source)."""
    mean: bool
    """The table pools by mean (row-split slots pool by sum and divide after the reduce)."""

    @property
    def local_feature(self) -> str:
        return f"{self.feature}#{self.shard}"

    @property
    def local_table(self) -> str:
        return f"{self.table}#{self.shard}"

    @property
    def full_rows(self) -> bool:
        return self.row_offset == 0 and self.rows == self.table_rows


class SlotLayout:
    """Slots of every rank, local shard tables, and global output columns (see module doc)."""

    def __init__(self, tables: Sequence[TableConfig], plan: PlanView):
        self.tables = list(tables)
        self.plan = plan
        W = plan.world_size
        self.features: List[str] = [f for t in self.tables for f in t.feature_names]
        self.feature_table: Dict[str, TableConfig] = {f: t for t in self.tables for f in t.feature_names}
        self.feature_offset: Dict[str, int] = {}
        acc = 0
        for f in self.features:
            self.feature_offset[f] = acc
            acc += self.feature_table[f].dim
        self.output_dim = acc
        # per rank: (output group, table index, shard) -> (shard table, its slots); sorted so that
        # each output distribution's columns are contiguous in the local pooled output
        per_rank: List[list] = [[] for _ in range(W)]
        for ti, t in enumerate(self.tables):
            tp = plan.tables[t.name]
            for k, s in enumerate(tp.shards):
                slots = [Slot(t.name, f, tp.sharding_type, k, s.rank, s.row_offset, s.rows, s.col_offset, s.cols,
                              t.num_rows, t.pooling is PoolingMode.MEAN) for f in t.feature_names]
                key = (OUTPUT_GROUP[tp.sharding_type], ti, k)
                region = TableRegion(t.name, t.num_rows, t.dim, s.row_offset, s.rows, s.col_offset, s.cols)
                per_rank[s.rank].append((key, self._shard_table(t, tp.sharding_type, k, s.rows, s.cols), slots,
                                         region))
        self.slots_on: List[List[Slot]] = []
        self.shard_tables_on: List[List[TableConfig]] = []
        self.regions_on: List[Dict[str, TableRegion]] = []
        """Per rank: where each shard table sits in its table (its initial values are those rows and
        columns of the table's, :mod:`neo.embedding.init`)."""
        for entries in per_rank:
            entries.sort(key=lambda e: e[0])
            self.shard_tables_on.append([e[1] for e in entries])
            self.slots_on.append([s for e in entries for s in e[2]])
            self.regions_on.append({e[1].name: e[3] for e in entries})

    @staticmethod
    def _shard_table(t: TableConfig, st: ShardingType, k: int, rows: int, cols: int) -> TableConfig:
        """A shard is a smaller table: rows re-based to 0, its columns only. A cached table's
        shard caches the same share of its rows (``cache_rows`` scaled by the shard's rows)."""
        cache_rows = t.cache_rows
        if cache_rows is not None:
            cache_rows = max(1, min(rows, -(-cache_rows * rows // t.num_rows)))
        return replace(
            t, name=f"{t.name}#{k}", num_rows=rows, dim=cols,
            feature_names=tuple(f"{f}#{k}" for f in t.feature_names),
            pooling=PoolingMode.SUM if st.splits_rows else t.pooling,
            init_scale=t.init_scale if t.init_scale is not None else t.num_rows ** -0.5,
            cache_rows=cache_rows,
        )

    def slots_of_feature(self, feature: str) -> List[Slot]:
        """Every rank's slots of ``feature`` (one per shard of its table), in rank then slot order."""
        return [s for slots in self.slots_on for s in slots if s.feature == feature]

    def local_columns(self, rank: int) -> List[int]:
        """Start column of each of ``rank``'s slots in its local pooled output (plus the end)."""
        out, acc = [], 0
        for s in self.slots_on[rank]:
            out.append(acc)
            acc += s.cols
        return out + [acc]

    def slot_columns(self, rank: int, types: Sequence[ShardingType]) -> torch.Tensor:
        """Columns of the local pooled output of ``rank`` held by its slots of ``types``, in slot order."""
        starts = self.local_columns(rank)
        cols = [torch.arange(starts[i], starts[i] + s.cols)
                for i, s in enumerate(self.slots_on[rank]) if s.sharding_type in types]
        return torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)

    def global_columns(self, slot: Slot) -> List[int]:
        """Columns of the global output (B, output_dim) a slot's pooled columns belong to."""
        c0 = self.feature_offset[slot.feature] + slot.col_offset
        return list(range(c0, c0 + slot.cols))

    def features_of(self, types: Sequence[ShardingType]) -> List[str]:
        """Features (global order) whose table has one of ``types``."""
        return [f for f in self.features if self.plan.tables[self.feature_table[f].name].sharding_type in types]
