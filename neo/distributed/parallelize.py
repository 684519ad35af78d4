"""Apply distribution to a model, in one documented order.

``parallelize(model, "embedding", sharded, pg)``:

1. replaces ``model.embedding`` (an unsharded embedding module) by ``sharded``, a
   :class:`~neo.distributed.sharded_embedding.ShardedEmbeddingCollection` built from the
   same table configs and a plan (copy weights first with ``sharded.load_full_weights``
   where the model was initialised unsharded);
2. wraps the model in ``DistributedDataParallel`` on ``pg.dense`` (a group of its own, so
   DDP's gradient AllReduces never interleave with the embedding collectives), telling DDP
   to ignore the sharded collection's buffers: shards differ per rank and are trained by
   their fused optimizers, never averaged or broadcast.

The model code itself knows nothing of ranks. Train with ``loss = mean over the local
batch``: DDP averages the dense gradients and the collection divides the embedding
gradients by W, so the run equals single-process training on the global batch.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharded_embedding import ShardedEmbeddingCollection

__all__ = ["parallelize"]


def parallelize(model: nn.Module, embedding_attr: str, sharded: ShardedEmbeddingCollection, pg: ProcessGroups,
                **ddp_kwargs: Any) -> DistributedDataParallel:
    """Shard ``model.<embedding_attr>`` and data-parallelize the rest (see module doc)."""
    if not hasattr(model, embedding_attr):
        raise AttributeError(f"parallelize: the model has no attribute '{embedding_attr}'")
    setattr(model, embedding_attr, sharded)
    ignore = [f"{embedding_attr}.{n}" for n, _ in sharded.named_buffers()]
    ignore += [f"{embedding_attr}.{n}" for n, _ in sharded.named_parameters()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignore)
    ddp_kwargs.setdefault("broadcast_buffers", False)
    return DistributedDataParallel(model, process_group=pg.dense, **ddp_kwargs)
