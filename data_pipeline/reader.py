"""Reading our Parquet files into numpy blocks (no torch; Neo's C++ gather where built): shared by the
loader and ``inspect``."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from neo.cpp import cpu_kernels

from .schema import DataFileError, DatasetMeta
from .writer import Columns

__all__ = ["take_from_parts", "list_parquet_files", "table_to_columns", "take_rows", "jagged_take",
           "jagged_take_reference", "fixed_take", "fixed_take_reference", "load_arrow_conversions",
           "check_parquet_file", "first_id_out_of_range"]

_MAGIC = b"PAR1"


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
    for p in out:
        check_parquet_file(p)
    return out


def check_parquet_file(path: str) -> None:
    """A clear error naming ``path`` if it cannot be a complete Parquet file: empty, not a regular
    file, no ``PAR1`` magic at both ends, or a footer longer than the file (cut short). Reads 8
    bytes at each end (pages the footer read needs next anyway); pyarrow's own error for these is
    ``Parquet magic bytes not found`` with no file name."""
    if not os.path.isfile(path):
        raise DataFileError(f"{path}: not a regular file")
    size = os.path.getsize(path)
    if size < 12:
        raise DataFileError(f"{path}: not a Parquet file ({size} bytes; empty or cut short)")
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(size - 8)
        tail = f.read(8)
    if head != _MAGIC or tail[4:] != _MAGIC:
        raise DataFileError(f"{path}: not a Parquet file, or cut short (no 'PAR1' magic bytes at its "
                            f"{'start' if head != _MAGIC else 'end'})")
    footer = int.from_bytes(tail[:4], "little")
    if footer + 12 > size:
        raise DataFileError(f"{path}: corrupt Parquet footer (length {footer} in a file of {size} bytes)")


def table_to_columns(tb: pa.Table, meta: DatasetMeta, source: str = "") -> Columns:
    """numpy columns of a row group (views of Arrow buffers where possible), checked: no nulls,
    labels finite and in [0, 1], dense rows of exactly D finite values, ids integers. A bad value
    is a :class:`DataFileError` naming ``source`` (e.g. ``<file> row group <g>``), the column and
    the first bad row, never a silent shift of rows or a NaN in training. The checks are vector
    reductions over arrays already decoded (about 1 ms a 128k-row Criteo group)."""
    where = f"{source}: " if source else ""
    n = tb.num_rows
    label = _label(_column(tb, "label", where), where)
    dense = _dense(_column(tb, "dense", where), n, meta.num_dense, where)
    sparse: List[object] = []
    for name in meta.sparse_names:
        col = _column(tb, name, where)
        t = col.type
        if pa.types.is_integer(t):
            sparse.append(col.to_numpy())  # (n,)
        elif pa.types.is_fixed_size_list(t) and pa.types.is_integer(t.value_type):
            sparse.append(col.flatten().to_numpy().reshape(n, t.list_size))  # (n, k)
        elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type):
            offs = col.offsets.to_numpy().astype(np.int64)  # (n + 1,)
            vals = col.values.to_numpy()[offs[0]:offs[-1]]
            sparse.append((vals, offs - offs[0]))
        else:
            raise DataFileError(f"{where}column {name!r}: unsupported type {t} (integer ids, or lists of them)")
    return Columns(label, dense, sparse)


def _column(tb: pa.Table, name: str, where: str) -> pa.Array:
    """Column ``name`` as one array, with no nulls in it or (for lists) in its values."""
    if tb.schema.get_field_index(name) < 0:
        raise DataFileError(f"{where}column {name!r} is missing (have {tb.column_names})")
    chunked = tb.column(name)
    if chunked.null_count:          # known per chunk: no scan
        row = int(np.flatnonzero(chunked.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataFileError(f"{where}column {name!r}: {chunked.null_count} null value(s), the first in row {row}")
    col = chunked.combine_chunks()
    if _is_list(col.type):
        nulls = col.flatten().null_count
        if nulls:
            raise DataFileError(f"{where}column {name!r}: {nulls} null value(s) inside its lists")
    return col


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def first_bad_label(label: np.ndarray) -> Optional[Tuple[int, int]]:
    """(first row, how many) of the labels outside [0, 1] (NaN fails the range test too), or None."""
    if not len(label) or (label.min() >= 0 and label.max() <= 1):
        return None
    bad = ~((label >= 0) & (label <= 1))
    return int(np.flatnonzero(bad)[0]), int(bad.sum())


def first_id_out_of_range(sparse: Sequence[object], limits: Sequence[Optional[int]]
                           ) -> Optional[Tuple[int, int, int]]:
    """(feature, row, id) of the first id outside ``[0, limits[f])`` in columns ``sparse`` (one
    per feature: (n,) or (n, k) arrays, or (values, offsets) of a list column), or None. A
    feature whose limit is None is not checked. One min / max per column first: only a column
    that fails them is searched. ``limits`` of another length than ``sparse`` is an error (a short
    list would leave the last columns unchecked)."""
    if len(limits) != len(sparse):
        raise ValueError(f"id_limits has {len(limits)} entries for {len(sparse)} sparse columns: give one per "
                         f"column, in the data's order (None: not checked)")
    for f, (col, limit) in enumerate(zip(sparse, limits)):
        if limit is None:
            continue
        values = col[0] if isinstance(col, tuple) else col
        if not values.size or (values.min() >= 0 and values.max() < limit):
            continue
        flat = np.asarray(values).reshape(-1)
        at = int(np.flatnonzero((flat < 0) | (flat >= limit))[0])
        if isinstance(col, tuple):
            row = int(np.searchsorted(col[1], at, side="right")) - 1        # the list holding it
        else:
            row = at // (values.shape[1] if values.ndim == 2 else 1)
        return f, row, int(flat[at])
    return None


def first_nonfinite(dense: np.ndarray) -> Optional[Tuple[int, int, int]]:
    """(row, feature, how many) of the first NaN or inf of ``dense`` (n, D), or None. One sum
    first: only when it is not finite (a NaN or inf anywhere makes it so, finite values rarely)
    is the array searched."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(dense, axis=None) if dense.size else 0.0
    if np.isfinite(total):
        return None
    bad = ~np.isfinite(dense)
    if not bad.any():                      # the sum's overflow alone is no error
        return None
    row, j = (int(x) for x in np.argwhere(bad)[0])
    return row, j, int(bad.sum())


