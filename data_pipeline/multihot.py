"""MLPerf DLRM-DCNv2 multi-hot data derived from one-hot data, by the reference's method.

The MLPerf reference (mlcommons/training, ``recommendation_v2/torchrec_dlrm``, ``multi_hot.py`` /
``scripts/materialize_synthetic_multihot_dataset.py``, distribution ``uniform``) builds, once, one
lookup table per feature with ``table_size`` rows and ``k`` (the feature's multi-hot size) columns:
column 0 is the row's own id, columns 1..k-1 are ``randint(0, table_size)`` drawn from NumPy's
legacy global generator seeded with 0, table after table, row-major. A one-hot id ``i`` (already
folded modulo ``table_size``) becomes the bag ``table[i]``. This module draws the same numbers
from ``numpy.random.RandomState(seed)`` in row chunks (the same stream as one call), so its bags
equal the reference's bit for bit; tables too large for memory are kept as ``.npy`` memory maps.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pyarrow.parquet as pq

from .reader import list_parquet_files, table_to_columns
from .schema import MLPERF_MULTI_HOT_SIZES, MLPERF_TABLE_SIZES, DatasetMeta, read_meta
from .writer import Columns, ShardWriter, WriterOptions, check_output_dir

__all__ = ["MultiHotOptions", "MultiHotTables", "convert_to_multihot"]


@dataclass
class MultiHotOptions:
    """How one-hot ids become multi-hot bags."""

    sizes: List[int] = field(default_factory=lambda: list(MLPERF_MULTI_HOT_SIZES))
    """Ids per bag of each feature (MLPerf: 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1)."""
    table_sizes: List[int] = field(default_factory=lambda: list(MLPERF_TABLE_SIZES))
    """Rows of each table; one-hot ids are folded modulo these first (MLPerf's ``hashes``)."""
    seed: int = 0
    """Seed of the legacy NumPy generator (MLPerf: 0)."""
    cache_dir: Optional[str] = None
    """Where tables above ``memory_limit_bytes`` are kept as .npy memory maps (reused across runs)."""
    memory_limit_bytes: int = 1 << 30
    """Total size of tables kept in memory; above it, every table goes to ``cache_dir``."""
    chunk_rows: int = 1 << 20
    """Rows drawn per call while building a table (does not change the numbers)."""


class MultiHotTables:
    """The per-feature lookup tables; ``expand(f, ids)`` gives the (n, k) bags of feature ``f``."""

    def __init__(self, opts: MultiHotOptions) -> None:
        if len(opts.sizes) != len(opts.table_sizes):
            raise ValueError(f"{len(opts.sizes)} multi-hot sizes but {len(opts.table_sizes)} table sizes")
        if min(opts.sizes) < 1:
            raise ValueError("multi-hot sizes must be >= 1")
        self.opts = opts
        total = sum(4 * r * (k - 1) for r, k in zip(opts.table_sizes, opts.sizes))
        on_disk = total > opts.memory_limit_bytes
        if on_disk and not opts.cache_dir:
            raise ValueError(f"multi-hot tables need {total / 2**30:.1f} GiB: give a cache_dir "
                             f"(or raise memory_limit_bytes)")
        self.tables: List[Optional[np.ndarray]] = []  # (rows, k - 1) int32, None when k == 1
        if on_disk:
            self._build_on_disk()
        else:
            self._build(lambda t, shape: np.empty(shape, np.int32))

    def _key(self) -> str:
        o = self.opts
        text = json.dumps([o.seed, o.sizes, o.table_sizes, "uniform", 1])
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def _build(self, alloc: Callable[[int, tuple], np.ndarray]) -> None:
        o = self.opts
        rs = np.random.RandomState(o.seed)
        for t, (rows, k) in enumerate(zip(o.table_sizes, o.sizes)):
            if k == 1:
                self.tables.append(None)
                continue
            tab = alloc(t, (rows, k - 1))
            for a in range(0, rows, o.chunk_rows):
                b = min(rows, a + o.chunk_rows)
                tab[a:b] = rs.randint(0, rows, size=(b - a, k - 1))
            self.tables.append(tab)

    def _build_on_disk(self) -> None:
        d = os.path.join(self.opts.cache_dir, f"mlperf_multihot_{self._key()}")
        done = os.path.join(d, "COMPLETE")
        names = [os.path.join(d, f"table_{t}.npy") for t in range(len(self.opts.sizes))]
        if os.path.exists(done):
            self.tables = [np.load(p, mmap_mode="r") if k > 1 else None for p, k in zip(names, self.opts.sizes)]
            return
        os.makedirs(d, exist_ok=True)
        self._build(lambda t, shape: np.lib.format.open_memmap(names[t], "w+", np.int32, shape))
        for tab in self.tables:
            if tab is not None:
                tab.flush()
        open(done, "w").close()

    def expand(self, f: int, ids: np.ndarray) -> np.ndarray:
        """(n, k) int64 bags of one-hot ids (n,) of feature f; ids are folded modulo the table size."""
        rows = self.opts.table_sizes[f]
        ids = np.asarray(ids, np.int64) % rows
        k = self.opts.sizes[f]
        out = np.empty((len(ids), k), np.int64)
        out[:, 0] = ids
        if k > 1:
            out[:, 1:] = self.tables[f][ids]
        return out


def convert_to_multihot(input_dir: str, output_dir: str, opts: MultiHotOptions,
                        writer: Optional[WriterOptions] = None,
                        progress_factory: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Stream one-hot Parquet files of ``input_dir`` (row group by row group) to multi-hot files.

    ``output_dir`` is refused if it holds an earlier run's files (unless ``writer.overwrite``); the
    output is staged and appears only when the whole conversion succeeded."""
    writer = writer or WriterOptions()
    if not os.path.isdir(input_dir):
        raise NotADirectoryError(f"input {input_dir} is not a directory of Parquet files")
    files = list_parquet_files(input_dir)
    meta = read_meta(pq.read_schema(files[0]), files[0])
    if meta.num_sparse != len(opts.sizes):
        raise ValueError(f"{files[0]}: {meta.num_sparse} sparse features, {len(opts.sizes)} multi-hot sizes")
    if os.path.abspath(input_dir) == os.path.abspath(output_dir):
        raise ValueError(f"output {output_dir} is the input directory; choose another --output")
    check_output_dir(output_dir, writer.overwrite)
    tables = MultiHotTables(opts)
    out_meta = DatasetMeta(num_dense=meta.num_dense, sparse_names=meta.sparse_names, source="multihot",
                           table_sizes=list(opts.table_sizes), multi_hot_sizes=list(opts.sizes),
                           extra={"from": input_dir, "method": "mlperf-dcnv2 uniform lookup tables",
                                  "seed": opts.seed, "one_hot_meta": meta.extra})
    w = ShardWriter(output_dir, out_meta, "fixed", writer)
    try:
        total = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
        bar = progress_factory(total=total, unit="rows", desc="multihot") if progress_factory else None
        for p in files:
            pf = pq.ParquetFile(p)
            for g in range(pf.num_row_groups):
                cols = table_to_columns(pf.read_row_group(g), meta, source=f"{p} row group {g}")  # checked
                if any(isinstance(s, tuple) or s.ndim != 1 for s in cols.sparse):
                    raise ValueError(f"{p}: multihot needs one-hot input (one id per sample and feature)")
                w.write(Columns(cols.label, cols.dense,
                                [tables.expand(f, ids) for f, ids in enumerate(cols.sparse)]))
                if bar is not None:
                    bar.update(len(cols))
        files_out = w.close()
    except BaseException:
        w.abort()
        raise
    if bar is not None:
        bar.close()
    return {"rows": w.rows_written, "files": files_out, "sizes": opts.sizes, "table_sizes": opts.table_sizes}
