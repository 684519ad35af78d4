"""The part of ``neo calibrate``'s measurements (:mod:`neo.calibrate.measure`, which re-exports every
name here) that runs a small DLRM of its own, the one :func:`machinery_config` describes.

- :func:`machinery`: the small model trained by the real :class:`neo.train.trainer.Trainer` for the
  per-step costs no kernel shows (launches, bookkeeping, the loop); once more wide (``WIDE_*``),
  for the cost per pooled element, and at W > 1 under each sharding kind of :data:`KINDS`, for the
  kind's overhead over table-wise;
- :func:`loading`: the data loader's CPU work per batch on the small models' data
  (:func:`loading_cases`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist

__all__ = ["KINDS", "KIND_TABLES_PER_RANK", "KIND_BATCH", "WIDE_TABLES_PER_RANK", "WIDE_DIM", "WIDE_BATCH",
           "WIDE_IDS_PER_BAG", "machinery_config", "machinery", "loading_cases", "loading"]


KINDS = ("row_wise", "column_wise", "data_parallel", "table_row_wise", "table_column_wise")
"""The sharding kinds whose per-step overhead over table-wise ``neo calibrate`` measures (W > 1)."""
KIND_TABLES_PER_RANK, KIND_BATCH = 4, 1024
"""Tables per rank and samples per rank of those runs (a small real model's; the overhead is
charged per bag of a table of the kind)."""


WIDE_TABLES_PER_RANK, WIDE_DIM, WIDE_BATCH, WIDE_IDS_PER_BAG = 4, 64, 2048, 8
"""The wide small model (:func:`machinery` once more): 16x the narrow one's pooled elements per
sample, 8x its batch and bags of 0-16 ids (8 on average) where the narrow one has one id, for the
cost per pooled element (``pooled_elem_s``) and the loader's cost per sample and per id."""


def machinery_config(world_size: int, kind: str = "table_wise", quick: bool = False, rank: int = 0,
                     per_rank: int = 1, batch: int = 256, dim: int = 16, ids_per_bag: int = 1,
                     run_dir: Optional[str] = None):
    """The small DLRM of :func:`machinery`: ``per_rank`` 1000 x ``dim`` tables per rank, every table
    ``kind``, bags of ``ids_per_bag`` ids (more than one: variable bags of that mean).

    Its data is cached in ``<tmp>/neo-calibrate/data`` (keyed by the generator options, reused
    by later calibrations); ``run_dir`` is where a training of it writes its logs (None:
    ``<tmp>/neo-calibrate/run<rank>``, for a config that is only inspected; :func:`machinery`
    passes a temporary folder of its own)."""
    from neo.config import config_from_dict

    W = world_size
    tmp = os.path.join(tempfile.gettempdir(), "neo-calibrate")
    tables = [{"name": f"m{k}", "num_rows": 1000, "dim": dim, "feature_names": [f"f{k}"]} for k in range(W * per_rank)]
    return config_from_dict({
        "tables": tables, "topology": {"hbm_gib": 1},
        "model": {"interaction": "dot", "dense_arch": [dim], "over_arch": [1]},
        "data": {"source": "synthetic", "synthetic": {"num_samples": 64 * batch * W, "val_samples": batch * W,
                                                      "num_dense": 4, "distribution": "uniform",
                                                      "ids_per_bag": [ids_per_bag], "variable_bags": ids_per_bag > 1,
                                                      "cache_dir": os.path.join(tmp, "data")}},
        "optim": {"type": "sgd", "lr": 0.01},
        "sharding": {"types": {t["name"]: kind for t in tables}, "cache_sample_batches": 0},
        "train": {"batch_size": batch, "steps": 40 if quick else 120, "eval_every": 0, "eval_batches": 1,
                  "log_every": 1000, "progress": False, "run_dir": run_dir or os.path.join(tmp, f"run{rank}")},
    })


