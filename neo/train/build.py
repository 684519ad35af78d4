"""From a config to a runnable job, in one documented order.

1. :func:`init_process_groups`: torch.distributed from torchrun's environment (``WORLD_SIZE``,
   ``RANK``, ``LOCAL_WORLD_SIZE``), or a one-rank gloo group for ``neo train`` in one process
   (so that one code path serves both);
2. :func:`resolve_tables`: the tables' configs, ``optim.sparse`` applied;
3. :func:`neo.train.data.prepare_data`: synthetic data generated once into a cache keyed by
   its options (rank 0 generates, the others wait), the Parquet paths, or the MLPerf day files
   opened and checked; :func:`neo.train.data.make_loaders`: the loaders of this rank;
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

import datetime
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from neo.config.embedding import ConfigError, Placement, TableConfig
from neo.train.data import DataSpec, feature_mapping, make_loaders, prepare_data, rename_features

__all__ = ["init_process_groups", "attempt_store", "restart_attempt", "resolve_tables", "make_plan",
           "validate_training_config", "apply_placements", "Job", "build_job"]


# ----------------------------------------------------------------------------- 0. config checks
def probe_directory(path: str, field: str) -> None:
    """Create ``path`` and write a file in it, or a ConfigError naming ``field``: found when the
    run starts, not at its first write after hours of training."""
    probe = os.path.join(path, f".probe-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"{field}: {path!r} cannot be written ({e.strerror or e})") from None


def check_writable(path: str, field: str) -> None:
    """Whether directory ``path`` can be made and written, without making it: its nearest existing
    ancestor is a directory this process may write into (``os.access``: permissions, a read-only
    mount or an immutable directory; then a directory made and removed there); else a ConfigError
    naming ``field``."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        if existing == os.path.abspath(path):
            raise ConfigError(f"{field}: {path!r} exists and is not a directory")
        raise ConfigError(f"{field}: {path!r} cannot be made: {existing!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: {path!r} cannot be written ({existing!r} is not writable)")
    import tempfile         # what os.access cannot say (root on /proc, some network mounts): a probe

    try:
        probe = tempfile.mkdtemp(prefix=".neo-probe-", dir=existing)
    except OSError as e:
        raise ConfigError(f"{field}: {path!r} cannot be written ({existing!r}: {e.strerror or e})") from None
    try:
        os.rmdir(probe)
    except OSError:
        pass                # made, so writable; a probe a mount would not remove stays (hidden, empty)


