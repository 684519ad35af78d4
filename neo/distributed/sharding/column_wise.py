"""Column-wise sharding: a table's columns split into slices on several ranks (Neo paper, Sec. 4.1).

Every column shard holds all rows, so input distribution duplicates the feature's ids to
each of them; each pools its ``(W * B, cols)`` slice. Output distribution is the
table-wise AlltoAll (:class:`~neo.distributed.sharding.table_wise.AllToAllOutputDist`):
each rank receives its samples' slices from the shard owners, and the sharded
collection's final column permutation concatenates the slices of a table back in column
order. Backward: the reverse AlltoAll sends each slice's gradient to its shard.

The sharded collection fuses table_wise and column_wise into ONE AlltoAll (same
communication pattern), so a mixed plan pays one call for both.

Semantics: sum and mean pooling are exact (each shard sees the whole bag). Optimizers
whose state or update mixes columns of a row are NOT equivalent to unsharded training:
``rowwise_adagrad`` keeps one accumulator per row per shard (mean of g^2 over the
shard's columns only), ``lamb``'s trust ratio uses the shard's part of the row.
sgd, adagrad and adam are exact.
"""

from __future__ import annotations

from neo.distributed.comms import CommConfig
from neo.distributed.plan_view import ShardingType
from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharding.table_wise import AllToAllOutputDist
from neo.distributed.slots import SlotLayout

__all__ = ["column_wise_output_dist"]


def column_wise_output_dist(layout: SlotLayout, pg: ProcessGroups, comm: CommConfig) -> AllToAllOutputDist:
    return AllToAllOutputDist(layout, pg, (ShardingType.COLUMN_WISE,), comm, name="column_wise")
