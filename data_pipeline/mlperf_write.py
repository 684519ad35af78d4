"""Writing MLPerf DLRM-DCNv2's Criteo day files (the layout :mod:`.mlperf_layout` reads), from
synthetic data (the planted teacher) or from Parquet written by ``neo-data``.

    neo-data mlperf-layout --from-synthetic --samples 1000000 --days 3 -o mlperf_syn/
    neo-data mlperf-layout --from-parquet out/train --eval-parquet out/validation out/test --days 23 -o mlperf/

Training samples are cut into ``days`` near-equal days ``0..days-1`` (file order); the eval
samples form day ``days`` (the reader's validation half first, test half second). Files are
written like the reference's: dense float32 (n, D), labels int32 (n, 1), one-hot ids (n, F) and
multi-hot bags (n, k_f) as int32 (int64 only when a table has more than 2^31 rows), the ``.npz``
stored (not compressed) with the members ``np.savez`` names ``0.npy`` ... A ``neo_layout.json``
beside them records the days, the source, the config keys that read them and, for synthetic
data, the teacher's best achievable AUC.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .mlperf_layout import LAYOUTS, META_FILE, day_files
from .writer import Columns, OutputExistsError, commit_staged_dir, remove_staged, staging_path

__all__ = ["DayWriter", "layout_from_synthetic", "layout_from_parquet", "check_days_output"]


# ----------------------------------------------------------------------------- writing
class DayWriter:
    """Writes one day's three files from consecutive row blocks (exactly ``rows`` rows in all).

    ``.npy`` files are ``np.lib.format.open_memmap`` files filled in place; the ``.npz`` is built at
    :meth:`close` from one temporary ``.npy`` per feature (so the day's sparse bytes are on disk
    twice for a moment), stored (``ZIP_STORED``, zip64 when large) under the names ``np.savez``
    gives (``0.npy`` ..), so the reference's reader maps it."""

    def __init__(self, directory: str, day: int, layout: str, rows: int, num_dense: int, bag_sizes: Sequence[int],
                 id_dtype=np.int32) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {list(LAYOUTS)}")
        if layout == "one_hot" and any(k != 1 for k in bag_sizes):
            raise ValueError(f"the one_hot layout holds one id per feature; bag sizes {list(bag_sizes)}")
        os.makedirs(directory, exist_ok=True)
        self.paths = day_files(directory, day, layout)
        self.layout, self.rows, self.written, self.bags = layout, rows, 0, list(bag_sizes)
        self.id_max = np.iinfo(id_dtype).max
        mm = np.lib.format.open_memmap
        self.dense = mm(self.paths[0], "w+", np.float32, (rows, num_dense))
        self.labels = mm(self.paths[2], "w+", np.int32, (rows, 1))
        if layout == "one_hot":
            self.parts = [self.paths[1]]
            self.sparse = [mm(self.paths[1], "w+", id_dtype, (rows, len(bag_sizes)))]
        else:
            self.parts = [f"{self.paths[1]}.part{f}.npy" for f in range(len(bag_sizes))]
            self.sparse = [mm(p, "w+", id_dtype, (rows, k)) for p, k in zip(self.parts, bag_sizes)]

    def write(self, cols: Columns) -> None:
        a, b = self.written, self.written + len(cols)
        if b > self.rows:
            raise ValueError(f"{self.paths[0]}: {b} rows written, the day holds {self.rows}")
        if len(cols.sparse) != len(self.bags):
            raise ValueError(f"{len(cols.sparse)} sparse features, the day holds {len(self.bags)}")
        self.dense[a:b] = cols.dense
        self.labels[a:b, 0] = cols.label
        for f, s in enumerate(cols.sparse):
            if isinstance(s, tuple):
                raise ValueError(f"feature {f}: variable-size bags; the MLPerf layout holds fixed bags")
            s = np.asarray(s).reshape(len(cols), -1)  # (n, k)
            if s.shape[1] != self.bags[f]:
                raise ValueError(f"feature {f}: bags of {s.shape[1]} ids, the {self.layout} layout here "
                                 f"holds {self.bags[f]}")
            if len(s) and (s.min() < 0 or s.max() > self.id_max):
                bad = int(s.min()) if s.min() < 0 else int(s.max())
                raise ValueError(f"feature {f}: id {bad} is not in [0, {self.id_max}] ({self.sparse[0].dtype})")
            if self.layout == "one_hot":
                self.sparse[0][a:b, f] = s[:, 0]
            else:
                self.sparse[f][a:b] = s
        self.written = b

    def close(self) -> None:
        if self.written != self.rows:
            raise ValueError(f"{self.paths[0]}: {self.written} rows written, the day holds {self.rows}")
        for m in [self.dense, self.labels] + self.sparse:
            m.flush()
        del self.dense, self.labels, self.sparse
        if self.layout == "multi_hot":
            tmp = self.paths[1] + ".tmp"
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for f, p in enumerate(self.parts):
                    zf.write(p, arcname=f"{f}.npy")
            os.replace(tmp, self.paths[1])
            for p in self.parts:
                os.remove(p)