def _label(col: pa.Array, where: str) -> np.ndarray:
    """(n,) labels; integers or floats, every one in [0, 1] (NaN fails the range test too)."""
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise DataFileError(f"{where}column 'label': type {col.type}, expected integers (0 or 1)")
    label = col.to_numpy()
    bad = first_bad_label(label)
    if bad is not None:
        raise DataFileError(f"{where}column 'label': row {bad[0]} holds {label[bad[0]]}, labels must be in [0, 1]")
    return label


def _dense(col: pa.Array, n: int, width: int, where: str) -> np.ndarray:
    """(n, D) dense features: a list column whose rows all hold exactly D finite floats (a variable
    list column is checked row by row, vectorized, before the values are reshaped)."""
    t = col.type
    vt = t.value_type if _is_list(t) else None
    if vt is None or not pa.types.is_floating(vt):
        raise DataFileError(f"{where}column 'dense': type {t}, expected a list of {width} floats per row")
    if pa.types.is_fixed_size_list(t):
        if t.list_size != width:
            raise DataFileError(f"{where}column 'dense': {t.list_size} values per row, the metadata says {width}")
    else:
        lens = np.diff(col.offsets.to_numpy())
        bad = np.flatnonzero(lens != width)
        if len(bad):
            raise DataFileError(f"{where}column 'dense': row {int(bad[0])} holds {int(lens[bad[0]])} values, "
                                f"the metadata says {width} per row ({len(bad)} such rows)")
    dense = col.flatten().to_numpy().reshape(n, width)  # (n, D)
    bad = first_nonfinite(dense)
    if bad is not None:
        row, j, count = bad
        raise DataFileError(f"{where}column 'dense': row {row} feature {j} is {dense[row, j]} "
                            f"({count} non-finite values); dense features must be finite")
    return dense


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