def machinery(pg, quick: bool = False, kind: str = "table_wise", per_rank: int = 1, batch: int = 256,
              dim: int = 16, ids_per_bag: int = 1) -> Dict[str, Any]:
    """A small DLRM (``per_rank`` tables of ``dim`` per rank, ``batch`` samples, every table ``kind``)
    trained by the real trainer on synthetic data: its measured components (``neo.train.step_stats``)
    and its plan. The trainer's logs go to a temporary folder of this rank, removed afterwards."""
    from neo.train.trainer import Trainer

    run_dir = tempfile.mkdtemp(prefix=f"neo-calibrate-run{pg.rank}-")
    try:
        tr = Trainer(machinery_config(pg.world_size, kind, quick, pg.rank, per_rank, batch, dim, ids_per_bag,
                                      run_dir), pg=pg, log=lambda *a, **k: None)
        tr.fit()
        return {"measured": tr.step_stats.summary(), "plan": tr.plan}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def loading_cases(world_size: int, rank: int = 0) -> List[Tuple[Any, int, int, int]]:
    """:func:`loading`'s cases, ``(config, features, batch, ids a bag)``: the narrow model's one-hot
    batches; the wide model's multi-hot ones at half and all of its batch; its features one-hot at
    its whole batch (the bags of the multi-hot batch, an eighth of its ids)."""
    narrow = machinery_config(world_size, rank=rank)
    wide = machinery_config(world_size, rank=rank, per_rank=WIDE_TABLES_PER_RANK, batch=WIDE_BATCH,
                            dim=WIDE_DIM, ids_per_bag=WIDE_IDS_PER_BAG)
    wide_one_hot = machinery_config(world_size, rank=rank, per_rank=WIDE_TABLES_PER_RANK, batch=WIDE_BATCH,
                                    dim=WIDE_DIM)
    F = world_size * WIDE_TABLES_PER_RANK
    return [(narrow, world_size, 256, 1), (wide, F, WIDE_BATCH // 2, WIDE_IDS_PER_BAG),
            (wide, F, WIDE_BATCH, WIDE_IDS_PER_BAG), (wide_one_hot, F, WIDE_BATCH, 1)]


def loading(pg, quick: bool = False) -> List[Dict[str, float]]:
    """Records ``{"batches": 1, "bags", "ids", "seconds", "decode_s"}``: the loader's CPU work per
    batch on the cases of :func:`loading_cases`, so that a fit can tell the cost per batch, per
    bag and per id apart. (Without the last case the bags and ids of the other three moved
    together but for the narrow batch, whose few bags the cost per batch drowns: the fit put the
    ids' cost on the bags, ``data_id_s`` 0, and charged ``zipf_mix``'s 169 ids a sample like its
    10 bags, about half the loader's work, 2026-12-05.) ``seconds`` is the median time of making
    a batch (inline, one thread) plus ``decode_s``, the batch's share of decoding its Parquet row group
    (``ParquetLoader.decode_seconds``): the reader thread does that beside the batches, and a
    median of the batches' times leaves it out (multi-hot rows decode at about 2 us each here)."""
    from data_pipeline.loader import LoaderOptions, ParquetLoader
    from neo.train.build import resolve_tables
    from neo.train.data import prepare_data

    out = []
    n = 8 if quick else 20
    cases = loading_cases(pg.world_size, pg.rank)
    # every case's data first (made where not cached): a rank writing a new set beside one that is
    # measuring made that rank's decoding 10x slower once
    datasets = {id(cfg): prepare_data(cfg, resolve_tables(cfg), pg, log=lambda *a, **k: None) for cfg, *_ in cases}
    # and on disk: the kernel's writeback of a set just made ran under the measurements (the
    # one-hot case read 0.56 ms a batch in 2 of 6 runs on fresh sets, 0.33-0.40 in the others;
    # after a sync, 0.33-0.38 in 9 of 10 and 0.48 once: 2026-12-05 20:47-20:49 UTC)
    os.sync()
    for cfg, F, B, _ in cases:
        data = datasets[id(cfg)]
        if pg.world_size > 1:
            dist.barrier(pg.world)                       # every rank measures at once, as elsewhere here
        loader = ParquetLoader(data.train_paths, LoaderOptions(
            batch_size=B, rank=pg.rank, world_size=pg.world_size, shuffle=cfg.data.shuffle,
            shuffle_window=cfg.data.shuffle_window, seed=0, drop_last=True, prefetch_batches=0))
        it = iter(loader)
        for _ in range(3):                               # the first window's read
            next(it)
        ts, ids = [], 0
        for _ in range(n):
            t0 = time.perf_counter()
            b = next(it)
            ts.append(time.perf_counter() - t0)
            ids += int(b.sparse.values.numel())
        it.close()                                       # its reader thread stops
        ts.sort()
        decode_s, rows = loader.decode_seconds()
        out.append({"batches": 1.0, "bags": float(B * F), "ids": ids / n,
                    "seconds": ts[len(ts) // 2] + B * decode_s / rows, "decode_s": B * decode_s / rows})
    return out
