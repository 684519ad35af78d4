"""From a config to a runnable job, in one documented order.

1. :func:`init_process_groups`: torch.distributed from torchrun's environment (``WORLD_SIZE``,
   ``RANK``, ``LOCAL_WORLD_SIZE``), or a one-rank gloo group for ``neo train`` in one process
   (so that one code path serves both);
2. :func:`resolve_tables`: the tables' configs, ``optim.sparse`` applied;
3. :func:`prepare_data`: synthetic data generated once into a cache keyed by its options (rank 0
   generates, the others wait), or the Parquet paths; the loaders of this rank;
4. :func:`make_plan`: the planner's plan for this world (``sharding.types`` as constraints),
   computed on rank 0 and broadcast;
5. :func:`build_model`: ``DLRM`` on a :class:`ShardedEmbeddingCollection`, the dense part in
   ``DistributedDataParallel`` (see :class:`neo.train.step.DenseStep` for why DDP wraps a step
   module rather than the DLRM itself), the dense optimizer and the LR schedule.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence

import torch.distributed as dist

from neo.config.embedding import ConfigError, TableConfig
from neo.config.tables import OptimizerEntry

__all__ = ["DataSpec", "init_process_groups", "resolve_tables", "prepare_data", "make_loaders", "make_plan",
           "validate_training_config", "rename_features"]


# ----------------------------------------------------------------------------- 0. config checks
def validate_training_config(cfg) -> None:
    """Rules across sections: equal table dims ending the bottom MLP, sharding types name tables."""
    tables = resolve_tables(cfg)
    dims = [t.dim for t in tables for _ in t.feature_names]
    cfg.model.check_tables(dims)
    cfg.sharding.check_tables([t.name for t in tables])


# ----------------------------------------------------------------------------- 1. process groups
def init_process_groups(train_cfg):
    """Initialise torch.distributed (torchrun env or one local rank) and build :class:`ProcessGroups`."""
    from neo.distributed import ProcessGroups

    timeout = datetime.timedelta(seconds=600)
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 or "MASTER_ADDR" in os.environ:
            dist.init_process_group(train_cfg.dist_backend, init_method="env://", timeout=timeout)
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    W = dist.get_world_size()
    L = int(os.environ.get("LOCAL_WORLD_SIZE", str(W)))
    return ProcessGroups.build(L, shm=train_cfg.shm_collectives)


# ----------------------------------------------------------------------------- 2. tables
def resolve_tables(cfg) -> List[TableConfig]:
    """Table configs; ``optim.sparse`` replaces every optimizer left at the default."""
    entries = list(cfg.tables)
    if not entries:
        raise ConfigError("tables: at least one table is needed to train")
    sparse = cfg.optim.sparse
    if sparse is not None:
        default = OptimizerEntry()
        entries = [replace(e, optimizer=sparse) if e.optimizer == default else e for e in entries]
    return [e.to_table_config(f"tables[{k}]") for k, e in enumerate(entries)]


# ----------------------------------------------------------------------------- 3. data
@dataclass
class DataSpec:
    """Where this run's samples are and what the data says about itself."""

    train_paths: List[str]
    val_paths: List[str]
    num_dense: int
    best_auc: Optional[float]
    """The synthetic teacher's AUC (the best a model can reach), when the data reports it."""


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


def _generate(cfg, tables, out: str, log) -> None:
    from data_pipeline.synthetic import generate

    o = _synth_options(cfg, tables)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    o.output = tmp
    log(f"neo train: generating {o.num_samples} synthetic samples into {out}")
    generate(o)
    os.replace(tmp, out)                        # atomic: a half-written set is never reused


def prepare_data(cfg, tables: Sequence[TableConfig], pg, log=print) -> DataSpec:
    """Paths of the train / validation splits (generating synthetic data on rank 0 if needed)."""
    from data_pipeline.reader import list_parquet_files

    if cfg.data.source == "synthetic":
        out = synthetic_dir(cfg, tables)
        if pg.rank == 0 and not os.path.exists(os.path.join(out, "summary.json")):
            os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
            _generate(cfg, tables, out, log)
        if pg.world_size > 1:
            dist.barrier(group=pg.world)
        files = list_parquet_files(os.path.join(out, "train"))
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        return DataSpec(files[:-1], files[-1:], cfg.data.synthetic.num_dense, summary.get("best_auc"))
    import pyarrow.parquet as pq

    from data_pipeline.schema import read_meta

    train = list_parquet_files(list(cfg.data.train_paths))
    val = list_parquet_files(list(cfg.data.val_paths)) if cfg.data.val_paths else []
    meta = read_meta(pq.read_schema(train[0]), train[0])
    best = meta.extra.get("best_auc") if isinstance(meta.extra, dict) else None
    return DataSpec(train, val, meta.num_dense, best)


def make_loaders(cfg, data: DataSpec, pg):
    """(train loader, validation loader or None) of this rank."""
    from data_pipeline.loader import LoaderOptions, ParquetLoader

    B = cfg.train.batch_size
    train = ParquetLoader(data.train_paths, LoaderOptions(
        batch_size=B, rank=pg.rank, world_size=pg.world_size, shuffle=cfg.data.shuffle,
        shuffle_window=cfg.data.shuffle_window, seed=cfg.train.seed, drop_last=True,
        prefetch_batches=cfg.data.prefetch_batches))
    val = None
    if data.val_paths:
        val = ParquetLoader(data.val_paths, LoaderOptions(
            batch_size=B, rank=pg.rank, world_size=pg.world_size, shuffle=False, drop_last=False,
            prefetch_batches=cfg.data.prefetch_batches))
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
    """Data keys -> table features: by name when every feature is in the data, else by position."""
    feats = [f for t in tables for f in t.feature_names]
    if all(f in data_keys for f in feats):
        return None
    if len(feats) != len(data_keys):
        raise ConfigError(f"tables: features {feats} do not match the data's {len(data_keys)} sparse "
                          f"features {list(data_keys)} by name, nor by position (counts differ)")
    return dict(zip(data_keys, feats))


# ----------------------------------------------------------------------------- 4. plan
def make_plan(cfg, pg, batch_size: int) -> Dict[str, Any]:
    """The plan (JSON dict) for this world; rank 0 plans and broadcasts it. Also returns the report."""
    from neo.planner import PARTITIONERS, Plan, format_report, plan_tables

    payload = [None]
    if pg.rank == 0:
        if cfg.sharding.plan_file:
            plan = Plan.load(cfg.sharding.plan_file)
        else:
            topo = cfg.topology.to_topology(pg.world_size, pg.local_world_size)
            topo = replace(topo, batch_size_per_rank=batch_size)
            consts = cfg.topology.to_cost_constants()
            parts = PARTITIONERS if cfg.sharding.partitioner == "auto" else (cfg.sharding.partitioner,)
            plan = plan_tables(cfg.table_specs(), topo, consts, parts)
        payload = [(plan.to_dict(), format_report(plan))]
    if pg.world_size > 1:
        dist.broadcast_object_list(payload, src=0, group=pg.world)
    return payload[0]