# ----------------------------------------------------------------------------- the output directory
_DAY_FILE = re.compile(r"day_\d+_(dense\.npy|labels\.npy|sparse\.npy|sparse_multi_hot\.npz)$")


def _layout_files(directory: str) -> List[str]:
    """The files an earlier run of this writer left in ``directory``: day files and ``neo_layout.json``."""
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if _DAY_FILE.match(f) or f == META_FILE)


def check_days_output(directory: str, overwrite: bool) -> None:
    """Refuse ``directory`` if it holds day files or a ``neo_layout.json`` (of an earlier run, or
    MLPerf's own data), unless ``overwrite`` and a ``neo_layout.json`` says an earlier run of this
    writer made them (MLPerf's own days are never deleted): called before any work, so that a rerun
    fails at once instead of leaving old days next to new ones (a config's ``val_day`` would read
    the old)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise OutputExistsError(f"output {directory} exists and is not a directory")
    old = _layout_files(directory)
    if old and not overwrite:
        raise OutputExistsError(f"output directory {directory} already holds {len(old)} file(s) of an earlier "
                                f"run ({old[0]}, ...); pass --overwrite to replace them, or choose another --output")
    if old and META_FILE not in old:
        raise OutputExistsError(f"output directory {directory} holds day files ({old[0]}, ...) without a "
                                f"{META_FILE}: not written by neo-data (e.g. MLPerf's own data), so never "
                                f"replaced; choose another --output")


def _commit_days(staged: str, final: str, overwrite: bool) -> None:
    """The staged days into ``final``: one rename where it does not exist; else (re-checked) the
    earlier run's day files go and the new ones move in: never two runs' days side by side."""
    commit_staged_dir(staged, final, overwrite, check=check_days_output, earlier=_layout_files)


def _staged(write: Callable[[str], Dict[str, Any]], output: str, overwrite: bool) -> Dict[str, Any]:
    """``write(directory)`` into a hidden sibling of ``output``, committed on success, removed on
    failure: the days appear only whole, and a failed run leaves no partial day or temporary file."""
    check_days_output(output, overwrite)
    staged = staging_path(output)
    remove_staged(staged)
    try:
        meta = write(staged)
        _commit_days(staged, output, overwrite)
    except BaseException:
        remove_staged(staged)
        raise
    return meta


# ----------------------------------------------------------------------------- converters
def _day_sizes(total: int, days: int) -> List[int]:
    if days <= 0 or total < days:
        raise ValueError(f"{total} training samples cannot fill {days} day(s)")
    return [(d + 1) * total // days - d * total // days for d in range(days)]


def _write_days(blocks: Iterable[Columns], directory: str, layout: str, sizes: Sequence[int], num_dense: int,
                bag_sizes: Sequence[int], id_dtype, progress=None) -> None:
    """Route consecutive row blocks into days 0, 1, ... of ``sizes`` rows."""
    bar = progress(total=sum(sizes), unit="rows", desc="mlperf-layout") if progress else None
    day, w = 0, None
    for cols in blocks:
        i = 0
        while i < len(cols):
            if w is None:
                w = DayWriter(directory, day, layout, sizes[day], num_dense, bag_sizes, id_dtype)
            take = min(len(cols) - i, w.rows - w.written)
            w.write(cols.slice(i, i + take))
            i += take
            if w.written == w.rows:
                w.close()
                w, day = None, day + 1
        if bar is not None:
            bar.update(len(cols))
    if bar is not None:
        bar.close()
    if day != len(sizes):
        raise ValueError(f"the source ended in day {day} of {len(sizes)}")


def _finish(directory: str, final: str, layout: str, sizes: Sequence[int], has_eval: bool, num_dense: int,
            bag_sizes: Sequence[int], table_sizes: Optional[Sequence[int]], id_dtype,
            extra: Dict[str, Any]) -> Dict[str, Any]:
    """``neo_layout.json`` into ``directory`` (the staged output), naming ``final`` in its config keys."""
    train = list(range(len(sizes) - (1 if has_eval else 0)))
    ev = len(train) if has_eval else None
    n_ev = sizes[-1] if has_eval else 0
    meta: Dict[str, Any] = {
        "format": "torchrec/MLPerf DLRM-DCNv2 Criteo binary days", "layout": layout,
        "days": {str(d): int(n) for d, n in enumerate(sizes)}, "train_days": train, "eval_day": ev,
        "validation_rows": n_ev // 2 + n_ev % 2, "test_rows": n_ev // 2, "num_dense": num_dense,
        "num_sparse": len(bag_sizes), "multi_hot_sizes": list(bag_sizes),
        "table_sizes": None if table_sizes is None else list(table_sizes), "id_dtype": np.dtype(id_dtype).name,
        "config": {"data.source": "mlperf", "data.mlperf.dir": final, "data.mlperf.layout": layout,
                   "data.mlperf.train_days": [f"0-{len(train) - 1}"], "data.mlperf.val_day": ev,
                   "data.mlperf.multi_hot_sizes": list(bag_sizes)}}
    meta.update(extra)
    with open(os.path.join(directory, META_FILE), "w") as f:
        json.dump(meta, f, indent=2, default=float)
    return meta


def _id_dtype(table_sizes: Optional[Sequence[int]]):
    """int32 (the reference's) when every id fits, else int64."""
    return np.int32 if table_sizes and max(table_sizes) <= np.iinfo(np.int32).max + 1 else np.int64


def layout_from_synthetic(o, output: str, layout: str, days: int, eval_samples: int, progress=None,
                          overwrite: bool = False) -> Dict[str, Any]:
    """Planted-teacher samples (:class:`data_pipeline.synthetic.SynthOptions` ``o``; ``o.num_samples``
    training ones) as days ``0..days-1`` plus an eval day ``days`` of ``eval_samples`` samples: the
    first ``o.num_samples + eval_samples`` samples ``neo-data synth`` writes with the same options.
    The teacher's exact AUC on the training samples, the validation half and the test half (each
    capped at ``o.auc_samples`` samples) goes to ``neo_layout.json``. The days are written staged
    (:func:`_staged`): an ``output`` holding an earlier run's days is refused unless ``overwrite``."""
    from dataclasses import asdict, replace

    from .parallel import ordered_map
    from .synthetic import GEN_BLOCK, _gen, _init, auc  # the block generator generate() runs, per worker

    if o.variable_bags:
        raise ValueError("the MLPerf layout holds fixed bags: no variable bags")
    bags = o.per_table(o.ids_per_bag, "ids_per_bag")
    n, half = o.num_samples, eval_samples // 2 + eval_samples % 2
    sizes = _day_sizes(n, days) + ([eval_samples] if eval_samples else [])
    o = replace(o, num_samples=n + eval_samples)
    cap = o.auc_samples
    spans = {"best_auc": (0, min(n, cap)), "best_auc_validation": (n, n + min(half, cap)),
             "best_auc_test": (n + half, n + half + min(eval_samples - half, cap))}
    kept: Dict[str, Tuple[list, list]] = {k: ([], []) for k in spans}

    def blocks():
        nblocks = (o.num_samples + GEN_BLOCK - 1) // GEN_BLOCK
        for b, (cols, p) in ordered_map(_gen, ((b, b) for b in range(nblocks)), o.workers, _init, (o,), o.executor):
            for k, (lo, hi) in spans.items():
                i, j = max(lo, b * GEN_BLOCK) - b * GEN_BLOCK, min(hi, b * GEN_BLOCK + len(cols)) - b * GEN_BLOCK
                if i < j:
                    kept[k][0].append(cols.label[i:j])
                    kept[k][1].append(p[i:j])
            yield cols

    ids = _id_dtype(o.table_rows)

    def write(directory: str) -> Dict[str, Any]:
        _write_days(blocks(), directory, layout, sizes, o.num_dense, bags, ids, progress)
        aucs = {k: auc(np.concatenate(v[0]), np.concatenate(v[1])) if v[0] else None for k, v in kept.items()}
        src = {"kind": "synthetic", "options": {k: v for k, v in asdict(o).items() if k != "writer"}}
        return _finish(directory, output, layout, sizes, bool(eval_samples), o.num_dense, bags, o.table_rows, ids,
                       dict(aucs, auc_samples=cap, source=src))

    return _staged(write, output, overwrite)


def layout_from_parquet(inputs: Sequence[str], output: str, layout: str, days: int,
                        eval_inputs: Sequence[str] = (), progress=None, overwrite: bool = False) -> Dict[str, Any]:
    """Parquet written by ``neo-data`` (one-hot or fixed multi-hot) as days ``0..days-1`` of near-equal
    size, in file order; ``eval_inputs`` (e.g. ``validation/`` then ``test/``) become day ``days``.
    Written staged, as :func:`layout_from_synthetic`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .reader import list_parquet_files, table_to_columns
    from .schema import check_same_layout, read_meta

    train = list_parquet_files(list(inputs))
    evals = list_parquet_files(list(eval_inputs)) if eval_inputs else []
    meta = read_meta(pq.read_schema(train[0]), train[0])
    bags = []
    for name in meta.sparse_names:
        t = pq.read_schema(train[0]).field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_fixed_size_list(t)):
            raise ValueError(f"{train[0]}: column {name} has variable-size bags; the MLPerf layout holds fixed bags")
        bags.append(t.list_size if pa.types.is_fixed_size_list(t) else 1)
    first_schema = pq.read_schema(train[0])
    for f in train + evals:
        schema = pq.read_schema(f)
        check_same_layout(schema, read_meta(schema, f), f, first_schema, meta, train[0])
    rows = lambda files: sum(pq.ParquetFile(f).metadata.num_rows for f in files)  # noqa: E731
    n_eval = rows(evals)
    sizes = _day_sizes(rows(train), days) + ([n_eval] if n_eval else [])

    def blocks():
        for f in train + evals:
            pf = pq.ParquetFile(f)
            for g in range(pf.num_row_groups):
                yield table_to_columns(pf.read_row_group(g), meta)

    ids = _id_dtype(meta.table_sizes)
    best = meta.extra.get("best_auc") if isinstance(meta.extra, dict) else None

    def write(directory: str) -> Dict[str, Any]:
        _write_days(blocks(), directory, layout, sizes, meta.num_dense, bags, ids, progress)
        return _finish(directory, output, layout, sizes, bool(n_eval), meta.num_dense, bags, meta.table_sizes, ids,
                       {"best_auc": best, "source": {"kind": "parquet", "train": train, "eval": evals,
                                                     "meta_source": meta.source}})

    return _staged(write, output, overwrite)
