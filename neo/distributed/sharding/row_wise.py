"""Row-wise sharding: a table's rows split into ranges across all ranks (Neo paper, Sec. 4.1).

Input distribution bucketizes each id by row range and re-bases it to its shard. Each
shard pools, by SUM, the ids of the whole global batch that fall in its range: a partial
sum for every one of the ``W * B`` samples. Output distribution is a ReduceScatter (sum)
over the world: rank r receives the complete pooled vectors of its own B samples. Mean
pooling divides by the full bag length (this rank's own lengths) after the reduce.
Backward: AllGather of the gradient (each shard needs the gradient of every sample), then
each shard's fused optimizer updates its rows.

Works on gloo (CPU), which TorchRec does not offer: gloo in torch 2.13 does support
reduce_scatter_single, but an AlltoAll of the partial sums plus a local fp32 sum measured
twice as fast at W = 4, so that is what runs on gloo (and for 16-bit payloads everywhere);
NCCL uses reduce_scatter_single.

Shapes::

    buffer     (W * B, D_rw)  columns: every row_wise feature (global order), zeros where
                              this rank holds no shard of the table
    output     (B, D_rw)
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from neo.distributed.comms import Awaitable, BackwardOrder, CommConfig, reduce_scatter_pooled
from neo.distributed.input_dist import DistributedBatch
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding import Pieces, as_pieces
from neo.distributed.slots import SlotLayout

__all__ = ["RowWiseOutputDist", "MeanDivider", "scatter_columns", "place_columns", "feature_columns"]


class MeanDivider:
    """Divides the columns of mean-pooled features by their full bag lengths."""

    def __init__(self, layout: SlotLayout, features: Sequence[str]):
        self.spans: Dict[str, tuple] = {}
        acc = 0
        for f in features:
            t = layout.feature_table[f]
            if t.pooling.value == "mean":
                self.spans[f] = (acc, acc + t.dim)
            acc += t.dim
        self.width = acc

    def __call__(self, y: torch.Tensor, batch: DistributedBatch) -> torch.Tensor:
        if not self.spans:
            return y
        return y / self.divisor(batch, y)

    def divisor(self, batch: DistributedBatch, like: torch.Tensor) -> torch.Tensor:
        """(B, D): the mean-pooled features' full bag lengths (at least 1) in their columns, 1 elsewhere."""
        div = torch.ones(like.shape[0], self.width, dtype=like.dtype, device=like.device)
        for f, (c0, c1) in self.spans.items():
            div[:, c0:c1] = batch.source_lengths[f].clamp(min=1).to(like.dtype).unsqueeze(1)
        return div


def scatter_columns(layout: SlotLayout, rank: int, types: Sequence[ShardingType], features: Sequence[str]):
    """(local pooled columns, target buffer columns) of ``rank``'s slots of ``types``; the buffer
    holds ``features`` side by side, full width."""
    start, acc = {}, 0
    for f in features:
        start[f] = acc
        acc += layout.feature_table[f].dim
    local, target = layout.slot_columns(rank, types), []
    for s in layout.slots_on[rank]:
        if s.sharding_type in types:
            target.extend(range(start[s.feature] + s.col_offset, start[s.feature] + s.col_offset + s.cols))
    return local, torch.tensor(target, dtype=torch.int64), acc


def place_columns(x: torch.Tensor, target: torch.Tensor, width: int) -> torch.Tensor:
    """(n, width) buffer with ``x``'s columns at ``target`` and zeros elsewhere (``x`` itself when
    it already is the whole buffer in order: every rank holds a shard of every such table)."""
    if x.shape[1] == width and bool((target == torch.arange(width)).all()):
        return x
    return x.new_zeros(x.shape[0], width).index_copy(1, target.to(x.device), x)


def feature_columns(layout: SlotLayout, features: Sequence[str]) -> List[int]:
    return [c for f in features for c in range(layout.feature_offset[f], layout.feature_offset[f] + layout.feature_table[f].dim)]


class RowWiseOutputDist:
    """ReduceScatter of row-wise partial sums."""

    def __init__(self, layout: SlotLayout, pg: ProcessGroups, comm: CommConfig):
        self.pg, self.comm = pg, comm
        types = (ShardingType.ROW_WISE,)
        self.features = layout.features_of(types)
        local_cols, self.target_cols, self.width = scatter_columns(layout, pg.rank, types, self.features)
        self.local_width = len(local_cols)
        self.global_columns = feature_columns(layout, self.features)
        self.divide = MeanDivider(layout, self.features)

    def __call__(self, x: torch.Tensor, batch: DistributedBatch, order: BackwardOrder) -> Awaitable[Pieces]:
        buf = place_columns(x, self.target_cols, self.width)                          # (W * B, D_rw)
        aw = reduce_scatter_pooled(buf, self.pg.world_comm, self.comm, order, name="row_wise.reduce_scatter")
        return aw.then(lambda y: as_pieces(self.divide(y, batch)))                    # (B, D_rw)
