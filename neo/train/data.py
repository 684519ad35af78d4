"""Step 3 of building a job (:mod:`neo.train.build`): the data a run reads, and its loaders.

:func:`prepare_data`: synthetic data generated once into a cache keyed by its options (rank 0
generates into a staging folder renamed when complete, the others wait; every process holds a
lease on the set it reads, and rank 0 evicts the least recently used others:
:mod:`neo.train.data_cache`), the Parquet paths (each file read once), or the MLPerf day files
opened and checked. :func:`make_loaders`: the loaders of this rank, checking every id against
the rows of the table that reads it as they read. :func:`feature_mapping` /
:func:`rename_features`: the data's sparse columns to the tables' features (by name, else by
position).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence

import torch.distributed as dist

from neo.config.embedding import ConfigError, TableConfig

__all__ = ["DataSpec", "MlperfData", "prepare_data", "make_loaders", "rename_features", "feature_mapping",
           "check_table_sizes", "synthetic_dir"]


@dataclass
class DataSpec:
    """Where this run's samples are and what the data says about itself."""

    train_paths: List[str]
    val_paths: List[str]
    num_dense: int
    best_auc: Optional[float]
    """The synthetic teacher's AUC (the best a model can reach), when the data reports it."""
    mlperf: Optional["MlperfData"] = None
    """``source: mlperf``: the opened, checked day files (the paths above are informational)."""
    lease: Optional[Any] = field(default=None, repr=False, compare=False)
    """``source: synthetic``: this process's lease on the set (neo.train.data_cache.SetLease),
    held while this object lives, so that no other run's eviction removes the files read."""


@dataclass
class MlperfData:
    """The MLPerf day files of a run: memory-mapped segments of each split, and the id folding."""

    train: List[Any]
    """``data_pipeline.mlperf_layout.Segment`` s of the training days, in order."""
    eval: List[Any]
    """Segments of the evaluated half of the eval day (empty: no evaluation)."""
    fold_rows: Optional[List[int]]
    """Ids are read modulo these (one per data feature), or as stored (None)."""


def _synth_options(cfg, tables: Sequence[TableConfig]):
    from data_pipeline.synth_knobs import SynthKnobs
    from data_pipeline.synthetic import SynthOptions
    from data_pipeline.writer import WriterOptions

    s = cfg.data.synthetic
    rows = [t.num_rows for t in tables for _ in t.feature_names]

    def per(values, name: str) -> list:
        if len(values) not in (1, len(rows)):
            raise ConfigError(f"data.synthetic.{name}: give 1 or {len(rows)} values (one per feature), got {len(values)}")
        return list(values)

    knobs = {f.name: getattr(s, f.name) for f in dataclasses.fields(SynthKnobs)}
    knobs.update(ids_per_bag=per(s.ids_per_bag, "ids_per_bag"), skew=[float(x) for x in per(s.skew, "skew")])
    return SynthOptions(**knobs, num_samples=s.num_samples + s.val_samples, table_rows=rows,
                        auc_samples=min(1_000_000, s.num_samples + s.val_samples), workers=2,
                        writer=WriterOptions(rows_per_file=s.val_samples,
                                             row_group_rows=min(128 * 1024, s.val_samples)))


def synthetic_dir(cfg, tables: Sequence[TableConfig]) -> str:
    """``cache_dir/synth-<hash of the generator options>``."""
    o = _synth_options(cfg, tables)
    key = dataclasses.asdict(o)
    key.pop("workers")
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return os.path.join(cfg.data.synthetic.cache_dir, f"synth-{digest}")


def _synthetic_complete(out: str) -> bool:
    """Whether ``out`` holds a finished synthetic set (its summary is written last)."""
    return os.path.exists(os.path.join(out, "summary.json"))


def _generate(cfg, tables, out: str, log) -> None:
    """Generate the synthetic set into ``<out>.tmp-<pid>`` and rename it to ``out``. The staging copy
    is removed on any failure (Ctrl-C included); if another process finished ``out`` first, this
    copy is discarded and theirs is used."""
    from data_pipeline.synthetic import generate

    o = _synth_options(cfg, tables)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    o.output = tmp
    log(f"neo train: generating {o.num_samples} synthetic samples into {out}")
    try:
        generate(o)
        try:
            os.replace(tmp, out)                # atomic: a half-written set is never reused
        except OSError:
            if not _synthetic_complete(out):    # not a lost race: a real error
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_UNLEASABLE = object()
"""What :func:`_lease` returns where no lease can be held (read-only cache, no flock)."""


