"""FusedOptimizer: the embedding tables' fused update, seen as a ``torch.optim.Optimizer``.

The tables of a :class:`~neo.embedding.TableBatchedEmbedding` (or a
:class:`~neo.distributed.ShardedEmbeddingCollection`) are updated inside ``backward()`` by
fused kernels, one learning rate per *group* (tables with one optimizer config and dtype share
a kernel and its rate). ``module.fused_optimizer`` shows those rates as an optimizer's param
groups, so that torch's LR schedulers (which accept ``torch.optim.Optimizer`` instances only)
drive them, alone or next to a dense optimizer, as TorchRec's fused ``KeyedOptimizer`` does::

    sched = torch.optim.lr_scheduler.StepLR(model.ebc.fused_optimizer, step_size=2, gamma=0.5)
    opts = [dense_opt, model.ebc.fused_optimizer]
    for batch in data:
        for o in opts: o.zero_grad()
        loss(model(batch)).backward()      # the tables are updated here, at the groups' current lrs
        for o in opts: o.step()            # the dense update; for the tables: nothing more to do
        sched.step()                       # the next lr, on the kernels at once

Param groups, one per fused group, in the module's group order (every rank of a sharded
collection has the same ones)::

    {"lr": 0.1, "tables": ["user", "item"], "params": [...]}

``params``: the group's weight views (TorchRec passes its weights too): ``(kernel rows, D)``
per table of this module (a sharded collection: this rank's shards of the group's tables,
none where it holds none). They identify the group; nothing reads their ``.grad`` and no
state is kept for them (the tables' optimizer state is in the module's ``state_dict``). They
are the tensors of the time the optimizer was made: after ``module.to(device)``, make no use
of them.

Learning rates: a group's ``"lr"`` reaches the kernels as soon as it is set
(``group["lr"] = x``, what every scheduler does), and again at every ``step()`` and
``zero_grad()`` (TorchRec's ``EmbeddingFusedOptimizer`` applies it there). So the update in
the next ``backward()`` uses the lr the groups hold then, whatever the order of the calls in
the loop: as ``torch.optim.SGD`` would use it in its ``step()``. ``module.set_learning_rates``
(the trainer's schedule) sets the kernels and the groups alike (:meth:`FusedOptimizer.sync`):
whichever sets a rate last is what the next update uses.

``state_dict()`` carries the groups without their params (``lr``, ``tables``, and what a
scheduler added: ``initial_lr``, ...) and an empty ``state``; ``load_state_dict`` matches
groups by their tables (ValueError naming them otherwise) and applies the lrs. It loads under
another sharding or world size (no per-rank content).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from neo.optim import hooked_load_state_dict, hooked_state_dict

__all__ = ["FusedOptimizer", "FusedGroupSpec", "group_rates"]

ApplyRates = Callable[[Dict[str, float]], None]
"""Sets the kernels' learning rates, table name -> lr (``module.set_learning_rates``)."""


class FusedGroupSpec:
    """One fused group: its tables (names), current lr and weight views."""

    def __init__(self, tables: Sequence[str], lr: float, params: Sequence[torch.Tensor] = ()):
        self.tables, self.lr, self.params = list(tables), float(lr), list(params)


class _FusedGroup(dict):
    """A param group whose ``"lr"``, once set, goes to the kernels of its tables at once."""

    def __init__(self, spec: FusedGroupSpec, apply: ApplyRates):
        super().__init__(params=spec.params, lr=spec.lr, tables=list(spec.tables))
        self.apply = apply

    def __setitem__(self, key: str, value: Any) -> None:
        apply = self.__dict__.get("apply")       # None while unpickling: the items come first
        if key == "lr" and apply is not None and "tables" in self:     # deepcopy: "lr" before "tables"
            value = _checked_lr(value, self["tables"])
            apply({t: value for t in self["tables"]})
        elif key == "tables" and "tables" in self and list(value) != self["tables"]:
            raise ValueError(f"a fused group's tables are fixed: {self['tables']}, not {list(value)}")
        super().__setitem__(key, value)

    def push(self) -> None:
        """Put the group's lr on the kernels."""
        self.apply({t: float(self["lr"]) for t in self["tables"]})


def _checked_lr(value: Any, tables: List[str]) -> float:
    lr = float(value.item() if isinstance(value, torch.Tensor) else value)
    if not (lr >= 0 and math.isfinite(lr)):
        which = f"table {tables[0]!r}" if len(tables) == 1 else f"tables {tables}"
        raise ValueError(f"learning rate of {which} must be a finite number >= 0, got {value!r}")
    return lr


