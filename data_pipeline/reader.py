"""Reading our Parquet files into numpy blocks (no torch; Neo's C++ gather where built): shared by the
loader and ``inspect``."""

from __future__ import annotations

import os
from typing import List, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from neo.cpp import cpu_kernels

from .schema import DatasetMeta
from .writer import Columns

__all__ = ["take_from_parts", "list_parquet_files", "table_to_columns", "take_rows", "jagged_take",
           "jagged_take_reference", "fixed_take", "fixed_take_reference", "load_arrow_conversions"]


def load_arrow_conversions() -> None:
    """Pays now what pyarrow's first ``to_numpy`` of a process costs: where pandas is installed it
    imports pandas then (0.2-0.3 s). Called where a loader is built, so that the first batch of
    training does not wait for an import (the tiny MLPerf config's 48 timed steps take 0.3 s)."""
    pa.array([0], pa.int64()).to_numpy()


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
    batch (no copy of the whole window up front, which stalled training once per window). Each
    output row is copied once, from its block to its place (a multi-hot column by
    :func:`jagged_take`)."""
    if len(parts) == 1:
        return take_rows(parts[0], idx)
    bounds = np.cumsum([0] + [len(p) for p in parts])
    part = np.asarray(np.searchsorted(bounds, idx, side="right") - 1, dtype=np.int64)   # (m,) block of each row
    row = np.asarray(idx - bounds[part], dtype=np.int64)                                # (m,) its row in the block
    sparse: List[object] = []
    for f in range(len(parts[0].sparse)):
        cols = [p.sparse[f] for p in parts]
        sparse.append(jagged_take(cols, part, row) if isinstance(cols[0], tuple) else fixed_take(cols, part, row))
    return Columns(fixed_take([p.label for p in parts], part, row), fixed_take([p.dense for p in parts], part, row),
                   sparse)


def fixed_take(blocks: Sequence[np.ndarray], part: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Rows ``row[i]`` of blocks ``blocks[part[i]]`` (arrays of one dtype and row shape, e.g. a
    column's row groups): Neo's C++ copy (``neo._C.fixed_take``: one pass, no per-block masks,
    the GIL released) where the extension is built, else :func:`fixed_take_reference`; both give
    the same array. A shuffled batch of 256 rows from four row groups: 5 us a column, against 25."""
    _C = cpu_kernels("fixed_take")
    if _C is None or any(b.dtype != blocks[0].dtype or b.shape[1:] != blocks[0].shape[1:] for b in blocks):
        return fixed_take_reference(blocks, part, row)
    out = np.empty((len(row),) + blocks[0].shape[1:], dtype=blocks[0].dtype)
    _C.fixed_take([np.ascontiguousarray(b) for b in blocks], np.ascontiguousarray(part, dtype=np.int64),
                  np.ascontiguousarray(row, dtype=np.int64), out)
    return out


def fixed_take_reference(blocks: Sequence[np.ndarray], part: np.ndarray, row: np.ndarray) -> np.ndarray:
    """numpy reference of :func:`fixed_take` (a boolean-mask copy per block)."""
    out = np.empty((len(row),) + blocks[0].shape[1:], dtype=np.result_type(*[b.dtype for b in blocks]))
    for p in np.unique(part):
        sel = part == p
        out[sel] = blocks[p][row[sel]]
    return out


def jagged_take(blocks: Sequence[Tuple[np.ndarray, np.ndarray]], part: np.ndarray, row: np.ndarray
                ) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, offsets from 0) of rows ``row[i]`` of jagged blocks ``blocks[part[i]]`` = (ids, offsets).

    Neo's C++ copy (``neo._C.jagged_take``: one pass, the blocks' ids read in place) where the
    extension is built, else :func:`jagged_take_reference`; both give the same arrays."""
    _C = cpu_kernels("jagged_take")
    if _C is None:                        # data_pipeline used without Neo's extension
        return jagged_take_reference(blocks, part, row)
    dtype = blocks[0][0].dtype
    if dtype not in (np.int32, np.int64) or any(v.dtype != dtype for v, _ in blocks):
        dtype = np.int64                  # other integer widths, or blocks that differ: as int64
    ids = [np.ascontiguousarray(v, dtype=dtype) for v, _ in blocks]
    offs = [np.ascontiguousarray(o, dtype=np.int64) for _, o in blocks]
    out, out_offs = _C.jagged_take(ids, offs, np.ascontiguousarray(part, dtype=np.int64),
                                   np.ascontiguousarray(row, dtype=np.int64))
    return out.numpy(), out_offs.numpy()


def jagged_take_reference(blocks: Sequence[Tuple[np.ndarray, np.ndarray]], part: np.ndarray, row: np.ndarray
                          ) -> Tuple[np.ndarray, np.ndarray]:
    """numpy reference of :func:`jagged_take`."""
    lens = np.array([blocks[p][1][r + 1] - blocks[p][1][r] for p, r in zip(part.tolist(), row.tolist())],
                    dtype=np.int64)
    offs = np.zeros(len(row) + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    pieces = [blocks[p][0][blocks[p][1][r]:blocks[p][1][r + 1]] for p, r in zip(part.tolist(), row.tolist())]
    dtype = np.result_type(*[v.dtype for v, _ in blocks])
    return (np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.zeros(0, dtype)), offs


def take_rows(cols: Columns, idx: np.ndarray) -> Columns:
    """Rows ``idx`` of a block (jagged columns by :func:`jagged_take`)."""
    sp: List[object] = []
    idx = np.asarray(idx, dtype=np.int64)
    block = np.zeros(len(idx), np.int64)
    for s in cols.sparse:
        sp.append(jagged_take([s], block, idx) if isinstance(s, tuple) else s[idx])
    return Columns(cols.label[idx], cols.dense[idx], sp)
