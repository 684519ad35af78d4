"""``neo-data inspect``: schema, row counts and feature statistics of a data set's Parquet files."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import pyarrow.parquet as pq

from .reader import list_parquet_files, table_to_columns
from .schema import read_meta

__all__ = ["inspect_dataset"]


def inspect_dataset(paths: Union[str, Sequence[str]], max_rows: Optional[int] = 1_000_000,
                    progress_factory: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Schema, metadata, row and row-group counts (all files, from the footers) and statistics of
    the first ``max_rows`` rows (all rows if None): label mean, per dense feature mean / std / min /
    max / share of zeros, per sparse feature min / max id, mean bag size, distinct ids."""
    files = list_parquet_files(paths)
    meta = read_meta(pq.read_schema(files[0]), files[0])
    per_file = []
    total = 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        per_file.append({"path": f, "rows": md.num_rows, "row_groups": md.num_row_groups})
        total += md.num_rows
    limit = total if max_rows is None else min(total, max_rows)
    bar = progress_factory(total=limit, unit="rows", desc="inspect") if progress_factory else None
    D, F = meta.num_dense, meta.num_sparse
    n = 0
    pos = 0
    s1, s2 = np.zeros(D), np.zeros(D)
    dmin, dmax = np.full(D, np.inf), np.full(D, -np.inf)
    zeros = np.zeros(D)
    ids_min = np.full(F, np.iinfo(np.int64).max)
    ids_max = np.full(F, np.iinfo(np.int64).min)
    nnz = np.zeros(F, np.int64)
    distinct: List[List[np.ndarray]] = [[] for _ in range(F)]
    for f in files:
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            if n >= limit:
                break
            cols = table_to_columns(pf.read_row_group(g), meta, source=f"{f} row group {g}")
            take = min(len(cols), limit - n)
            cols = cols.slice(0, take)
            d = cols.dense.astype(np.float64)
            s1 += d.sum(0)
            s2 += (d * d).sum(0)
            if take:
                dmin = np.minimum(dmin, d.min(0))
                dmax = np.maximum(dmax, d.max(0))
            zeros += (d == 0).sum(0)
            pos += int(cols.label.sum())
            for j, sp in enumerate(cols.sparse):
                v = np.asarray(sp[0] if isinstance(sp, tuple) else sp).reshape(-1)
                nnz[j] += len(v)
                if len(v):
                    ids_min[j] = min(ids_min[j], int(v.min()))
                    ids_max[j] = max(ids_max[j], int(v.max()))
                    distinct[j] = [np.unique(np.concatenate(distinct[j] + [np.unique(v)]))]
            n += take
            if bar is not None:
                bar.update(take)
    if bar is not None:
        bar.close()
    mean = s1 / max(n, 1)
    std = np.sqrt(np.maximum(s2 / max(n, 1) - mean * mean, 0))
    dense_stats = [{"feature": f"dense[{j}]", "mean": float(mean[j]), "std": float(std[j]),
                    "min": float(dmin[j]) if n else None, "max": float(dmax[j]) if n else None,
                    "zero_share": float(zeros[j] / max(n, 1))} for j in range(D)]
    sparse_stats = [{"feature": meta.sparse_names[j], "min_id": int(ids_min[j]) if nnz[j] else None,
                     "max_id": int(ids_max[j]) if nnz[j] else None, "mean_bag": float(nnz[j] / max(n, 1)),
                     "distinct_ids": int(len(distinct[j][0])) if distinct[j] else 0} for j in range(F)]
    return {
        "files": per_file, "num_files": len(files), "rows": total,
        "schema": str(pq.read_schema(files[0]).remove_metadata()),
        "meta": {"num_dense": meta.num_dense, "num_sparse": meta.num_sparse, "source": meta.source,
                 "table_sizes": meta.table_sizes, "multi_hot_sizes": meta.multi_hot_sizes, "extra": meta.extra},
        "statistics": {"rows_scanned": n, "label_mean": pos / max(n, 1), "dense": dense_stats,
                       "sparse": sparse_stats},
    }
