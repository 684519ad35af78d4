"""Apply distribution to a model, in one documented order.

``parallelize(model, "embedding", sharded, pg)``, or a dotted path to a nested collection
(``parallelize(model, "sparse_arch.embedding_bag_collection", sharded, pg)``, a TorchRec
DLRM's layout):

1. replaces ``model.embedding`` (an unsharded embedding module; for a dotted path, the last
   attribute of the module the path's prefix names) by ``sharded``, a
   :class:`~neo.distributed.sharded_embedding.ShardedEmbeddingCollection` built from the
   same table configs and a plan (copy weights first with ``sharded.load_full_weights``
   where the model was initialised unsharded);
2. wraps the model in ``DistributedDataParallel`` on ``pg.dense`` (a group of its own, so
   DDP's gradient AllReduces never interleave with the embedding collectives), telling DDP
   to ignore the sharded collection's buffers and parameters, named by their full dotted
   path (``sparse_arch.embedding_bag_collection.lookup.group0_weights``): shards differ per
   rank and are trained by their fused optimizers, never averaged or broadcast.

The model code itself knows nothing of ranks. Train with ``loss = mean over the local
batch``: DDP averages the dense gradients and the collection divides the embedding
gradients by W, so the run equals single-process training on the global batch.
"""

from __future__ import annotations

from typing import Any, Tuple

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharded_embedding import ShardedEmbeddingCollection

__all__ = ["parallelize"]


def _parent_of(model: nn.Module, path: str) -> Tuple[nn.Module, str]:
    """The module that holds the last attribute of the dotted ``path``, and that attribute's name.

    AttributeError naming the path and its first missing component (or one that is not a
    module, and so cannot hold a submodule)."""
    parts = path.split(".")
    if not path or not all(parts):
        raise AttributeError(f"parallelize: '{path}' is not an attribute path (names joined by '.')")
    parent = model
    for i, part in enumerate(parts):
        if not hasattr(parent, part):
            where = ".".join(parts[:i]) or "the model"
            raise AttributeError(f"parallelize: the model has no attribute '{path}': {where} has no "
                                 f"attribute '{part}'")
        if i < len(parts) - 1:
            parent = getattr(parent, part)
            if not isinstance(parent, nn.Module):
                raise AttributeError(f"parallelize: the model has no attribute '{path}': "
                                     f"{'.'.join(parts[:i + 1])} is a {type(parent).__name__}, not a module")
    return parent, parts[-1]


def parallelize(model: nn.Module, embedding_attr: str, sharded: ShardedEmbeddingCollection, pg: ProcessGroups,
                **ddp_kwargs: Any) -> DistributedDataParallel:
    """Shard ``model.<embedding_attr>`` and data-parallelize the rest (see module doc).

    ``embedding_attr``: an attribute of ``model`` or a dotted path to one of a submodule
    (``"sparse_arch.ebc"``); AttributeError naming the path and its missing component."""
    parent, name = _parent_of(model, embedding_attr)
    setattr(parent, name, sharded)
    ignore = [f"{embedding_attr}.{n}" for n, _ in sharded.named_buffers()]
    ignore += [f"{embedding_attr}.{n}" for n, _ in sharded.named_parameters()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignore)
    ddp_kwargs.setdefault("broadcast_buffers", False)
    return DistributedDataParallel(model, process_group=pg.dense, **ddp_kwargs)