def _lease(out: str, log):
    """This process's lease on the set ``out`` (neo.train.data_cache); None if ``out`` is not a
    complete set in place (never made, or evicted meanwhile); ``_UNLEASABLE`` where no lease can
    be held (a read-only cache, a file system without flock: the set is read without one)."""
    from neo.train.data_cache import take_lease

    try:
        return take_lease(out)
    except OSError as e:
        log(f"neo train: no lease on {out} ({e}); reading it without one, evicting nothing")
        return _UNLEASABLE


def _leased_set(cfg, tables, out: str, log):
    """Rank 0: the synthetic set ``out``, generated if missing, with this process's lease on it
    (None where leases cannot be held). Takes it again, or generates it again, while another
    run's eviction removes it between the check and the lease (after three times: an error)."""
    for attempt in range(4):
        if _synthetic_complete(out):
            lease = _lease(out, log)
            if lease is not None:
                return None if lease is _UNLEASABLE else lease
            continue                             # evicted (and perhaps made again) meanwhile: again
        if attempt < 3:
            os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
            _generate(cfg, tables, out, log)
    raise RuntimeError(f"the synthetic set {out} was removed by another run's eviction three times while this run "
                       "took it: raise data.synthetic.cache_max_gb, or give the runs different cache_dir")


def _prepare_mlperf(cfg, tables: Sequence[TableConfig], pg) -> DataSpec:
    """Open and check the MLPerf day files before training: every file present and complete, row
    counts equal per day, bag widths as ``data.mlperf.multi_hot_sizes``, features matching the
    tables, and (ids not folded) ids below their table's rows: the ``id_check`` scan, the days
    spread over the ranks and the first error shared, so that every rank raises it."""
    from data_pipeline.mlperf_layout import (META_FILE, LayoutError, check_shapes, open_days, read_layout_meta,
                                             scan_ids, split_segments)
    from data_pipeline.schema import sparse_names

    m = cfg.data.mlperf
    train_days = m.days()
    multi = m.layout == "multi_hot"
    days = open_days(m.dir, train_days + ([m.val_day] if m.val_day is not None else []), m.layout,
                     len(m.multi_hot_sizes))
    num_dense = check_shapes(days, list(m.multi_hot_sizes) if multi else None)
    keys = sparse_names(len(days[train_days[0]].bag_sizes))
    mapping = feature_mapping(keys, tables) or {}
    owner = {f: t for t in tables for f in t.feature_names}
    table = [owner.get(mapping.get(k, k)) for k in keys]          # None: a feature no table reads
    rows = [t.num_rows if t is not None else 2**62 for t in table]
    meta = read_layout_meta(m.dir) or {}
    if not m.folds():
        for f, (n, t) in enumerate(zip(meta.get("table_sizes") or [], table)):
            if t is not None and n > t.num_rows:
                raise LayoutError(f"{os.path.join(m.dir, META_FILE)}: feature {f} ({keys[f]}) has ids below "
                                  f"table_sizes[{f}] = {n}, table {t.name!r} has num_rows = {t.num_rows} "
                                  "(raise num_rows, or fold ids with data.mlperf.fold_ids: true)")
        if m.id_check != "off":
            mine = [d for i, d in enumerate(days.values()) if i % pg.world_size == pg.rank]
            names = [f"{k} -> table {getattr(t, 'name', None)!r}" for k, t in zip(keys, table)]
            error = scan_ids(mine, rows, names, None if m.id_check == "full" else m.id_check_rows)
            errors = [error]
            if pg.world_size > 1:
                errors = [None] * pg.world_size
                dist.all_gather_object(errors, error, group=pg.world)
            if any(errors):
                raise LayoutError(next(e for e in errors if e))
    train = split_segments(days, "train", train_days)
    ev = split_segments(days, m.eval_split, eval_day=m.val_day) if m.val_day is not None else []
    best = meta.get(f"best_auc_{m.eval_split}", meta.get("best_auc"))
    return DataSpec([p for s in train for p in s.day.paths], [p for s in ev for p in s.day.paths], num_dense, best,
                    MlperfData(train, ev, rows if m.folds() else None))


