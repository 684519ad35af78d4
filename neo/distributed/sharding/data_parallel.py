"""Data-parallel tables: a full replica on every rank (Neo paper, Sec. 4.1).

Gradient semantics. The fused optimizer must see the global-batch gradient, exactly as in
single-process training (for adagrad/adam the aggregated row gradient matters, not only
its sum over steps), and every replica must apply the same update. Neo therefore:

1. sends each DP feature's ids to every rank in input distribution (they ride the same
   ids AlltoAll), so every replica holds the ids of the whole global batch;
2. forward: each replica pools only its own B samples (``TableBatchedEmbedding(...,
   pooled_bags=...)``: the other ranks' bags are left out of the lookup) and keeps those rows
   (no communication);
3. backward: an AllGather of the ``(B, D)`` pooled gradients gives every replica the
   gradient of all ``W * B`` samples; the fused backward sums them per row over every bag of
   the global batch and updates.

The gradient reduction is thus a SUM over ranks of per-sample gradients, each already
scaled by the collection's ``1 / W`` (mean-loss semantics, see the sharded collection):
the result equals the unsharded module's update for the global-mean loss, and replicas
stay bit-identical (same inputs, same order). Cost: each replica's forward looks up its own
batch; its fused update covers the global batch's rows (the alternative, an AllReduce of a
dense (rows, D) gradient, touches every row).
"""

from __future__ import annotations

import torch

from neo.distributed.comms import Awaitable, BackwardOrder, CommConfig, slice_local_pooled
from neo.distributed.input_dist import DistributedBatch
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding import Pieces, as_pieces
from neo.distributed.slots import SlotLayout

__all__ = ["DataParallelOutputDist"]


class DataParallelOutputDist:
    def __init__(self, layout: SlotLayout, pg: ProcessGroups, comm: CommConfig):
        self.pg, self.comm = pg, comm
        types = (ShardingType.DATA_PARALLEL,)
        self.local_width = len(layout.slot_columns(pg.rank, types))
        self.global_columns = [c for s in layout.slots_on[pg.rank] if s.sharding_type in types
                               for c in layout.global_columns(s)]

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        """``x``: (W * B, D_dp), the replicas' pooled columns for every sample."""
        return slice_local_pooled(x, self.pg.world_comm, self.comm, order, name="data_parallel").then(as_pieces)
