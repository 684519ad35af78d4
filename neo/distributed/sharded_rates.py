"""The fused learning rates of a :class:`~neo.distributed.sharded_embedding.ShardedEmbeddingCollection`.

``ShardRates`` is a mixin of the collection (the attributes it reads: ``layout``, ``lookup``,
``_lr_groups``, the global tables' fused groups by name, and ``_group_lrs``, their rates, which
the collection sets at construction). Every rank keeps every group's rate, whatever shards it
holds, so that a rate set on all ranks alike is checked alike; the local module's shards of a
table take its rate.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from neo.embedding.fused_optimizer import FusedGroupSpec, FusedOptimizer, group_rates

__all__ = ["ShardRates"]


class ShardRates:
    """Per-table learning rates and the fused optimizer over them (see the module doc)."""

    def set_learning_rate(self, lr: float, table: Optional[str] = None) -> None:
        """Every table's fused-optimizer learning rate, or ``table``'s (see
        :meth:`set_learning_rates`)."""
        names = [t.name for t in self.layout.tables]
        self.set_learning_rates({t: lr for t in names} if table is None else {table: lr})

    def set_learning_rates(self, lrs: Dict[str, float]) -> None:
        """Each named table's learning rate (table name -> lr), on this rank's shards of it. As
        :meth:`neo.embedding.TableBatchedEmbedding.set_learning_rates`: tables that share a fused
        update (one optimizer config and dtype) are set together, to one value."""
        new = group_rates(self._lr_groups, lrs)     # checked on every rank, whatever shards it holds
        for i, lr in new.items():
            self._group_lrs[i] = lr
        if self.lookup is not None:
            local = {s.name: lrs[s.name.rpartition("#")[0]] for s in self.lookup.tables
                     if s.name.rpartition("#")[0] in lrs}
            self.lookup.set_learning_rates(local)
        opt = self.__dict__.get("_fused_optimizer")
        if opt is not None:
            opt.sync({t: self._group_lrs[i] for i in new for t in self._lr_groups[i]})

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        """The fused learning rates as a ``torch.optim.Optimizer`` that LR schedulers drive
        (TorchRec's fused ``KeyedOptimizer``); see :mod:`neo.embedding.fused_optimizer`.

        One param group per group of the GLOBAL tables (one optimizer config and dtype), in
        table order, the same on every rank: ``{"lr", "tables": [global table names], "params":
        [this rank's shard weight views of them, possibly none]}``. ``step()`` sets this rank's
        shards' rates: local, no collective. Made once, at the first access; a group's lr is the
        collection's (the config's, then what :meth:`set_learning_rates` set: every rank keeps
        every group's, shards or not)."""
        opt = self.__dict__.get("_fused_optimizer")
        if opt is None:
            opt = self.__dict__["_fused_optimizer"] = FusedOptimizer(self._fused_groups(), self.set_learning_rates)
        return opt

    def _fused_groups(self) -> List[FusedGroupSpec]:
        """The global tables' fused groups, each with its lr and this rank's shard weights (a
        global group's shards are one group of the local module: same optimizer and dtype)."""
        params: Dict[str, List[torch.Tensor]] = {}
        for g in self.lookup.groups if self.lookup is not None else []:
            for k, cfg in enumerate(g.layout.tables):
                params.setdefault(cfg.name.rpartition("#")[0], []).append(g.table_slots(k))
        return [FusedGroupSpec(names, lr, [p for t in names for p in params.get(t, [])])
                for names, lr in zip(self._lr_groups, self._group_lrs)]