def group_rates(groups: Sequence[Sequence[str]], lrs: Dict[str, Any]) -> Dict[int, float]:
    """The new learning rate of each group (index into ``groups``, lists of table names) that
    ``lrs`` (table name -> lr) sets; the others are left out. A group's tables share one fused
    update: all of them named, with one value, or none. ValueError, before anything is set, for
    an unknown table, an lr that is not a finite number >= 0, or part of a group."""
    names = [t for g in groups for t in g]
    unknown = [t for t in lrs if t not in names]
    if unknown:
        raise ValueError(f"set_learning_rate: no table {unknown[0]!r} here; tables: {names}")
    for t, lr in lrs.items():
        _checked_lr(lr, [t])
    new: Dict[int, float] = {}
    for i, group in enumerate(groups):
        given = {float(lrs[t]) for t in group if t in lrs}
        if not given:
            continue
        if len(given) > 1 or any(t not in lrs for t in group):
            asked = ", ".join(f"{t!r}: {lrs[t]}" for t in group if t in lrs)
            raise ValueError(f"tables {list(group)} share one fused update and learning rate (the same optimizer "
                             f"config and dtype); set them together to one value, or give a table an optimizer "
                             f"config of its own; asked: {{{asked}}}")
        new[i] = given.pop()
    return new


class FusedOptimizer(torch.optim.Optimizer):
    """The learning rates of fused embedding updates, as an optimizer (see module doc).

    Args:
        groups: the fused groups, in a fixed order (every rank the same for a sharded collection).
        apply: sets the kernels' rates (table name -> lr), e.g. ``module.set_learning_rates``.
    """

    def __init__(self, groups: Sequence[FusedGroupSpec], apply: ApplyRates):
        self._sealed = False
        super().__init__([_FusedGroup(g, apply) for g in groups], defaults={})
        self._sealed = True

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Only the module's fused groups: TypeError after construction."""
        if self._sealed:
            raise TypeError("FusedOptimizer: the groups are the module's fused groups (one per optimizer config "
                            "and dtype); a group cannot be added")
        super().add_param_group(param_group)

    def _push(self) -> None:
        for g in self.param_groups:
            g.push()

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Put every group's lr on the kernels; no update (that happened in ``backward``).
        ``closure`` (re-evaluates the loss, running backward and so the fused update) is called
        after, with gradients enabled; its loss is returned."""
        self._push()
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No gradient to clear (the tables have none); puts every group's lr on the kernels."""
        self._push()

    def state_dict(self) -> Dict[str, Any]:
        """``{"state": {}, "param_groups": [group without "params", ...]}`` (see module doc); the
        hooks of ``register_state_dict_pre_hook`` / ``_post_hook`` run around it, as on any torch
        optimizer."""
        return hooked_state_dict(self, lambda: {"state": {}, "param_groups": [
            {k: (list(v) if k == "tables" else v) for k, v in g.items() if k != "params"} for g in self.param_groups]})

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Set each group's values (``lr``, ``initial_lr``, ...) from the saved group of the same
        tables; ValueError naming the tables where the groups differ. Nothing is set then. The
        hooks of ``register_load_state_dict_pre_hook`` / ``_post_hook`` run around it."""
        hooked_load_state_dict(self, state_dict, self._load)

    def check_state_dict(self, state_dict: Dict[str, Any]) -> Dict[tuple, Dict[str, Any]]:
        """The saved groups by their tables, if ``state_dict`` would load (ValueError naming the
        tables where the groups differ, or a learning rate that is not one); sets nothing."""
        saved = {tuple(g["tables"]): g for g in state_dict["param_groups"]}
        mine = [tuple(g["tables"]) for g in self.param_groups]
        if sorted(saved) != sorted(mine):
            raise ValueError(f"FusedOptimizer.load_state_dict: the saved groups' tables {sorted(saved)} differ "
                             f"from this module's {sorted(mine)}")
        for g in self.param_groups:
            _checked_lr(saved[tuple(g["tables"])]["lr"], g["tables"])
        return saved

    def _load(self, state_dict: Dict[str, Any]) -> None:
        saved = self.check_state_dict(state_dict)
        for g in self.param_groups:
            for k, v in saved[tuple(g["tables"])].items():
                if k not in ("params", "tables"):
                    g[k] = v

    def sync(self, lrs: Dict[str, float]) -> None:
        """Record rates the module was given directly (``set_learning_rates``: table name -> lr) in
        the groups that hold those tables, without setting the kernels again."""
        for g in self.param_groups:
            if g["tables"] and g["tables"][0] in lrs:
                dict.__setitem__(g, "lr", float(lrs[g["tables"][0]]))

    def learning_rates(self) -> Dict[str, float]:
        """Every table's lr as the groups hold it (table name -> lr)."""
        return {t: float(g["lr"]) for g in self.param_groups for t in g["tables"]}
