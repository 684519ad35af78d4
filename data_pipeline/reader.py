"""Reading our Parquet files into numpy blocks (no torch): shared by the loader and ``inspect``."""

from __future__ import annotations

import os
from typing import List, Sequence, Union

import numpy as np
import pyarrow as pa

from .schema import DatasetMeta
from .writer import Columns

__all__ = ["take_from_parts", "list_parquet_files", "table_to_columns", "take_rows"]


def list_parquet_files(paths: Union[str, Sequence[str]]) -> List[str]:
    """A directory's ``*.parquet`` files sorted by name, or the given files in the given order."""
    if isinstance(paths, str):
        paths = [paths]
    out: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            out.extend(sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".parquet")))
        else:
            out.append(p)
    if not out:
        splits = [os.path.join(p, d) for p in paths if os.path.isdir(p) for d in sorted(os.listdir(p))
                  if os.path.isdir(os.path.join(p, d)) and any(f.endswith(".parquet") for f in os.listdir(os.path.join(p, d)))]
        hint = f"; it has split folders {splits}: pass one of them" if splits else ""
        raise FileNotFoundError(f"no Parquet files in {list(paths)}{hint}")
    missing = [p for p in out if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"no such file: {missing[0]}")
    return out


def table_to_columns(tb: pa.Table, meta: DatasetMeta) -> Columns:
    """numpy columns of a row group (views of Arrow buffers where possible)."""
    n = tb.num_rows
    label = tb.column("label").to_numpy()
    dense_col = tb.column("dense").combine_chunks()
    dense = dense_col.flatten().to_numpy().reshape(n, meta.num_dense)  # (n, D)
    sparse: List[object] = []
    for name in meta.sparse_names:
        col = tb.column(name).combine_chunks()
        t = col.type
        if pa.types.is_integer(t):
            sparse.append(col.to_numpy())  # (n,)
        elif pa.types.is_fixed_size_list(t):
            sparse.append(col.flatten().to_numpy().reshape(n, t.list_size))  # (n, k)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            offs = col.offsets.to_numpy().astype(np.int64)  # (n + 1,)
            vals = col.values.to_numpy()[offs[0]:offs[-1]]
            sparse.append((vals, offs - offs[0]))
        else:
            raise TypeError(f"column {name}: unsupported type {t}")
    return Columns(label, dense, sparse)


def take_from_parts(parts: Sequence[Columns], idx: np.ndarray) -> Columns:
    """Rows ``idx`` (indices into the blocks ``parts`` laid end to end), in ``idx``'s order.

    The shuffled loader takes each batch this way from a window's row groups: the work is per
    batch (no copy of the whole window up front, which stalled training once per window)."""
    if len(parts) == 1:
        return take_rows(parts[0], idx)
    bounds = np.cumsum([0] + [len(p) for p in parts])
    part = np.searchsorted(bounds, idx, side="right") - 1
    order = np.argsort(part, kind="stable")                       # rows grouped by part
    pieces = [take_rows(parts[p], idx[order[part[order] == p]] - bounds[p]) for p in np.unique(part)]
    grouped = Columns.concat(pieces)
    return take_rows(grouped, np.argsort(order, kind="stable"))   # back to idx's order


def take_rows(cols: Columns, idx: np.ndarray) -> Columns:
    """Rows ``idx`` of a block (jagged columns gathered vectorially)."""
    sp: List[object] = []
    for s in cols.sparse:
        if isinstance(s, tuple):
            vals, offs = s
            lens = offs[idx + 1] - offs[idx]  # (m,)
            new_offs = np.zeros(len(idx) + 1, np.int64)
            np.cumsum(lens, out=new_offs[1:])
            src = np.repeat(offs[idx] - new_offs[:-1], lens) + np.arange(new_offs[-1])
            sp.append((vals[src], new_offs))
        else:
            sp.append(s[idx])
    return Columns(cols.label[idx], cols.dense[idx], sp)