def prepare_data(cfg, tables: Sequence[TableConfig], pg, log=print) -> DataSpec:
    """Paths of the train / validation splits (generating synthetic data on rank 0 if needed);
    for ``source: mlperf`` the opened, checked day files (:func:`_prepare_mlperf`)."""
    from data_pipeline.reader import list_parquet_files

    if cfg.data.source == "mlperf":
        return _prepare_mlperf(cfg, tables, pg)
    if cfg.data.source == "synthetic":
        out = synthetic_dir(cfg, tables)
        lease = _leased_set(cfg, tables, out, log) if pg.rank == 0 else None
        if pg.world_size > 1:
            dist.barrier(group=pg.world)
        if pg.rank != 0:
            lease = _lease(out, log)                # rank 0 holds its lease: the set is in place
            lease = None if lease is _UNLEASABLE else lease
        elif lease is not None and cfg.data.synthetic.cache_max_gb > 0:
            from neo.train import data_cache

            limit = int(cfg.data.synthetic.cache_max_gb * 2**30)
            data_cache.describe(data_cache.evict(os.path.dirname(out) or ".", out, limit), limit, log)
        files = list_parquet_files(os.path.join(out, "train"))
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        return DataSpec(files[:-1], files[-1:], cfg.data.synthetic.num_dense, summary.get("best_auc"), lease=lease)
    import pyarrow.parquet as pq

    from data_pipeline.schema import check_same_layout, read_meta

    train = list_parquet_files(list(cfg.data.train_paths))
    val = list_parquet_files(list(cfg.data.val_paths)) if cfg.data.val_paths else []
    _check_files_once(train, val)
    schema = pq.read_schema(train[0])
    meta = read_meta(schema, train[0])
    check_table_sizes(meta.sparse_names, meta.table_sizes, tables, f"{train[0]}'s metadata")
    if val:     # checked now, not at the first evaluation (each split's loader checks its own files)
        val_schema = pq.read_schema(val[0])
        val_meta = read_meta(val_schema, val[0])
        check_same_layout(val_schema, val_meta, val[0], schema, meta, train[0], column_kinds=False)
        check_table_sizes(val_meta.sparse_names, val_meta.table_sizes, tables, f"{val[0]}'s metadata")
    best = meta.extra.get("best_auc") if isinstance(meta.extra, dict) else None
    return DataSpec(train, val, meta.num_dense, best)


def _check_files_once(train: Sequence[str], val: Sequence[str]) -> None:
    """Each Parquet file read once: not twice in the training split (its samples would be trained
    on twice an epoch), nor in both splits (evaluated on samples trained on); a ConfigError naming it."""
    seen: Dict[str, str] = {}
    for split, files in (("data.train_paths", train), ("data.val_paths", val)):
        for path in files:
            key = os.path.realpath(path)
            if key in seen:
                what = "twice in it" if seen[key] == split else f"in {seen[key]} too"
                raise ConfigError(f"{split}: {path} is given {what} (directly or through a directory): "
                                  "every file must be read once")
            seen[key] = split


def make_loaders(cfg, data: DataSpec, pg, tables: Optional[Sequence[TableConfig]] = None):
    """(train loader, validation loader or None) of this rank. With ``tables``, the loaders check
    every id against the rows of the table that reads it as they read (``LoaderOptions.id_limits``):
    an id past its table is an error naming the file and row, not the lookup's error mid-step."""
    train, val = _loaders(cfg, data, pg)
    if tables is not None:
        for loader in (train, val):
            if loader is not None:
                keys = loader.meta.sparse_names
                mapping = feature_mapping(keys, tables) or {}
                owner = {f: t for t in tables for f in t.feature_names}
                table = [owner.get(mapping.get(k, k)) for k in keys]
                loader.options = replace(loader.options, id_limits=[t.num_rows if t else None for t in table],
                                         id_owners=[f"table {t.name!r}" if t else "no table" for t in table])
    return train, val


