"""Neo data pipeline: Criteo and synthetic data to Parquet, and a streaming loader of jagged batches.

Modules: :mod:`.criteo` (raw TSV to Parquet), :mod:`.criteo_parse` (vectorized parsing),
:mod:`.vocab`, :mod:`.multihot` (MLPerf DLRM-DCNv2 multi-hot), :mod:`.synthetic` (its options shared with
``neo train``'s config in :mod:`.synth_knobs`), :mod:`.locality`
(production reuse statistics), :mod:`.loader`, :mod:`.schema`, :mod:`.writer`, :mod:`.stats`
(``inspect``), :mod:`.reader`, :mod:`.parallel`, :mod:`.cli` (the ``neo-data`` command).
See ``docs/data_pipeline.md``.

Heavy modules (the loader imports torch) are imported on first use of their names here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ParquetLoader", "LoaderOptions", "Batch", "CriteoOptions", "preprocess_criteo",
           "SynthOptions", "generate", "apply_preset", "MultiHotOptions", "MultiHotTables",
           "convert_to_multihot", "inspect_dataset", "WriterOptions", "DatasetMeta"]

_WHERE = {
    "ParquetLoader": "loader", "LoaderOptions": "loader", "Batch": "loader",
    "CriteoOptions": "criteo", "preprocess_criteo": "criteo",
    "SynthOptions": "synthetic", "generate": "synthetic", "apply_preset": "synthetic",
    "MultiHotOptions": "multihot", "MultiHotTables": "multihot", "convert_to_multihot": "multihot",
    "inspect_dataset": "stats", "WriterOptions": "writer", "DatasetMeta": "schema",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