def validate_training_config(cfg, outputs: bool = True) -> None:
    """Rules across sections: equal table dims ending the bottom MLP, sharding types name tables;
    the paths the run reads and (``outputs``) writes."""
    tables = resolve_tables(cfg)
    dims = [t.dim for t in tables for _ in t.feature_names]
    cfg.model.check_tables(dims)
    cfg.model.check_features([f for t in tables for f in t.feature_names])
    if cfg.model.position_weights and cfg.parallel.pipeline.enabled and \
            cfg.parallel.pipeline.schedule == "pipedream_async":
        raise ConfigError("model.position_weights: not with parallel.pipeline.schedule: pipedream_async (it "
                          "updates each stage inside the schedule; the weights are updated after the embeddings' "
                          "backward); take another schedule or leave the weights out")
    cfg.sharding.check_tables([t.name for t in tables])
    for field in ("run_dir", "checkpoint_dir", "cache_store_dir"):
        path = getattr(cfg.train, field, None)
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"train.{field}: {path!r} exists and is not a directory")
    cache_dir = cfg.data.synthetic.cache_dir if cfg.data.source == "synthetic" else None
    if cache_dir and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise ConfigError(f"data.synthetic.cache_dir: {cache_dir!r} exists and is not a directory")
    for k, t in enumerate(cfg.tables):                  # a cached table's own store directory (made if missing)
        path = getattr(t, "cache_dir", None)
        if path:
            existing = os.path.abspath(path)
            while not os.path.exists(existing):           # the part that exists must be a directory
                existing = os.path.dirname(existing)
            if not os.path.isdir(existing):
                raise ConfigError(f"tables[{k}].cache_dir: {path!r} is not a directory (table {t.name!r})")
    # Written as the run goes (metrics.jsonl, TensorBoard) and at its end (the trace), by rank 0:
    # found now, not after the training (the checkpoint directory is probed by the trainer, under
    # its lease). Not for `neo mlperf`, whose runs write under its results directory instead.
    if outputs and int(os.environ.get("RANK", "0") or 0) == 0:
        if cfg.train.run_dir:
            check_writable(cfg.train.run_dir, "train.run_dir")
        trace = getattr(cfg.train, "trace", None)
        if trace:
            if os.path.isdir(trace):
                raise ConfigError(f"train.trace: {trace!r} is a directory; give the trace a file name "
                                  f"(e.g. {os.path.join(trace, 'trace.json')!r})")
            check_writable(os.path.dirname(os.path.abspath(trace)), "train.trace")


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
    specs = cfg.table_specs()     # with the measured miss-ratio curves of the tables it may cache, below
    if cfg.sharding.plan_file:
        plan = load_plan_file(cfg.sharding.plan_file, specs, pg.world_size, pg.local_world_size)
    else:
        parts = PARTITIONERS if cfg.sharding.partitioner == "auto" else (cfg.sharding.partitioner,)
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
        plan.summary["step"] = predict_step(plan, specs, dense, topo, consts,   # the plan's own hit rates
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


CURVE_MEMORY_BYTES = 2 << 30
"""The most memory the simulated caches of :func:`measure_cache_curves` hold at once (each a cache
index: 16 bytes a row of its table and 24 a slot, under the lookahead policy); caches beyond it
take the skew model, in the order of the tables, smaller shares first."""
CURVE_WORK_ROWS = 100_000_000
"""The most rows the simulated caches admit in all (each batch's distinct rows, about half a
microsecond each on the CPU, so about a minute): where the reading would go past it, it stops,
and the caches not done take the skew model."""


def measure_cache_curves(cfg, data: DataSpec, specs, which: Sequence[bool], global_batch: int):
    """``specs`` with a measured miss-ratio curve (``hit_curve``, ``distinct_per_batch``) for
    every table marked in ``which``, at each cache share the planner considers whose cache holds
    two batches: the steady state's hit rates, as a long run sees them.

    Each cache is simulated with the table's policy by ``neo cache-report``'s cache index, two
    batches pinned at a time (as under the training pipeline), on the table's ids in the global
    batches of the training data, from empty (:class:`~neo.embedding.cache.simulate.SteadyHitRate`):
    once its misses reach twice its capacity, the hits of the next ``sharding.cache_sample_batches``
    batches are counted. Batches are read until every cache has counted them, at most
    ``sharding.cache_warmup_batches`` more than those. A cache that cannot warm up in that many
    (a large share of a large table; judged once ``cache_sample_batches`` batches are admitted, by
    their rate of misses, which only falls as a cache fills, so as not to read batches for it in
    vain) takes the skew model's hit rate (:mod:`neo.planner.cache_model`) at the Zipf exponent
    fitted to the distinct rows of the first batches (:func:`~neo.planner.cache_model.fit_skew`);
    so do the caches beyond :data:`CURVE_MEMORY_BYTES` and those not done within
    :data:`CURVE_WORK_ROWS` (tables of 10^8 rows, batches of 10^5 ids). Until 2026-12-01 the curve was
    the first 16 batches' from an empty cache: 0.33 at every share on
    ``configs/cached_tables.yaml``, where training's caches settle at 0.58-0.72 (docs/cache.md)."""
    import types

    import numpy as np

    from neo.embedding.cache.index import CacheCapacityError
    from neo.embedding.cache.simulate import SteadyHitRate, rows_needed
    from neo.planner.cache_model import CACHE_FRACTIONS, fit_skew, hit_rate

    counted, warmup = cfg.sharding.cache_sample_batches, cfg.sharding.cache_warmup_batches
    tables = {t.name: t for t in resolve_tables(cfg)}
    one = types.SimpleNamespace(rank=0, world_size=1)
    loader, _ = make_loaders(replace(cfg, train=replace(cfg.train, batch_size=global_batch)), data, one)
    mapping = feature_mapping(loader.meta.sparse_names, list(tables.values()))
    picked = [s for s, w in zip(specs, which) if w]
    first: Dict[str, List[np.ndarray]] = {s.name: [] for s in picked}    # the first batches' distinct rows
    ids: Dict[str, List[int]] = {s.name: [] for s in picked}              # and their ids
    curves: Dict[str, Dict[float, Optional[float]]] = {}   # share -> steady hit rate (None: the model's)
    live: Dict[str, Dict[float, SteadyHitRate]] = {}       # the simulations still reading batches
    budget = {"bytes": CURVE_MEMORY_BYTES, "rows": CURVE_WORK_ROWS}

    def feed(name: str, rows: np.ndarray, read: int) -> None:
        """Batch number ``read`` - 1 of the table to every live simulation."""
        budget["rows"] -= len(rows) * len(live[name])
        for f, sim in list(live[name].items()):
            try:
                sim.feed(rows)
            except CacheCapacityError:      # a later pair of batches needs more rows than this cache holds
                del live[name][f], curves[name][f]
                continue
            if sim.done:
                curves[name][f] = sim.hit_rate
                del live[name][f]
            elif sim.admitted == counted:   # warm-up and count within the batches left (read or held)?
                if sim.batches_to_warm() + counted > (counted + warmup - read) + sim.pending:
                    del live[name][f]       # no: the model's rate

    def start(spec) -> None:
        """The table's simulations, one per share whose cache holds two of the first batches, fed those."""
        t, batches = tables[spec.name], first[spec.name]
        need = rows_needed(batches, pipelined=True)
        fractions = [spec.cache_fraction] if spec.cache_fraction is not None else list(CACHE_FRACTIONS)
        caps = {f: max(1, int(np.ceil(f * t.num_rows))) for f in fractions}
        curves[spec.name] = {f: None for f, c in caps.items() if c >= need}
        live[spec.name] = {}
        for f in sorted(curves[spec.name]):
            size = 16 * t.num_rows + 24 * caps[f]
            if size <= budget["bytes"]:
                budget["bytes"] -= size
                live[spec.name][f] = SteadyHitRate(t.num_rows, caps[f], t.cache_policy.value, t.cache_lookahead,
                                                   counted)
        for k, b in enumerate(batches):
            feed(spec.name, b, k + 1)

    it = iter(loader)
    try:
        for k, batch in enumerate(it):
            sparse = rename_features(batch, mapping).sparse
            for s in picked:
                parts = [sparse.feature(f)[0].numpy() for f in tables[s.name].feature_names]
                rows = np.unique(np.concatenate(parts))
                if k < counted:
                    first[s.name].append(rows)
                    ids[s.name].append(sum(len(p) for p in parts))
                else:
                    feed(s.name, rows, k + 1)
            if k + 1 == counted:
                for s in picked:
                    start(s)
            if k + 1 >= counted and (k + 1 >= counted + warmup or not any(live.values()) or budget["rows"] < 0):
                break
    finally:
        it.close()
    for s in picked:
        if s.name not in curves and first[s.name]:     # the data has fewer batches than cache_sample_batches
            start(s)
    for name, sims in live.items():
        for f, sim in sims.items():
            try:
                sim.finish()
            except CacheCapacityError:
                del curves[name][f]
                continue
            if sim.done:
                curves[name][f] = sim.hit_rate
    out = list(specs)
    for i, (s, w) in enumerate(zip(specs, which)):
        if not w or s.name not in curves:
            continue
        t = tables[s.name]
        distinct, n = float(np.mean([len(b) for b in first[s.name]])), float(np.mean(ids[s.name]))
        skew = fit_skew(t.num_rows, n, distinct)
        curve = tuple((f, h if h is not None else hit_rate(f, t.num_rows, skew, n, policy=t.cache_policy.value,
                                                          lookahead=t.cache_lookahead))
                      for f, h in curves[s.name].items())
        out[i] = replace(s, hit_curve=curve, distinct_per_batch=distinct)
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
