"""Sharded Parquet writer: fixed-size row groups, a new file every ``rows_per_file`` rows."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .schema import DatasetMeta, arrow_schema

__all__ = ["WriterOptions", "ShardWriter", "Columns", "columns_to_table", "OutputExistsError",
           "check_output_dir", "staging_path", "commit_staged_dir", "remove_staged", "write_json_replacing"]


@dataclass
class WriterOptions:
    """How Parquet shards are cut and encoded."""

    rows_per_file: int = 4 * 1024 * 1024
    """Rows per Parquet file (the last file of a split may hold fewer)."""
    row_group_rows: int = 128 * 1024
    """Rows per row group, the unit the loader reads (the last group of a file may hold fewer)."""
    compression: str = "lz4"
    """Parquet codec: lz4, snappy, zstd or none."""
    overwrite: bool = False
    """Replace the Parquet files an earlier run left in the output directory. Without it a command
    refuses such a directory: the loader reads every ``*.parquet`` of a folder, so new shards
    written next to old ones would silently mix two runs."""


@dataclass
class Columns:
    """A block of rows in memory, column-wise.

    ``sparse[f]`` is either a (n,) int64 array (one-hot) or a (n, k) int64 array
    (fixed-size multi-hot) or a pair (values (nnz,), offsets (n + 1,)) for variable bags.
    """

    label: np.ndarray  # (n,) int8
    dense: np.ndarray  # (n, D) float32
    sparse: List[object]

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def slice(self, a: int, b: int) -> "Columns":
        sp: List[object] = []
        for s in self.sparse:
            if isinstance(s, tuple):
                vals, offs = s
                sp.append((vals[offs[a]:offs[b]], offs[a:b + 1] - offs[a]))
            else:
                sp.append(s[a:b])
        return Columns(self.label[a:b], self.dense[a:b], sp)

    @staticmethod
    def concat(parts: Sequence["Columns"]) -> "Columns":
        if len(parts) == 1:
            return parts[0]
        sp: List[object] = []
        for f in range(len(parts[0].sparse)):
            first = parts[0].sparse[f]
            if isinstance(first, tuple):
                vals = np.concatenate([p.sparse[f][0] for p in parts])
                lens = np.concatenate([np.diff(p.sparse[f][1]) for p in parts])
                offs = np.zeros(len(lens) + 1, np.int64)
                np.cumsum(lens, out=offs[1:])
                sp.append((vals, offs))
            else:
                sp.append(np.concatenate([p.sparse[f] for p in parts]))
        return Columns(np.concatenate([p.label for p in parts]),
                       np.concatenate([p.dense for p in parts]), sp)


def columns_to_table(cols: Columns, schema: pa.Schema) -> pa.Table:
    """Arrow table of a block (no copies beyond Arrow's wrapping of the numpy buffers)."""
    n = len(cols)
    d = cols.dense.shape[1]
    arrays = [pa.array(cols.label.astype(np.int8, copy=False)),
              pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(cols.dense, np.float32).reshape(-1)), d)]
    for f, s in enumerate(cols.sparse):
        t = schema.field(2 + f).type
        if pa.types.is_list(t):  # variable bags; dense blocks are turned into (values, offsets)
            if isinstance(s, tuple):
                vals, offs = s
            else:
                k = 1 if s.ndim == 1 else s.shape[1]
                vals, offs = s.reshape(-1), np.arange(0, n * k + 1, k, dtype=np.int64)
            arrays.append(pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)),
                                                   pa.array(np.asarray(vals, np.int64))))
        elif pa.types.is_fixed_size_list(t):
            if isinstance(s, tuple) or s.reshape(n, -1).shape[1] != t.list_size:
                raise ValueError(f"{schema.field(2 + f).name}: expected bags of exactly {t.list_size} ids")
            arrays.append(pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(s, np.int64).reshape(-1)), t.list_size))
        else:
            if isinstance(s, tuple) or s.ndim != 1:
                raise ValueError(f"{schema.field(2 + f).name}: one-hot column needs one id per sample")
            arrays.append(pa.array(s.astype(np.int64, copy=False)))
    assert all(len(a) == n for a in arrays)
    return pa.Table.from_arrays(arrays, schema=schema)


class OutputExistsError(FileExistsError):
    """An output directory already holds Parquet files (of an earlier run) and no overwrite was asked."""


def _parquet_files(directory: str) -> List[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))


