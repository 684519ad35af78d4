"""The meta placeholder (``TableBatchedEmbedding(tables, device="meta")``): the checked table
configs and no storage, for a model whose tables are sharded later
(``neo.distributed.parallelize(model, path, plan, pg)``, TorchRec's meta-device pattern).
Every method that uses the tables carries :func:`needs_tables`: on a placeholder it raises
:func:`placeholder_error` instead of running."""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["needs_tables", "placeholder_error"]


def needs_tables(method: Callable) -> Callable:
    """Marks a method that reads or writes the tables: on a meta placeholder it raises instead."""
    @functools.wraps(method)
    def guarded(self: Any, *args, **kwargs):
        if self.is_meta:
            raise placeholder_error(self, method.__name__)
        return method(self, *args, **kwargs)
    return guarded


def placeholder_error(module: Any, what: str) -> RuntimeError:
    """The error of using the tables of the placeholder ``module`` through ``what`` (a method name)."""
    moving = what == "_apply"
    what = {"_apply": "moving or converting it (.to, .cuda, to_empty, ...)",
            "_save_to_state_dict": "state_dict", "_load_from_state_dict": "load_state_dict"}.get(what, what)
    hint = (". Move the model's other modules alone; the shards are made on the device given to the "
            "collection (parallelize(..., collection_kwargs={'device': ...}))" if moving else "")
    return RuntimeError(
        f"TableBatchedEmbedding: {what} needs the tables, but this module was built with device='meta': a "
        f"placeholder that holds the configs of its {len(module.tables)} tables and no weights. Shard it: "
        "neo.distributed.parallelize(model, '<its attribute path>', plan, pg) replaces it by a "
        "ShardedEmbeddingCollection that allocates this rank's shards only (or build "
        "ShardedEmbeddingCollection(module.tables, plan, pg) yourself); for whole tables in one process, "
        f"build the module on a real device{hint}")
