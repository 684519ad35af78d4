"""Hierarchical sharding: a table's shards on the ranks of ONE node (Neo paper, Sec. 4.1-4.2).

Ranks are node-major (``rank = node * L + local``). The pooled results of a node's shards
are first combined inside the node (fast links), so that only one ``(B, D)`` block per
destination rank crosses nodes, from the peer with the same local index:

table_row_wise (row shards on the L ranks of node n)
    1. intra-node ReduceScatter (sum) of the ``(W * B, D_n)`` partial sums, rows ordered
       ``(local j, node m, sample b)``: local rank j receives the complete pooled vectors
       of the samples of ranks ``(m, j)`` for every node m: ``(nodes * B, D_n)``;
    2. cross-node AlltoAll among the ranks with local index j: block m goes to rank (m, j).
    Backward: cross-node AlltoAll reversed, then intra-node AllGather. Mean pooling divides
    by the full bag length at the end.

table_column_wise (column shards on ranks of node n)
    1. intra-node AlltoAll: shard owner (n, i) sends local rank j the ``(nodes * B, cols_i)``
       rows of ranks ``(m, j)``; j concatenates the slices: ``(nodes * B, D_n)``;
    2. cross-node AlltoAll as above. Backward: both AlltoAlls reversed.

``D_n`` = columns of the node's tables of this type. Output columns: node-major.
"""

from __future__ import annotations

import torch

from neo.distributed.comms import Awaitable, BackwardOrder, CommConfig, all_to_all_pooled, reduce_scatter_pooled
from neo.distributed.input_dist import DistributedBatch
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding import Pieces, as_pieces
from neo.distributed.sharding.row_wise import MeanDivider, feature_columns, place_columns, scatter_columns
from neo.distributed.slots import SlotLayout

__all__ = ["TableRowWiseOutputDist", "TableColumnWiseOutputDist"]


def _to_local_major(x: torch.Tensor, nodes: int, L: int, B: int) -> torch.Tensor:
    """Rows (node m, local j, b) -> (local j, node m, b)."""
    return x.view(nodes, L, B, x.shape[-1]).transpose(0, 1).reshape(nodes * L * B, x.shape[-1])


class _CrossNode:
    """Stage 2: rank (n, j) holds (nodes * B, D_n) for ranks (m, j); AlltoAll over the cross group."""

    def __init__(self, pg: ProcessGroups, node_widths, comm: CommConfig, name: str):
        self.pg, self.node_widths, self.comm, self.name = pg, list(node_widths), comm, name

    def __call__(self, y: torch.Tensor, B: int, order: BackwardOrder) -> Pieces:
        nodes, mine = self.pg.num_nodes, self.node_widths[self.pg.node]
        out_splits = [B * w for w in self.node_widths]
        flat = all_to_all_pooled(y.reshape(-1), out_splits, [B * mine] * nodes, self.pg.cross_comm,
                                 self.comm, order, name=f"{self.name}.cross").wait()
        return flat, self.node_widths                                      # node m's (B, D_m), m = 0..nodes-1


class TableRowWiseOutputDist:
    def __init__(self, layout: SlotLayout, pg: ProcessGroups, comm: CommConfig):
        self.pg, self.comm = pg, comm
        types = (ShardingType.TABLE_ROW_WISE,)
        L, nodes = pg.local_world_size, pg.num_nodes
        feats = layout.features_of(types)
        node_of = {t: layout.plan.tables[t].shards[0].rank // L for t in layout.plan.tables}
        self.node_features = [[f for f in feats if node_of[layout.feature_table[f].name] == m] for m in range(nodes)]
        mine = self.node_features[pg.node]
        local_cols, self.target_cols, self.width = scatter_columns(layout, pg.rank, types, mine)
        self.local_width = len(local_cols)
        widths = [sum(layout.feature_table[f].dim for f in fs) for fs in self.node_features]
        self.cross = _CrossNode(pg, widths, comm, "table_row_wise")
        ordered = [f for fs in self.node_features for f in fs]
        self.global_columns = feature_columns(layout, ordered)
        self.divide = MeanDivider(layout, ordered)

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        B, L, nodes = batch.batch_size, self.pg.local_world_size, self.pg.num_nodes
        if self.width:
            buf = place_columns(x, self.target_cols, self.width)                      # (W * B, D_n)
            stage1 = reduce_scatter_pooled(_to_local_major(buf, nodes, L, B), self.pg.intra_comm, self.comm, order,
                                           name="table_row_wise.intra")                  # -> (nodes * B, D_n)
        else:
            stage1 = Awaitable.ready(x.new_zeros(nodes * B, 0))
        return stage1.then(lambda y: self._finish(self.cross(y, B, order), batch))

    def _finish(self, pieces: Pieces, batch: DistributedBatch) -> Pieces:
        if not self.divide.spans:
            return pieces
        flat, widths = pieces
        B = batch.batch_size
        y = torch.cat([p.view(B, w) for p, w in zip(torch.split(flat, [B * w for w in widths]), widths)], dim=1)
        return as_pieces(self.divide(y, batch))


class TableColumnWiseOutputDist:
    def __init__(self, layout: SlotLayout, pg: ProcessGroups, comm: CommConfig):
        self.pg, self.comm = pg, comm
        types = (ShardingType.TABLE_COLUMN_WISE,)
        L, nodes = pg.local_world_size, pg.num_nodes
        self.local_width = len(layout.slot_columns(pg.rank, types))
        rank_width = [sum(s.cols for s in layout.slots_on[r] if s.sharding_type in types) for r in range(pg.world_size)]
        self.local_widths = rank_width[pg.node * L:(pg.node + 1) * L]                  # widths of my node's ranks
        widths = [sum(rank_width[m * L:(m + 1) * L]) for m in range(nodes)]
        self.cross = _CrossNode(pg, widths, comm, "table_column_wise")
        self.global_columns = [c for r in range(pg.world_size) for s in layout.slots_on[r]
                               if s.sharding_type in types for c in layout.global_columns(s)]

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        B, L, nodes = batch.batch_size, self.pg.local_world_size, self.pg.num_nodes
        if sum(self.local_widths):                                                       # x: (W * B, Dl)
            mine = x.shape[1]
            out_splits = [nodes * B * w for w in self.local_widths]
            stage1 = all_to_all_pooled(_to_local_major(x, nodes, L, B).reshape(-1), out_splits,
                                       [nodes * B * mine] * L, self.pg.intra_comm, self.comm, order,
                                       name="table_column_wise.intra")

            def gather(flat: torch.Tensor) -> torch.Tensor:
                pieces = torch.split(flat, out_splits)
                return torch.cat([p.view(nodes * B, w) for p, w in zip(pieces, self.local_widths)], dim=1)

            stage1 = stage1.then(gather)                                                # (nodes * B, D_n)
        else:
            stage1 = Awaitable.ready(x.new_zeros(nodes * B, 0))
        return stage1.then(lambda y: self.cross(y, B, order))
