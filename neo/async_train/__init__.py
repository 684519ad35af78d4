"""Asynchronous and heterogeneous training (issue 19; docs/async.md).

- :mod:`neo.async_train.wsp`: ``WSPTrainer``, wave synchronous parallel training of virtual
  workers under bounded staleness (``async_train.mode: wsp``), ``run``;
- :mod:`neo.async_train.server`: the parameter-server role (rank 0's thread), the workers' links
  to it (torch.distributed point-to-point) and ``WaveClock`` (clocks and versions as c10d store keys);
- :mod:`neo.async_train.virtual_workers`: ``group_virtual_workers`` (devices of unequal speed into
  virtual workers of equal total speed), ``split_dense`` (each worker's dense layers across its
  devices in proportion to speed), ``virtual_worker_plan``.

Exports load lazily: importing the package imports nothing (the config imports
``virtual_workers``, which needs neither torch nor a process group).

Launch: ``torchrun --standalone --nproc-per-node 4 -m neo.async_train CONFIG async_train.staleness=2``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WSPTrainer": "wsp", "run": "wsp", "check_wsp_config": "wsp",
    "ParameterServer": "server", "WaveClock": "server", "aggregate": "server",
    "group_virtual_workers": "virtual_workers", "split_dense": "virtual_workers",
    "virtual_worker_plan": "virtual_workers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"neo.async_train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'neo.async_train' has no attribute {name!r}")