def _loaders(cfg, data: DataSpec, pg):
    from data_pipeline.loader import LoaderOptions, ParquetLoader

    B = cfg.train.batch_size
    train_opts = LoaderOptions(batch_size=B, rank=pg.rank, world_size=pg.world_size, shuffle=cfg.data.shuffle,
                               shuffle_window=cfg.data.shuffle_window, first_window=cfg.data.first_window,
                               seed=cfg.train.seed, drop_last=True, prefetch_batches=cfg.data.prefetch_batches,
                               thread_nice=cfg.data.loader_nice)
    val_opts = LoaderOptions(batch_size=cfg.train.eval_batch, rank=pg.rank, world_size=pg.world_size, shuffle=False,
                             drop_last=False, prefetch_batches=cfg.data.prefetch_batches,
                             thread_nice=cfg.data.loader_nice)
    if data.mlperf is not None:
        from data_pipeline.mlperf_layout import MlperfLoader

        m = data.mlperf
        train = MlperfLoader(m.train, train_opts, m.fold_rows)
        return train, (MlperfLoader(m.eval, val_opts, m.fold_rows) if m.eval else None)
    train = ParquetLoader(data.train_paths, train_opts)
    val = ParquetLoader(data.val_paths, val_opts) if data.val_paths else None
    return train, val


def rename_features(batch, mapping: Optional[Dict[str, str]]):
    """The batch with its sparse keys renamed (no copy), e.g. Criteo's ``cat_3`` -> a table's feature."""
    if not mapping:
        return batch
    from neo.sparse import KeyedJaggedBatch

    s = batch.sparse
    sparse = KeyedJaggedBatch(tuple(mapping.get(k, k) for k in s.keys), s.values, s.lengths, s.batch_size,
                              weights=s.weights, offsets=s.offsets, validate=False)
    return type(batch)(batch.dense, sparse, batch.labels)


def feature_mapping(data_keys: Sequence[str], tables: Sequence[TableConfig]) -> Optional[Dict[str, str]]:
    """Data keys -> table features: by name when every feature is in the data; by position when
    none is (e.g. tables ``t0 ..`` over Criteo's ``cat_0 ..``) and the counts agree. Some names
    in the data and others not is a ConfigError naming them: matching such tables by position
    would feed a feature another feature's column."""
    feats = [f for t in tables for f in t.feature_names]
    found = [f for f in feats if f in data_keys]
    if len(found) == len(feats):
        return None
    if found:
        missing = [f"{f} (table {t.name!r})" for t in tables for f in t.feature_names if f not in data_keys]
        raise ConfigError(f"tables: features {missing} are not among the data's sparse features "
                          f"{list(data_keys)}, while {found} are; name every feature as the data does, "
                          "or none (then they are matched by position)")
    if len(feats) != len(data_keys):
        raise ConfigError(f"tables: features {feats} do not match the data's {len(data_keys)} sparse "
                          f"features {list(data_keys)} by name, nor by position (counts differ)")
    return dict(zip(data_keys, feats))


def check_table_sizes(keys: Sequence[str], sizes: Optional[Sequence[int]], tables: Sequence[TableConfig],
                      where: str) -> None:
    """Every feature's ids (below ``sizes[f]``, the data's metadata; None: unknown) fit the rows of
    the table that reads it; else a ConfigError naming the feature, the table and both numbers
    (before any step, rather than the lookup's out-of-range error at the first such id)."""
    if not sizes:
        return
    mapping = feature_mapping(keys, tables) or {}
    owner = {f: t for t in tables for f in t.feature_names}
    for f, (key, n) in enumerate(zip(keys, sizes)):
        t = owner.get(mapping.get(key, key))
        if t is not None and n is not None and int(n) > t.num_rows:
            raise ConfigError(f"table {t.name!r}: num_rows = {t.num_rows}, but the data's feature {f} ({key}) has ids "
                              f"up to {int(n) - 1} (table_sizes[{f}] = {n} in {where}); raise num_rows to at "
                              f"least {n}")
