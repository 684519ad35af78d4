"""Update counters and learning rates of :class:`~neo.embedding.module.TableBatchedEmbedding`'s
fused groups.

``TableRates`` is a mixin of the module (the attributes it reads: ``groups``, its fused groups,
each with ``layout.tables`` and its ``step`` counter, and ``learning_rates``, one per group).
Tables of one optimizer config and dtype share a fused update, so its counter and its rate:
they are set together or not at all.
"""

from __future__ import annotations

from typing import Dict, Optional

from neo.embedding.fused_optimizer import FusedGroupSpec, FusedOptimizer, group_rates
from neo.embedding.placeholder import needs_tables

__all__ = ["TableRates"]


class TableRates:
    """Update counters, learning rates and the fused optimizer over them (see the module doc)."""

    @needs_tables
    def optimizer_steps(self) -> Dict[str, int]:
        """Updates applied so far, per table (tables of one group share the counter)."""
        return {cfg.name: int(g.step) for g in self.groups for cfg in g.layout.tables}

    @needs_tables
    def set_optimizer_steps(self, step: int, table: Optional[str] = None) -> None:
        """Set the update counter (Adam's and LAMB's bias correction) of every group, or of the
        group holding ``table``: restoring a checkpoint saved under another sharding."""
        for g in self.groups:
            if table is None or any(c.name == table for c in g.layout.tables):
                g.step.fill_(int(step))

    @needs_tables
    def set_learning_rate(self, lr: float, table: Optional[str] = None) -> None:
        """Set the sparse optimizer's learning rate of every table, or of ``table`` alone.

        Tables of one optimizer config and dtype share a fused update and its learning rate (as
        tables share one in an FBGEMM TBE): ``table`` must then be set with its group, through
        :meth:`set_learning_rates`, or get an optimizer config of its own. ValueError for a table
        this module does not hold, a table whose group holds others (naming them), or an lr that
        is not a finite number >= 0."""
        if table is None:
            self.set_learning_rates({c.name: lr for g in self.groups for c in g.layout.tables})
        else:
            self.set_learning_rates({table: lr})

    @needs_tables
    def set_learning_rates(self, lrs: Dict[str, float]) -> None:
        """Set the learning rate of each table named in ``lrs`` (table name -> lr). The tables of a
        group (:meth:`set_learning_rate`) are set together: all of them named, with one value, or
        none (ValueError naming the group's tables otherwise); the others keep theirs."""
        new = group_rates([[c.name for c in g.layout.tables] for g in self.groups], lrs)
        for i, lr in new.items():                   # all checked: nothing is set when one is refused
            self.learning_rates[i] = lr
        opt = self.__dict__.get("_fused_optimizer")
        if opt is not None:
            opt.sync({c.name: self.learning_rates[i] for i in new for c in self.groups[i].layout.tables})

    @property
    @needs_tables
    def fused_optimizer(self) -> FusedOptimizer:
        """The fused groups' learning rates as a ``torch.optim.Optimizer`` that LR schedulers drive
        (TorchRec's fused ``KeyedOptimizer``): one param group per group of :attr:`groups`,
        ``{"lr", "tables": [names], "params": [(kernel rows, D) weight view per table]}``; its
        ``step()`` updates nothing (backward did). Made once, at the first access, with the
        kernels' current rates; see :mod:`neo.embedding.fused_optimizer`."""
        opt = self.__dict__.get("_fused_optimizer")
        if opt is None:
            specs = [FusedGroupSpec([c.name for c in g.layout.tables], self.learning_rates[i],
                                    [g.table_slots(t) for t in range(len(g.layout.tables))])
                     for i, g in enumerate(self.groups)]
            opt = self.__dict__["_fused_optimizer"] = FusedOptimizer(specs, self.set_learning_rates)
        return opt