def check_output_dir(directory: str, overwrite: bool) -> None:
    """Refuse ``directory`` if it holds Parquet files, unless ``overwrite`` and they are all ours
    (``part-*.parquet``, replaced on commit). Called before any work so that a rerun fails at once;
    a foreign ``*.parquet`` is never deleted, and the loader would read it with our shards."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise OutputExistsError(f"output {directory} exists and is not a directory")
    old = _parquet_files(directory)
    if not old:
        return
    if not overwrite:
        raise OutputExistsError(f"output directory {directory} already holds {len(old)} Parquet file(s) "
                                f"({old[0]}, ...) of an earlier run; pass --overwrite to replace them, "
                                f"or choose another --output")
    foreign = [f for f in old if not f.startswith("part-")]
    if foreign:
        raise OutputExistsError(f"output directory {directory} holds Parquet files not written by neo-data "
                                f"({foreign[0]}, ...) that the loader would read with the new shards; "
                                f"move them away or choose another --output")


def staging_path(final: str) -> str:
    """Hidden sibling ``<parent>/.<name>.tmp-<pid>`` where an output is written before it is
    committed: a run that fails leaves nothing that looks like a data set."""
    final = os.path.normpath(final)
    parent, name = os.path.split(final)
    return os.path.join(parent, f".{name}.tmp-{os.getpid()}")


def commit_staged_dir(staged: str, final: str, overwrite: bool,
                      check: Callable[[str, bool], None] = check_output_dir,
                      earlier: Callable[[str], List[str]] = _parquet_files) -> None:
    """Move the staged directory's files to ``final``: one atomic rename where ``final`` does not
    exist yet; else the earlier run's files (``earlier``: the old ``part-*.parquet``) go (with
    ``overwrite``; re-checked by ``check``) and the new files are moved in, so that the directory
    never holds two runs' outputs."""
    if not os.path.exists(final):
        os.rename(staged, final)
        return
    check(final, overwrite)
    for old in earlier(final):
        os.remove(os.path.join(final, old))
    for name in sorted(os.listdir(staged)):
        os.replace(os.path.join(staged, name), os.path.join(final, name))
    os.rmdir(staged)


def json_ready(obj):
    """``obj`` for strict JSON: numpy scalars as Python numbers, NaN and infinities as None (a
    metric of an empty data set; ``json.dumps`` would write the bare word NaN, which JSON parsers
    refuse), recursively through dicts, lists and tuples."""
    import math

    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():
        obj = obj.item()                                  # a numpy or torch scalar
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json_replacing(path: str, obj) -> None:
    """Write ``obj`` as JSON through a staged file renamed over ``path``: a reader sees the old
    file or the new one, whole (a run's ``summary.json``)."""
    import json

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = staging_path(path)
    with open(tmp, "w") as f:
        json.dump(json_ready(obj), f, indent=2, default=float, allow_nan=False)
    os.replace(tmp, path)


def remove_staged(path: str) -> None:
    """Remove a staged (uncommitted) file or directory; no error if it is gone."""
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


class ShardWriter:
    """Writes blocks of rows to ``<directory>/part-00000.parquet``, ``part-00001`` ..., in order.

    The files are written to a hidden staging sibling (:func:`staging_path`) and appear in
    ``directory`` only on :meth:`commit` (done by ``close()`` unless ``close(commit=False)``, which
    writers of several splits use to commit them together once all succeeded); :meth:`abort`
    removes the staged files. ``directory`` is checked first (:func:`check_output_dir`)."""

    def __init__(self, directory: str, meta: DatasetMeta, sparse_kind: str, options: WriterOptions) -> None:
        self.directory = directory
        self.options = options
        self.schema = arrow_schema(meta, sparse_kind)
        check_output_dir(directory, options.overwrite)
        self.staging = staging_path(directory)
        remove_staged(self.staging)              # a leftover of a killed run with this pid
        os.makedirs(self.staging)
        self._pending: List[Columns] = []
        self._pending_rows = 0
        self._writer: Optional[pq.ParquetWriter] = None
        self._rows_in_file = 0
        self.files: List[str] = []
        self.rows_written = 0

    def write(self, cols: Columns) -> None:
        if len(cols) == 0:
            return
        self._pending.append(cols)
        self._pending_rows += len(cols)
        while self._pending_rows >= self._next_group_rows():
            self._flush_group(self._next_group_rows())

    def _next_group_rows(self) -> int:
        room = self.options.rows_per_file - self._rows_in_file
        return min(self.options.row_group_rows, room)

    def _flush_group(self, rows: int) -> None:
        block = Columns.concat(self._pending)
        head, tail = block.slice(0, rows), block.slice(rows, len(block))
        self._pending = [tail] if len(tail) else []
        self._pending_rows = len(tail)
        if self._writer is None:
            name = f"part-{len(self.files):05d}.parquet"
            self.files.append(os.path.join(self.directory, name))
            path = os.path.join(self.staging, name)
            comp = None if self.options.compression == "none" else self.options.compression
            self._writer = pq.ParquetWriter(path, self.schema, compression=comp, use_dictionary=False,
                                            write_statistics=False)
        self._writer.write_table(columns_to_table(head, self.schema), row_group_size=rows)
        self._rows_in_file += rows
        self.rows_written += rows
        if self._rows_in_file >= self.options.rows_per_file:
            self._writer.close()
            self._writer = None
            self._rows_in_file = 0

    def close(self, commit: bool = True) -> List[str]:
        """Flush the last partial row group and close; returns the files written (their paths in
        ``directory``, where they are once committed)."""
        if self._pending_rows:
            self._flush_group(self._pending_rows)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self.files:  # an empty split still gets one (empty) file carrying the schema
            pq.write_table(self.schema.empty_table(), os.path.join(self.staging, "part-00000.parquet"))
            self.files.append(os.path.join(self.directory, "part-00000.parquet"))
        if commit:
            self.commit()
        return self.files

    def commit(self) -> None:
        """Put the closed, staged files in place (see :func:`commit_staged_dir`)."""
        commit_staged_dir(self.staging, self.directory, self.options.overwrite)

    def abort(self) -> None:
        """Close the open file (if any) and remove the staged files: a failed run leaves no output."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:   # noqa: BLE001  (the run already failed; its error is the one to report)
                pass
            self._writer = None
        remove_staged(self.staging)
