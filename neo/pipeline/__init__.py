"""Pipeline-parallel dense towers (issue 18): profile the dense layers, partition them into
stages (PipeDream's DP) and predict each schedule's step (docs/pipeline.md).

Exports load lazily: importing the package imports nothing, and ``neo.pipeline.partition`` and
``neo.pipeline.perf_model`` need no torch. ``neo.pipeline.partition`` is the module; its function
is ``neo.pipeline.partition.partition``.

- :mod:`neo.pipeline.layers`: ``dense_layers``, ``layers_of``, ``LayerStack``, ``split_stages``;
- :mod:`neo.pipeline.profile`: ``profile_layers``, ``profile_chunks``, ``measure_p2p_bandwidth``;
- :mod:`neo.pipeline.partition`: ``Profile``, ``LayerProfile``, ``Partition``, ``PartitionError``,
  ``load_profile``;
- :mod:`neo.pipeline.perf_model`: ``Prediction``, ``predict``, ``best_schedule``, ``stage_times``
  (the papers' closed forms);
- :mod:`neo.pipeline.simulate`: ``orders``, ``replay``, ``predict_replayed``, ``best_replayed``
  (each schedule's order of actions replayed, ranks sharing cores: what ``schedule: auto`` uses).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "dense_layers": "layers", "layers_of": "layers", "LayerStack": "layers", "split_stages": "layers",
    "profile_layers": "profile", "profile_chunks": "profile", "measure_p2p_bandwidth": "profile",
    "Profile": "partition", "LayerProfile": "partition", "Partition": "partition",
    "PartitionError": "partition", "load_profile": "partition",
    "Prediction": "perf_model", "predict": "perf_model", "best_schedule": "perf_model", "stage_times": "perf_model",
    "orders": "simulate", "replay": "simulate", "predict_replayed": "simulate", "best_replayed": "simulate",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"neo.pipeline.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'neo.pipeline' has no attribute {name!r}")
