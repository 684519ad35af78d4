"""CombinedOptimizer: several optimizers driven as one (TorchRec's ``CombinedOptimizer``).

A model trained with fused embedding updates has two optimizers: the tables' (``module.fused_optimizer``,
whose update runs in ``backward``) and the dense parameters' (any ``torch.optim`` optimizer).
``CombinedOptimizer`` holds both so that a training loop zeroes, steps, schedules and saves them
as one::

    opt = CombinedOptimizer([("dense", torch.optim.Adam(dense_params, lr=1e-3)), ("sparse", ebc.fused_optimizer)])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)   # every group of both
    for batch, y in data:
        opt.zero_grad()
        loss_fn(model(batch), y).backward()      # the tables are updated here, at their groups' lrs
        opt.step()
        sched.step()

``param_groups`` is the list of every optimizer's groups (the same dict objects, in the order the
optimizers were given): what a scheduler sets on a group reaches its optimizer (a fused group's
lr goes to its kernels at once). ``state_dict()`` is ``{"optimizers": {name: that optimizer's
state_dict()}}`` and ``load_state_dict`` loads each by name (ValueError where the names differ,
nothing loaded then). Groups cannot be added to it (add them to an optimizer it holds, before).

A fused group has no momentum: ``OneCycleLR`` over one needs ``cycle_momentum=False``. A hook
registered for every optimizer (``torch.optim.optimizer.register_optimizer_step_pre_hook``)
runs for the combined optimizer's ``step()`` and for each optimizer's it calls.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["CombinedOptimizer"]

Named = Union[torch.optim.Optimizer, Tuple[str, torch.optim.Optimizer]]


def hooked_state_dict(opt: torch.optim.Optimizer, make: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``make()`` with the hooks of ``opt.register_state_dict_pre_hook`` / ``_post_hook`` around it,
    as torch's own ``Optimizer.state_dict`` runs them (for optimizers that build their own)."""
    for pre in opt._optimizer_state_dict_pre_hooks.values():
        pre(opt)
    out = make()
    for post in opt._optimizer_state_dict_post_hooks.values():
        changed = post(opt, out)
        out = changed if changed is not None else out
    return out


def hooked_load_state_dict(opt: torch.optim.Optimizer, state_dict: Dict[str, Any],
                           load: Callable[[Dict[str, Any]], None]) -> None:
    """``load(state_dict)`` with the hooks of ``opt.register_load_state_dict_pre_hook`` /
    ``_post_hook`` around it (a pre-hook may hand back another state dict)."""
    for pre in opt._optimizer_load_state_dict_pre_hooks.values():
        changed = pre(opt, state_dict)
        state_dict = changed if changed is not None else state_dict
    load(state_dict)
    for post in opt._optimizer_load_state_dict_post_hooks.values():
        post(opt)


def _check_part(name: str, opt: torch.optim.Optimizer, saved: Dict[str, Any]) -> None:
    """Whether ``saved`` would load into ``opt``, without loading it: the optimizer's own check
    where it has one (a fused optimizer: its tables and rates), else what torch's
    ``Optimizer.load_state_dict`` checks first (as many groups, each with as many parameters)."""
    check = getattr(opt, "check_state_dict", None)
    if check is not None:
        check(saved)
        return
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(opt.param_groups) or any(
            len(g.get("params", ())) != len(mine["params"]) for g, mine in zip(groups, opt.param_groups)):
        raise ValueError(f"CombinedOptimizer.load_state_dict: optimizer {name!r}: the saved parameter groups do not "
                         f"match this optimizer's ({len(opt.param_groups)} groups of "
                         f"{[len(g['params']) for g in opt.param_groups]} parameters)")


class CombinedOptimizer(torch.optim.Optimizer):
    """Optimizers zeroed, stepped, scheduled and saved as one (module doc).

    Args:
        optimizers: optimizers, or ``(name, optimizer)`` pairs (names default to their position,
            ``"0"``, ``"1"``, ...); names must differ.
    """

    def __init__(self, optimizers: Sequence[Named]):
        named: Dict[str, torch.optim.Optimizer] = {}
        for i, item in enumerate(optimizers):
            name, opt = item if isinstance(item, tuple) else (str(i), item)
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"CombinedOptimizer: optimizers[{i}] is a {type(opt).__name__}, not a "
                                "torch.optim.Optimizer")
            if name in named:
                raise ValueError(f"CombinedOptimizer: the name {name!r} is given twice")
            if any(opt is o for o in named.values()):
                raise ValueError(f"CombinedOptimizer: optimizers[{i}] ({name!r}) is given twice")
            named[name] = opt
        if not named:
            raise ValueError("CombinedOptimizer: no optimizer given")
        self.optimizers = named
        # torch.optim.Optimizer.__init__ would make groups of its own: its hooks and step patch only
        self.__setstate__({"defaults": {}})

    # what torch.optim.Optimizer and the schedulers read
    @property
    def param_groups(self) -> List[Dict[str, Any]]:           # type: ignore[override]
        return [g for o in self.optimizers.values() for g in o.param_groups]

    @param_groups.setter
    def param_groups(self, value) -> None:
        raise TypeError("CombinedOptimizer.param_groups are its optimizers' groups; set those")

    @property
    def state(self) -> Dict[Any, Any]:                        # type: ignore[override]
        """Every optimizer's per-parameter state, merged (a read-only view)."""
        return {p: s for o in self.optimizers.values() for p, s in o.state.items()}

    @state.setter
    def state(self, value) -> None:
        raise TypeError("CombinedOptimizer.state is its optimizers' state; set those")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise TypeError("CombinedOptimizer: add the group to one of its optimizers")

    def __getstate__(self) -> Dict[str, Any]:
        return {"optimizers": self.optimizers}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if "optimizers" in state:                               # unpickled, deep-copied
            self.optimizers = state["optimizers"]
            state = {"defaults": {}}
        super().__setstate__(state)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {type(o).__name__}" for n, o in self.optimizers.items())
        return f"CombinedOptimizer({inner})"

    # the loop's calls
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """``closure`` (if given: re-evaluates the loss, running backward) once, then every
        optimizer's ``step()``; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers.values():
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        """``{"optimizers": {name: state_dict}}``; the hooks of ``register_state_dict_pre_hook`` /
        ``_post_hook`` run around it, as on any torch optimizer."""
        return hooked_state_dict(self, lambda: {"optimizers": {n: o.state_dict() for n, o in self.optimizers.items()}})

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Each optimizer's state by name (ValueError where the names differ, or an optimizer
        refuses its part: nothing loaded then);
        ``register_load_state_dict_pre_hook`` / ``_post_hook`` hooks run around it."""
        hooked_load_state_dict(self, state_dict, self._load)

    def _load(self, state_dict: Dict[str, Any]) -> None:
        saved = state_dict.get("optimizers") if isinstance(state_dict, dict) else None
        if not isinstance(saved, dict) or sorted(saved) != sorted(self.optimizers):
            names = sorted(saved) if isinstance(saved, dict) else None
            raise ValueError(f"CombinedOptimizer.load_state_dict: saved optimizers {names}, these are "
                             f"{sorted(self.optimizers)}")
        # all or nothing: every part is checked before any is loaded (no copy of the state kept)
        for n, o in self.optimizers.items():
            _check_part(n, o, saved[n])
        for n, o in self.optimizers.items():
            o.load_state_dict(saved[n])
