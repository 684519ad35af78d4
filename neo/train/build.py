"""From a config to a runnable job, in one documented order.

1. :func:`init_process_groups`: torch.distributed from torchrun's environment (``WORLD_SIZE``,
   ``RANK``, ``LOCAL_WORLD_SIZE``), or a one-rank gloo group for ``neo train`` in one process
   (so that one code path serves both);
2. :func:`resolve_tables`: the tables' configs, ``optim.sparse`` applied;
3. :func:`prepare_data`: synthetic data generated once into a cache keyed by its options (rank 0
   generates, the others wait), the Parquet paths, or the MLPerf day files opened and checked;
   the loaders of this rank;
4. :func:`make_plan`: the planner's plan for this world (``sharding.types`` as constraints),
   computed on rank 0 and broadcast;
5. :func:`apply_placements`: the plan's placements (device or cached) written into the tables.

:func:`build_job` runs these steps for a trainer (and sets the process's threads and memory
policy first), returning them as a :class:`Job`; both trainers start from it (the
synchronous :class:`neo.train.trainer.Trainer` and :class:`neo.async_train.WSPTrainer`).

The trainer (:class:`neo.train.trainer.Trainer`) then builds ``DLRM`` on a
:class:`ShardedEmbeddingCollection`, the dense part in ``DistributedDataParallel`` (see
:class:`neo.train.step.DenseStep` for why DDP wraps a step module rather than the DLRM
itself), the dense optimizer and the LR schedule.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from neo.config.embedding import ConfigError, Placement, TableConfig

__all__ = ["DataSpec", "MlperfData", "init_process_groups", "attempt_store", "restart_attempt", "resolve_tables",
           "prepare_data", "make_loaders", "make_plan", "validate_training_config", "rename_features",
           "apply_placements", "Job", "build_job"]


# ----------------------------------------------------------------------------- 0. config checks
def validate_training_config(cfg) -> None:
    """Rules across sections: equal table dims ending the bottom MLP, sharding types name tables."""
    tables = resolve_tables(cfg)
    dims = [t.dim for t in tables for _ in t.feature_names]
    cfg.model.check_tables(dims)
    cfg.sharding.check_tables([t.name for t in tables])
    for field in ("run_dir", "checkpoint_dir", "cache_store_dir"):
        path = getattr(cfg.train, field, None)
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"train.{field}: {path!r} exists and is not a directory")
    for k, t in enumerate(cfg.tables):                  # a cached table's own store directory (made if missing)
        path = getattr(t, "cache_dir", None)
        if path:
            existing = os.path.abspath(path)
            while not os.path.exists(existing):           # the part that exists must be a directory
                existing = os.path.dirname(existing)
            if not os.path.isdir(existing):
                raise ConfigError(f"tables[{k}].cache_dir: {path!r} is not a directory (table {t.name!r})")


# ----------------------------------------------------------------------------- 1. process groups
def init_process_groups(train_cfg):
    """Initialise torch.distributed (torchrun env or one local rank) and build :class:`ProcessGroups`.

    Under torchrun every restart attempt rendezvouses on a store of its own (the agent's store
    outlives its workers: keys a killed attempt left there would otherwise send the new workers
    to dead peers' addresses, see :func:`attempt_store`)."""
    from neo.distributed import ProcessGroups

    timeout = datetime.timedelta(seconds=train_cfg.collective_timeout_s)
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 or "MASTER_ADDR" in os.environ:
            try:
                store, rank, world = attempt_store(timeout)
            except dist.DistNetworkError as e:            # e.g. another process holds MASTER_PORT
                where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
                raise ConfigError(f"the rendezvous store at MASTER_ADDR:MASTER_PORT = {where} cannot be reached or "
                                  f"opened ({str(e).strip().splitlines()[0]}); another process may hold the port: "
                                  "choose another (MASTER_PORT, or torchrun --master-port)") from None
            dist.init_process_group(train_cfg.dist_backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    W = dist.get_world_size()
    L = int(os.environ.get("LOCAL_WORLD_SIZE", str(W)))
    return ProcessGroups.build(L, shm=train_cfg.shm_collectives)


def restart_attempt() -> int:
    """torchrun's restart count of this worker group (0: the first attempt, or not under torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def attempt_store(timeout: datetime.timedelta):
    """(store, rank, world size) of the ``env://`` rendezvous, its keys under ``neo/attempt-<k>/``.

    torchrun's agent hosts the workers' TCPStore and keeps it across restarts of the workers,
    while ``init_process_group`` writes fixed keys (every rank's gloo address) under one fixed
    prefix: the workers of attempt k+1 would read the addresses attempt k's dead workers left
    there and fail to connect (or wait on them). A prefix per attempt keeps the rounds apart."""
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return dist.PrefixStore(f"neo/attempt-{restart_attempt()}/", store), rank, world


# ----------------------------------------------------------------------------- 2. tables
def resolve_tables(cfg) -> List[TableConfig]:
    """Table configs; ``optim.sparse`` replaces every optimizer left at the default."""
    if not cfg.tables:
        raise ConfigError("tables: at least one table is needed to train")
    return cfg.table_configs()


# ----------------------------------------------------------------------------- 3. data
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
    from data_pipeline.synthetic import SynthOptions
    from data_pipeline.writer import WriterOptions

    s = cfg.data.synthetic
    rows = [t.num_rows for t in tables for _ in t.feature_names]

    def per(values, name: str) -> list:
        if len(values) not in (1, len(rows)):
            raise ConfigError(f"data.synthetic.{name}: give 1 or {len(rows)} values (one per feature), got {len(values)}")
        return list(values)

    return SynthOptions(num_samples=s.num_samples + s.val_samples, num_dense=s.num_dense, table_rows=rows,
                        ids_per_bag=per(s.ids_per_bag, "ids_per_bag"), variable_bags=s.variable_bags,
                        distribution=s.distribution, skew=[float(x) for x in per(s.skew, "skew")], seed=s.seed,
                        base_ctr=s.base_ctr, dense_strength=s.dense_strength, sparse_strength=s.sparse_strength,
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

    from data_pipeline.schema import read_meta

    train = list_parquet_files(list(cfg.data.train_paths))
    val = list_parquet_files(list(cfg.data.val_paths)) if cfg.data.val_paths else []
    _check_files_once(train, val)
    meta = read_meta(pq.read_schema(train[0]), train[0])
    check_table_sizes(meta.sparse_names, meta.table_sizes, tables, f"{train[0]}'s metadata")
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
                               seed=cfg.train.seed, drop_last=True, prefetch_batches=cfg.data.prefetch_batches)
    val_opts = LoaderOptions(batch_size=cfg.train.eval_batch, rank=pg.rank, world_size=pg.world_size, shuffle=False,
                             drop_last=False, prefetch_batches=cfg.data.prefetch_batches)
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


# ----------------------------------------------------------------------------- 4. plan
def make_plan(cfg, pg, batch_size: int, data: Optional[DataSpec] = None) -> Dict[str, Any]:
    """The plan (JSON dict) for this world; rank 0 plans and broadcasts it. Also returns the report.

    Tables the planner may cache (``placement: cached``, or ``auto`` when the tables do not all
    fit in device memory) get miss-ratio curves measured on ``sharding.cache_sample_batches``
    global batches of ``data`` (:func:`measure_cache_curves`). An error on rank 0 (a bad plan
    file, a world the tables do not fit) is raised on every rank, not left for the others to
    wait out in the broadcast."""
    from neo.distributed.process_groups import on_rank0

    return on_rank0(lambda: _plan_rank0(cfg, pg, batch_size, data), pg)


def _plan_rank0(cfg, pg, batch_size: int, data: Optional[DataSpec]):
    """make_plan's work on rank 0: (the plan's JSON dict, its report)."""
    import torch

    from neo.machine import usable_cores
    from neo.planner import PARTITIONERS, Placement as PlanPlacement, PlanningError, format_report, plan_tables
    from neo.planner.step_model import predict_step

    topo = cfg.topology.to_topology(pg.world_size, pg.local_world_size)
    topo = replace(topo, batch_size_per_rank=batch_size)
    consts, what = cfg.cost_constants(pg.world_size)
    if cfg.sharding.plan_file:
        plan = load_plan_file(cfg.sharding.plan_file, cfg.table_specs(), pg.world_size, pg.local_world_size)
    else:
        parts = PARTITIONERS if cfg.sharding.partitioner == "auto" else (cfg.sharding.partitioner,)
        specs = cfg.table_specs()
        plan, cache = None, [s.constraints.placement is PlanPlacement.CACHED for s in specs]
        if any(s.constraints.placement is PlanPlacement.AUTO for s in specs):
            device = [replace(s, constraints=replace(s.constraints, placement=PlanPlacement.DEVICE))
                      if s.constraints.placement is PlanPlacement.AUTO else s for s in specs]
            try:
                plan = plan_tables(device, topo, consts, parts) if not any(cache) else None
            except PlanningError:
                cache = [c or s.constraints.placement is PlanPlacement.AUTO for c, s in zip(cache, specs)]
        if plan is None:
            if data is not None and cfg.sharding.cache_sample_batches and any(cache):
                specs = measure_cache_curves(cfg, data, specs, cache, batch_size * pg.world_size)
            plan = plan_tables(specs, topo, consts, parts)
    # a plan from a file is predicted with this machine's constants, like one planned here
    plan.summary["cost_constants"] = what
    dense = dense_spec(cfg, data.num_dense if data is not None else None)
    # the step model's dense term is data-parallel: a pipelined dense part has its own model
    # (neo.pipeline.perf_model), so no step is predicted for it here
    if dense is not None and not cfg.parallel.pipeline.enabled:
        plan.summary["step"] = predict_step(plan, cfg.table_specs(), dense, topo, consts,
                                            inline_data=cfg.data.prefetch_batches <= 0, cores=usable_cores(),
                                            threads_per_rank=torch.get_num_threads()).to_dict()
    report = format_report(plan)
    t = cfg.topology
    if (t.world_size or pg.world_size, t.local_world_size or pg.local_world_size) != (pg.world_size,
                                                                                       pg.local_world_size):
        # the config's world is `neo plan`'s; a run plans for the world it was launched with
        report += (f"\nNote: topology.world_size / local_world_size = {t.world_size} / {t.local_world_size} in the "
                   f"config; this run was launched with {pg.world_size} / {pg.local_world_size} ranks and is "
                   "planned for those (the config's values are what `neo plan` plans for)\n")
    return plan.to_dict(), report


def load_plan_file(path: str, specs, world_size: int, local_world_size: int):
    """``sharding.plan_file``: the plan, checked against this run's tables and world
    (ConfigError naming the file and what differs)."""
    from neo.planner import Plan

    where = f"sharding.plan_file {path!r}"
    try:
        plan = Plan.load(path)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e})") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: not a plan written by `neo plan --out` ({type(e).__name__}: {e})") from None
    why = plan.mismatch(specs, world_size, local_world_size)
    if why:
        raise ConfigError(f"{where}: {why}; plan again (`neo plan CONFIG --world-size W --local-world-size L "
                          f"--out FILE`) or leave plan_file unset")
    return plan


def dense_spec(cfg, num_dense: Optional[int] = None):
    """The planner's dense part of the config's model (see :meth:`neo.config.NeoConfig.dense_spec`)."""
    return cfg.dense_spec(num_dense)


def measure_cache_curves(cfg, data: DataSpec, specs, which: Sequence[bool], global_batch: int):
    """``specs`` with a measured miss-ratio curve (``hit_curve``, ``distinct_per_batch``) for
    every table marked in ``which``: the table's ids in the first ``sharding.cache_sample_batches``
    global batches of the training data, run through ``neo cache-report``'s simulator with the
    table's policy, two batches pinned at a time (as under the training pipeline), at each cache
    share the planner considers whose cache holds two batches."""
    import types

    import numpy as np

    from neo.embedding.cache.simulate import simulate
    from neo.planner.cache_model import CACHE_FRACTIONS

    tables = {t.name: t for t in resolve_tables(cfg)}
    one = types.SimpleNamespace(rank=0, world_size=1)
    loader, _ = make_loaders(replace(cfg, train=replace(cfg.train, batch_size=global_batch)), data, one)
    mapping = feature_mapping(loader.meta.sparse_names, list(tables.values()))
    picked = [s for s, w in zip(specs, which) if w]
    ids: Dict[str, List[np.ndarray]] = {s.name: [] for s in picked}
    it = iter(loader)
    try:
        for k, batch in enumerate(it):
            sparse = rename_features(batch, mapping).sparse
            for s in picked:
                ids[s.name].append(np.unique(np.concatenate([sparse.feature(f)[0].numpy()
                                                            for f in tables[s.name].feature_names])))
            if k + 1 >= cfg.sharding.cache_sample_batches:
                break
    finally:
        it.close()
    out = list(specs)
    for i, (s, w) in enumerate(zip(specs, which)):
        batches = ids.get(s.name) if w else None
        if not batches:
            continue
        t = tables[s.name]
        need = max(len(np.union1d(a, b)) for a, b in zip(batches, batches[1:] or batches))
        fractions = [s.cache_fraction] if s.cache_fraction is not None else list(CACHE_FRACTIONS)
        curve = tuple((f, simulate(batches, t.num_rows, max(1, int(np.ceil(f * t.num_rows))), t.cache_policy.value,
                                   t.cache_lookahead, pipelined=True).hit_rate)
                      for f in fractions if np.ceil(f * t.num_rows) >= need)
        out[i] = replace(s, hit_curve=curve, distinct_per_batch=float(np.mean([len(b) for b in batches])))
    return out


def apply_placements(tables: Sequence[TableConfig], plan: Dict[str, Any]) -> List[TableConfig]:
    """The tables as the plan places them: a table the plan caches becomes ``placement: cached``
    with the plan's cache share (a size fixed in its config stays); one it keeps on the device
    loses any cache settings."""
    out = []
    for t in tables:
        tp = plan["tables"][t.name]
        if tp.get("placement") == Placement.CACHED.value:
            if t.cached and (t.cache_rows is not None or t.cache_load_factor is not None):
                out.append(t)
            else:
                out.append(replace(t, placement=Placement.CACHED, cache_rows=None,
                                   cache_load_factor=float(tp["cache_load_factor"])))   # Plan.mismatch: in (0, 1]
        else:
            out.append(replace(t, placement=Placement.DEVICE, cache_rows=None, cache_load_factor=None))
    return out


# ----------------------------------------------------------------------------- all of it
@dataclass
class Job:
    """What a trainer builds its model and loop on (:func:`build_job`)."""
    pg: Any                            # process groups (neo.distributed.process_groups)
    device: Any                        # torch.device of train.device
    say: Callable[..., None]           # the log on rank 0, a no-op elsewhere
    tables: List[TableConfig]          # resolved, with the plan's placements
    data: DataSpec
    train_loader: Any
    val_loader: Any
    mapping: Optional[Dict[str, str]]  # data feature names to table feature names (feature_mapping)
    batch_size: int                    # per rank
    steps_per_epoch: int
    total_steps: int
    plan: Dict[str, Any]
    plan_report: str


def build_job(cfg, pg=None, log=print, warm_up: bool = False) -> Job:
    """Steps 1 to 5 for a validated config: torch's threads (``train.threads``) and the memory
    policy (``train.retain_freed_memory``) set, the process groups (``pg`` or from the
    environment), tables, data and loaders, the plan and the placed tables. ``warm_up``: the
    training loader reads its first window while the plan is made. A batch size larger than
    this rank's share of the training samples is a ConfigError."""
    from neo.host_memory import retain_freed_memory

    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    if t.retain_freed_memory:
        retain_freed_memory()
    device = torch.device(t.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device: {t.device!r}, but this torch sees no CUDA device (torch.cuda.is_available() "
                          f"is False: torch {torch.__version__} without CUDA, or no GPU here); use train.device=cpu")
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if t.embedding_backend == "triton" and device.type != "cuda" and not interpreted:
        raise ConfigError("train.embedding_backend: 'triton' runs on CUDA tensors (train.device: cuda), or on the CPU "
                          "under Triton's interpreter (TRITON_INTERPRET=1, for tests: slow); on the CPU use auto or cpu")
    pg = pg or init_process_groups(t)
    say = log if pg.rank == 0 else (lambda *a, **k: None)
    tables = resolve_tables(cfg)
    data = prepare_data(cfg, tables, pg, log=say)
    train_loader, val_loader = make_loaders(cfg, data, pg, tables)
    if warm_up:
        train_loader.warm_up()
    B = t.batch_size
    steps_per_epoch = (train_loader.num_samples // pg.world_size) // B
    if steps_per_epoch == 0:
        raise ConfigError(f"train.batch_size {B} x {pg.world_size} ranks exceeds the {train_loader.num_samples} "
                          "training samples")
    plan, report = make_plan(cfg, pg, B, data)
    return Job(pg=pg, device=torch.device(t.device), say=say, tables=apply_placements(tables, plan), data=data,
               train_loader=train_loader, val_loader=val_loader,
               mapping=feature_mapping(train_loader.meta.sparse_names, tables), batch_size=B,
               steps_per_epoch=steps_per_epoch, total_steps=t.steps or t.epochs * steps_per_epoch, plan=plan,
               plan_report=report)
