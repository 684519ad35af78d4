"""Apply distribution to a model, in one documented order.

``parallelize(model, "embedding", sharded, pg)``, or a dotted path to a nested collection
(``parallelize(model, "sparse_arch.embedding_bag_collection", sharded, pg)``, a TorchRec
DLRM's layout):

1. replaces ``model.embedding`` (an unsharded embedding module; for a dotted path, the last
   attribute of the module the path's prefix names) by ``sharded``, a
   :class:`~neo.distributed.sharded_embedding.ShardedEmbeddingCollection` built from the
   same table configs and a plan (copy weights first with ``sharded.load_full_weights``
   where the model was initialised unsharded). Or give the plan instead of ``sharded``
   (``parallelize(model, "embedding", plan, pg)``): the collection is then built here from the
   tables of ``model.embedding``, a :class:`~neo.embedding.TableBatchedEmbedding`, with
   ``collection_kwargs`` (backend, validate, device, seed, ...). A meta placeholder
   (``TableBatchedEmbedding(tables, device="meta")``, TorchRec's meta-device pattern: no rank
   ever holds a full table) gives its configs only; a real module's weights are copied into the
   shards (``load_full_weights``: every rank must hold the same tables, e.g. the same seed; the
   optimizer state starts from the configs' initial values);
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

import warnings
from typing import Any, Dict, Optional, Tuple

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neo.distributed.process_groups import ProcessGroups
from neo.distributed.sharded_embedding import ShardedEmbeddingCollection
from neo.embedding import TableBatchedEmbedding

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


def _collection_for(current: nn.Module, path: str, plan: Any, pg: ProcessGroups,
                    collection_kwargs: Dict[str, Any]) -> ShardedEmbeddingCollection:
    """The collection of ``current``'s tables under ``plan`` (what ``model.<path>`` becomes), with
    ``current``'s weights copied into this rank's shards unless it is a meta placeholder.

    TypeError where ``current`` is not a :class:`~neo.embedding.TableBatchedEmbedding`."""
    if not isinstance(current, TableBatchedEmbedding):
        raise TypeError(f"parallelize: given a plan, model.{path} must be a TableBatchedEmbedding (device='meta' "
                        f"or not) whose tables the plan shards, but it is a {type(current).__name__}; pass a "
                        "ShardedEmbeddingCollection built from its tables instead")
    sharded = ShardedEmbeddingCollection(current.tables, plan, pg, **collection_kwargs)
    if not current.is_meta:
        sharded.load_full_weights({t.name: current.table_weight(t.name) for t in current.tables})
    return sharded


def parallelize(model: nn.Module, embedding_attr: str, sharded: Any, pg: ProcessGroups,
                collection_kwargs: Optional[Dict[str, Any]] = None, **ddp_kwargs: Any) -> DistributedDataParallel:
    """Shard ``model.<embedding_attr>`` and data-parallelize the rest (see module doc).

    ``embedding_attr``: an attribute of ``model`` or a dotted path to one of a submodule
    (``"sparse_arch.ebc"``); AttributeError naming the path and its missing component.
    ``sharded``: the :class:`ShardedEmbeddingCollection` to put there, or a plan (anything its
    ``plan`` argument takes: dict, JSON, PlanView, object with ``to_dict``) to build it from the
    :class:`~neo.embedding.TableBatchedEmbedding` there (meta placeholder or real), with the
    keyword arguments ``collection_kwargs`` (only with a plan: TypeError otherwise).
    ``ddp_kwargs``: for DistributedDataParallel."""
    parent, name = _parent_of(model, embedding_attr)
    if not isinstance(sharded, ShardedEmbeddingCollection):
        sharded = _collection_for(getattr(parent, name), embedding_attr, sharded, pg, collection_kwargs or {})
    elif collection_kwargs:
        raise TypeError("parallelize: collection_kwargs are options of the collection built from a plan, but "
                        "a ShardedEmbeddingCollection was given (build it with those options instead)")
    setattr(parent, name, sharded)
    ignore = [f"{embedding_attr}.{n}" for n, _ in sharded.named_buffers()]
    ignore += [f"{embedding_attr}.{n}" for n, _ in sharded.named_parameters()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignore)
    ddp_kwargs.setdefault("broadcast_buffers", False)
    with warnings.catch_warnings():   # broadcast_buffers=False is what we mean (as neo/train/step.py)
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        return DistributedDataParallel(model, process_group=pg.dense, **ddp_kwargs)
