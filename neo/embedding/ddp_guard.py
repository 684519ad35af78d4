"""Refuse training tables that plain ``DistributedDataParallel`` would overwrite.

``DistributedDataParallel(model)`` over a model with a :class:`~neo.embedding.TableBatchedEmbedding`
(or a :class:`~neo.distributed.ShardedEmbeddingCollection` that ``neo.distributed.parallelize`` did
not wrap) broadcasts rank 0's buffers, the tables among them, before every forward
(``broadcast_buffers=True``, its default). The fused backward updates each rank's tables in place
from that rank's samples, so every other rank's updates were lost at the next step, silently (a
collection's shards were overwritten with rank 0's, other rows altogether). The lookup's forward in
training asks DDP whether it is inside such a forward and raises :class:`ReplicatedTablesError`
naming the tables and the two ways out. A DDP told to leave the tables alone (``broadcast_buffers``
off, or the buffers in its ignore list, as ``parallelize`` and ``neo train`` do) is allowed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["ReplicatedTablesError", "refuse_ddp_buffer_sync"]


class ReplicatedTablesError(RuntimeError):
    """The tables are trained inside a ``DistributedDataParallel`` forward that broadcasts them."""


def refuse_ddp_buffer_sync(module: "TableBatchedEmbedding") -> None:
    """Raise :class:`ReplicatedTablesError` if an active DDP forward of more than one rank syncs
    any of ``module``'s weight buffers from rank 0. Costs a dictionary lookup and an attribute
    outside a DDP forward, and a scan of DDP's buffer list inside one."""
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    if ddp_module is None:
        return
    active = ddp_module.DistributedDataParallel._active_ddp_module
    if active is None:
        return
    syncs = getattr(active, "forward_sync_buffers", getattr(active, "broadcast_buffers", True))
    world = torch.distributed.get_world_size(active.process_group)
    if not syncs or world < 2:
        return
    ours = {id(g.weights) for g in module.groups}
    if not any(id(b) in ours for b in getattr(active, "modules_buffers", ())):
        return
    names = ", ".join(f"'{t.name}'" for t in module.tables)
    raise ReplicatedTablesError(
        f"tables {names} are trained inside torch.nn.parallel.DistributedDataParallel's forward, which "
        f"broadcasts rank 0's buffers (these tables among them) to all {world} ranks before every forward: "
        "every other rank's fused updates would be lost. Shard the tables instead: model = "
        "neo.distributed.parallelize(model, '<attribute of the embedding module>', plan, pg) (data_parallel "
        "sharding replicates a table and applies the whole global batch's update on every rank); or keep DDP "
        "to the dense modules (DistributedDataParallel._set_params_and_buffers_to_ignore_for_model with the "
        "embedding module's buffers, or broadcast_buffers=False), where each rank then trains its own tables")
