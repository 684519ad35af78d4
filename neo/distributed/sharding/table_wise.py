"""Table-wise sharding: each table lives whole on one rank (Neo paper, Sec. 4.1).

Forward: the owner pools the table's bags for all ``W * B`` samples (input distribution
sent it every rank's ids); one AlltoAll sends each rank the ``(B, D)`` rows of its own
samples. Backward: the AlltoAll with the splits swapped brings each owner the gradients
of every rank's samples, which feed its fused optimizer.

:class:`AllToAllOutputDist` serves any slots whose shards hold full rows (table_wise and
column_wise): it moves whatever columns each rank holds, and ``global_columns`` says where
each lands, so column slices of one table are concatenated back by the final column
permutation of the sharded collection.

Shapes (rank ``me``, ``Dl`` = its columns of these types, ``D_r`` = rank r's)::

    x                             (W * B, Dl)   rows s*B .. (s+1)*B-1 belong to rank s
    sent flat to rank s           (B * Dl,)
    received from rank r          (B * D_r,) -> (B, D_r)
    output (pieces)               (B, D_0), (B, D_1), ... back to back: rank-major, then slot order
"""

from __future__ import annotations

from typing import Sequence

import torch

from neo.distributed.comms import Awaitable, BackwardOrder, CommConfig, all_to_all_pooled
from neo.distributed.input_dist import DistributedBatch
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding import Pieces
from neo.distributed.slots import SlotLayout

__all__ = ["AllToAllOutputDist", "table_wise_output_dist"]


class AllToAllOutputDist:
    """AlltoAll of pooled rows for full-row shards (table_wise, column_wise)."""

    def __init__(self, layout: SlotLayout, pg: ProcessGroups, types: Sequence[ShardingType], comm: CommConfig,
                 name: str = "table_wise"):
        self.pg, self.comm, self.name = pg, comm, name
        self.types = tuple(types)
        W, me = pg.world_size, pg.rank
        self.local_width = len(layout.slot_columns(me, self.types))
        self.widths = [sum(s.cols for s in layout.slots_on[r] if s.sharding_type in self.types) for r in range(W)]
        self.global_columns = [c for r in range(W) for s in layout.slots_on[r] if s.sharding_type in self.types
                               for c in layout.global_columns(s)]

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        """``x``: (W * B, Dl), this rank's columns of these types (contiguous in the local output)."""
        B, W, me = batch.batch_size, self.pg.world_size, self.pg.rank
        out_splits = [B * w for w in self.widths]
        aw = all_to_all_pooled(x.reshape(-1), out_splits, [B * self.widths[me]] * W, self.pg.world_comm,
                               self.comm, order, name=f"{self.name}.all_to_all", consume=True)
        return aw.then(lambda flat: (flat, self.widths))                   # rank r's (B, D_r) block, r = 0..W-1


def table_wise_output_dist(layout: SlotLayout, pg: ProcessGroups, comm: CommConfig) -> AllToAllOutputDist:
    return AllToAllOutputDist(layout, pg, (ShardingType.TABLE_WISE,), comm, name="table_wise")
