"""End-to-end DLRM training throughput: Neo against TorchRec's DistributedModelParallel (CPU, gloo).

    python tools/bench_train.py --json bench_out/train.json                   # both workloads
    python tools/bench_train.py --workloads one-hot --steps 20                # shorter
    python tools/bench_train.py --quick                                       # smoke run (small tables)

Model (the same in both systems): 26 tables of 100k rows, D = 64, fp32, sum pooling; DLRM with
dot interaction, bottom MLP 13-512-256-64, top MLP 512-256-1; BCE loss; embeddings trained by
fused Adagrad (TorchRec: EXACT_ADAGRAD), dense parameters by torch.optim.Adagrad, lr 0.01 (Neo: its
trainer's ``dense_optimizer``, torch's fused Adagrad; TorchRec: the default per-tensor loop, as its
examples write it);
batch 2048 per rank, 2 gloo processes, one torch thread each (OMP_NUM_THREADS=1).
Workloads: ``one-hot`` (one id per table) and ``multi-hot`` (MLPerf DLRM-DCNv2 bag sizes
3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1); ids uniform; the same pre-built
batches (4 per rank, cycled) feed both systems, so data loading is not measured.

Neo: :class:`neo.train.pipeline.TrainPipeline` (input distribution of batch i+1 and the pooled
AlltoAll under the bottom MLP overlapped with compute) on a table-wise, a row-wise and a mixed
plan (tables cycle through the six sharding types). TorchRec: DMP with its planner forced to
table_wise (it has no CPU row-wise kernels for fused training here), a plain loop
(``TrainPipelineSparseDist`` needs CUDA streams). Systems run in alternating blocks of
``--block`` steps (after ``--warmup`` steps each) so that load from other jobs on a shared
machine hits them alike; samples/s = timed samples / timed seconds (a barrier closes every block);
samples/CPU-s = timed samples / CPU seconds of both processes (``time.process_time``, all their
threads): less sensitive to other jobs on a shared machine than the wall clock.
``--dense-dtype bf16`` runs the MLPs and the interaction of both systems under ``torch.autocast``.
``--isa avx2`` caps every library of both systems (Neo's kernels, ATen, oneDNN, MKL, FBGEMM) at
AVX2 in every process (tools/bench_common.py), so an AVX-512 machine stands in for an AVX2 one.
``--position-weights``: every feature's ids weighted by learnable weights of their position in the
bag (one per position of the workload's bag size), trained with the dense model, in both systems:
Neo's :class:`neo.embedding.PositionWeights` as the collection's ``weight_table`` (each id travels
with its slot, the weights are read at the lookup); TorchRec's ``PositionWeightedModuleCollection``
in a ``FeatureProcessedEmbeddingBagCollection``, sharded by its sharder (the weights applied on the
shards' ranks after its input distribution). Both start at Neo's values, 0.5 + position / bag size
(not 1, so that the forward check compares them too).

Same model check, before any timing: TorchRec's DLRM starts from the first Neo plan's weights
(every table, gathered by ``full_weights()`` and copied into TorchRec's local shards; the bottom and
top MLPs' weights and biases, layer by layer: both models' interaction output is [dense, the dot
products of the pairs i < j of (dense, f0, f1, ...)], so no column of the top MLP moves), and one
forward of both systems on the same first batch (no backward, no update) is compared:
``max_abs_diff_vs_neo``, the largest |logit - Neo's| over both ranks. Past ``FORWARD_TOLERANCE`` (1e-4)
of Neo's largest |logit| the run stops with an error (the two would not be training the same model).
The check runs in fp32 under ``--dense-dtype bf16`` too (bf16 rounding would hide small mismatches).

Output: a table and, with ``--json``, records with ``system``, ``sharding_type``, ``workload``,
``samples_per_s``, ``samples_per_cpu_s``, ``step_ms`` (Neo: ``phase_ms``, rank 0's blocked time per phase),
``max_abs_diff_vs_neo`` (TorchRec's records: the forward check above; None in Neo's) and ``machine``
(CPU model, ISA flags, the --isa cap, the ISA Neo's kernels and ATen chose, and ``memory_latency_ns``:
a dependent read from DRAM before and after the runs, printed too; bench_common.memory_latency_ns).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench_common import (add_isa_arg, add_no_shm_arg, add_system_malloc_arg, apply_isa, apply_quick,  # noqa: E402
                          copy_into_torchrec, describe_machine, json_path, machine_info, memory_latency_ns, multiple_of,
                          nonneg_int, note_memory_latency, positive_int, start_rank, write_json)
import torch.distributed as dist  # noqa: E402

MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
SIX = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel")


def _batches(args, rank: int, sizes, n: int = 4):
    from data_pipeline.loader import Batch
    from neo.sparse import KeyedJaggedBatch

    gen = torch.Generator().manual_seed(1000 + rank)
    keys = tuple(f"f{t}" for t in range(args.tables))
    lengths = torch.cat([torch.full((args.batch,), k, dtype=torch.int64) for k in sizes])
    out = []
    for _ in range(n):
        ids = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
        sparse = KeyedJaggedBatch(keys, ids, lengths, args.batch)
        out.append(Batch(torch.rand(args.batch, 13, generator=gen), sparse,
                         torch.randint(0, 2, (args.batch,), generator=gen).float()))
    return out


class _Runner:
    """One system x plan: ``step()`` one training step; ``forward(batch)`` the logits (B,) of one
    forward of ``batch``, fp32, without grad or update (the forward check)."""

    def __init__(self, system: str, sharding_type: str, step, drain=lambda: None, timers=None, forward=None):
        self.system, self.sharding_type, self.step, self.drain = system, sharding_type, step, drain
        self.seconds, self.cpu_seconds, self.steps, self.timers = 0.0, 0.0, 0, timers
        self.forward = forward
        self.max_abs_diff_vs_neo = None
        self.model = self.sharded = None                # Neo's: what TorchRec starts from


def _balanced_ranks(sizes, world_size: int) -> Dict[str, int]:
    """Table-wise placement by ids per sample (longest processing time first): each table goes
    to the rank with the fewest ids so far (the dims are equal). Both systems get the same
    knowledge: TorchRec's planner the same pooling factors (``_torchrec_runner``)."""
    load, ranks = [0] * world_size, {}
    for t in sorted(range(len(sizes)), key=lambda t: (-sizes[t], t)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        ranks[f"t{t}"] = r
        load[r] += sizes[t]
    return ranks


def _planner_ranks(tables, sizes, world_size: int, batch: int) -> Dict[str, int]:
    """Table-wise placement by Neo's planner (:func:`neo.planner.plan_tables`, built-in CPU cost
    constants) from the same pooling factors TorchRec's planner gets: its cost model counts a
    table's distinct rows a step (memory traffic of the update and the lookup), not only its ids."""
    from neo.config.tables import table_spec
    from neo.planner import plan_tables
    from neo.planner.constants import builtin_constants
    from neo.planner.types import GIB, Device, ShardingType, TableConstraints, Topology

    only_tw = TableConstraints(sharding_types=(ShardingType.TABLE_WISE,))
    specs = [table_spec(t, float(sizes[k]), constraints=only_tw) for k, t in enumerate(tables)]
    topo = Topology(world_size, world_size, tuple(Device(16 * GIB, 16 * GIB) for _ in range(world_size)), batch)
    plan = plan_tables(specs, topo, builtin_constants("cpu"))
    return {name: tp.shards[0].rank for name, tp in plan.tables.items()}


def _neo_runner(args, kind: str, pg, batches, sizes) -> _Runner:
    import torch.nn.functional as F

    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.distributed import ShardedEmbeddingCollection, even_plan
    from neo.models import DLRM
    from neo.train.pipeline import PlainLoop, StepBatch, TrainPipeline
    from neo.train.step import DenseStep, Timers, wrap_ddp
    from neo.config.train import OptimConfig
    from neo.train.trainer import dense_optimizer

    opt = OptimizerConfig("adagrad", lr=0.01)
    tables = [TableConfig(f"t{t}", args.rows, args.dim, (f"f{t}",), optimizer=opt) for t in range(args.tables)]
    types = {t.name: (kind if kind != "mixed" else SIX[i % len(SIX)]) for i, t in enumerate(tables)}
    ranks = None                                             # naive: even_plan's blocks of tables
    if args.placement == "planner":
        ranks = _planner_ranks(tables, sizes, pg.world_size, args.batch)
    elif args.placement == "balanced":
        ranks = _balanced_ranks(sizes, pg.world_size)
    plan = even_plan(tables, types, pg.world_size, pg.local_world_size, ranks=ranks)
    sharded = ShardedEmbeddingCollection(tables, plan, pg, backend=args.backend, validate=False)
    position = None
    if args.position_weights:                                 # one weight per position of each bag size
        from neo.embedding import PositionWeights

        position = PositionWeights({f"f{t}": int(sizes[t]) for t in range(args.tables)})
        with torch.no_grad():
            for w in position.weights.values():
                w.copy_(0.5 + torch.arange(w.numel(), dtype=torch.float32) / w.numel())
    torch.manual_seed(0)
    model = DLRM(sharded, args.tables, args.dim, 13, [512, 256, args.dim], [512, 256, 1],
                 position_weights=position)
    timers = Timers()
    dtype = torch.bfloat16 if args.dense_dtype == "bf16" else torch.float32
    ddp = wrap_ddp(DenseStep(model, timers, overlap=not args.plain, dense_dtype=dtype), pg)
    dense_opt = dense_optimizer(OptimConfig(type="adagrad", lr=0.01, eps=1e-10),
                                [p for n, p in model.named_parameters() if not n.startswith("embedding.")])

    def step_fn(sb, dist_batch):
        loss = F.binary_cross_entropy_with_logits(ddp(sb.batch.dense, dist_batch), sb.batch.labels)
        with timers("backward"):
            dense_opt.zero_grad(set_to_none=True)
            loss.backward()
        with timers("optimizer"):
            dense_opt.step()
        return loss.detach()

    def source():
        i = 0
        while True:
            yield StepBatch(batches[i % len(batches)], {})
            i += 1

    # the forward check's: the timed path's forward (fp32), or with --dense-dtype bf16 the same
    # model's in fp32 (FORWARD_TOLERANCE)
    check_step = ddp if dtype == torch.float32 else DenseStep(model, Timers(), overlap=not args.plain)

    def forward(batch):
        with torch.no_grad():
            return check_step(batch.dense, sharded.input_dist(batch.sparse).wait())

    Loop = PlainLoop if args.plain else TrainPipeline
    loop = Loop(source(), sharded, step_fn, torch.device("cpu"), timers)
    runner = _Runner("neo", kind, lambda: loop.step(), loop.drain, timers, forward)
    runner.model, runner.sharded = model, sharded
    return runner


def _linears(module) -> List[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def _start_from_neo(dmp, neo_model, weights: Dict[str, torch.Tensor]) -> None:
    """TorchRec's DLRM ``dmp`` onto Neo's: tables ``weights`` (Neo's full tables by name) into
    its local shards; the MLPs layer by layer (Neo ``bottom.{0,2,4}`` -> ``dense_arch.model._mlp.
    {0,1,2}._linear``, ``top.{0,2}`` -> ``over_arch.model.0._mlp.{0,1}._linear``, ``top.4`` ->
    ``over_arch.model.1``). Both interactions output [dense, dots of the pairs i < j of (dense, f0,
    f1, ...)] (triu_indices(F + 1, F + 1, offset=1), features in table order in both), so the top
    MLP's first layer takes Neo's columns as they are. On every rank alike (the dense parameters are
    replicas under DDP: set in place, under no_grad)."""
    module = dmp.module                                       # unwrapped: no DMP / DDP wrapper
    copy_into_torchrec(module.sparse_arch.embedding_bag_collection, weights)
    with torch.no_grad():
        for neo_part, trec_part in ((neo_model.bottom, module.dense_arch), (neo_model.top, module.over_arch)):
            mine, theirs = _linears(neo_part), _linears(trec_part)
            if [m.weight.shape for m in mine] != [m.weight.shape for m in theirs]:
                raise RuntimeError(f"Neo's and TorchRec's MLP layers differ: {[tuple(m.weight.shape) for m in mine]} "
                                   f"vs {[tuple(m.weight.shape) for m in theirs]}")
            for a, b in zip(mine, theirs):
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)


def _torchrec_runner(args, pg_world, batches, sizes, neo: _Runner) -> _Runner:
    """TorchRec's DMP DLRM, started from the Neo runner ``neo``'s weights (:func:`_start_from_neo`)."""
    import torch.nn.functional as F
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM as TorchRecDLRM
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    W = dist.get_world_size(pg_world)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{t}", embedding_dim=args.dim,
                                                            num_embeddings=args.rows, feature_names=[f"f{t}"])
                                         for t in range(args.tables)], device=torch.device("meta"),
                                 is_weighted=args.position_weights)
    torch.manual_seed(0)
    model = TorchRecDLRM(ebc, 13, [512, 256, args.dim], [512, 256, 1], dense_device=torch.device("cpu"))
    pf = (lambda t: dict(pooling_factors=[float(sizes[t])])) if args.placement != "naive" else (lambda t: {})
    constraints = {f"t{t}": ParameterConstraints(sharding_types=["table_wise"], **pf(t)) for t in range(args.tables)}
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD,
                                                          "learning_rate": 0.01, "eps": 1e-8})
    if args.position_weights:         # the EBC inside a feature-processed one (its DLRM reads the EBC's configs first)
        from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
        from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
        from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

        fp = PositionWeightedModuleCollection({f"f{t}": int(sizes[t]) for t in range(args.tables)})
        model.sparse_arch.embedding_bag_collection = FeatureProcessedEmbeddingBagCollection(ebc, fp)
        sharder = FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=sharder)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=W, compute_device="cpu", local_world_size=W),
                                       constraints=constraints)
    plan = planner.collective_plan(model, [sharder], pg_world)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg_world), plan=plan,
                                   sharders=[sharder], device=torch.device("cpu"))
    _start_from_neo(dmp, neo.model, neo.sharded.full_weights())   # full_weights: collective on Neo's groups
    if args.position_weights:
        with torch.no_grad():
            for name, param in dmp.named_parameters():
                if "position_weights." in name:
                    param.copy_(neo.model.position_weights.weights[name.rsplit(".", 1)[1]])
    if args.test_perturb_torchrec:                            # tests only: a model that is not Neo's
        with torch.no_grad():
            _linears(dmp.module.over_arch)[-1].bias.add_(args.test_perturb_torchrec)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=0.01))
    kjts = [(b.dense, b.sparse.to_torchrec(), b.labels) for b in batches]
    state = {"i": 0}

    def step():
        dense, kjt, labels = kjts[state["i"] % len(kjts)]
        state["i"] += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dense_dtype == "bf16"):
            logits = dmp(dense, kjt).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        return loss.detach()

    def forward(batch):                                       # fp32, as Neo's (FORWARD_TOLERANCE)
        with torch.no_grad():
            return dmp(batch.dense, batch.sparse.to_torchrec()).squeeze(-1).float()

    return _Runner("torchrec", "table_wise", step, forward=forward)


# Largest |logit - Neo's| allowed in the forward check, relative to Neo's largest |logit| (both over
# the ranks). The same fp32 arithmetic in another order (pooling sums, the GEMMs' blocking, Neo's
# fused interaction against TorchRec's bmm) differs by ~1e-7 of it (measured on --quick: 6e-8 to
# 1.2e-7); a real mismatch is far above 1e-4: TorchRec's own tables instead of Neo's 0.1, two tables
# swapped 2e-2, the top MLP's last two pair columns swapped 2e-3 (--quick, multi-hot).
# --dense-dtype bf16 runs the check in fp32 (the same weights; both systems' bf16 is the same
# torch.autocast): bf16 keeps 8 bits (4e-3 relative a value), so a bf16 tolerance would either trip
# on rounding (a pooled sum one fp32 ulp apart rounds to another bf16 value) or let a swap of two
# pair columns through.
FORWARD_TOLERANCE = 1e-4


def _forward_check(neo: _Runner, other: _Runner, batch, dense_dtype: str, group) -> float:
    """Max |logit - Neo's| over the ranks of one fp32 forward of ``batch`` (before any update);
    past ``FORWARD_TOLERANCE`` of Neo's largest |logit| an error on every rank. Collective."""
    ref, out = neo.forward(batch).float(), other.forward(batch).float()
    stats = torch.tensor([float((out - ref).abs().max()), float(ref.abs().max())], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    diff, scale = float(stats[0]), float(stats[1])
    limit = FORWARD_TOLERANCE * scale
    if not diff <= limit:                                     # NaN fails too
        raise RuntimeError(f"forward check: {other.system}'s logits differ from Neo's ({neo.sharding_type}) by "
                           f"{diff:.3g} on the same batch and weights (allowed {limit:.3g} = {FORWARD_TOLERANCE:g} x "
                           f"max |logit| {scale:.3g}): not the same model")
    if dist.get_rank() == 0:
        note = " (--dense-dtype bf16: checked in fp32, the same weights; timed in bf16)" * (dense_dtype == "bf16")
        print(f"forward check: max |{other.system} logit - neo ({neo.sharding_type})| {diff:.2e} "
              f"(max |logit| {scale:.3g}, allowed {limit:.2e}){note}", flush=True)
    return diff


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    from neo.distributed import ProcessGroups

    start_rank(args.threads, args.system_malloc)
    machine = machine_info(args.isa)   # in the rank: the ISA its kernels and ATen chose
    pg = ProcessGroups.build(world_size, timeout=datetime.timedelta(seconds=600), shm=not args.no_shm)
    trec_group = dist.new_group(list(range(world_size)))      # TorchRec's collectives on a group of their own
    records = []
    for workload in args.workloads:
        sizes = MULTI_HOT[: args.tables] if workload == "multi-hot" else (1,) * args.tables
        batches = _batches(args, rank, sizes)
        runners = [_neo_runner(args, kind, pg, batches, sizes) for kind in args.neo_plans]
        if not args.no_torchrec:
            # TorchRec starts from the first Neo plan's weights and is checked against it alone:
            # every Neo runner builds its DLRM after torch.manual_seed(0) (the same MLPs), but its
            # tables' initial values depend on the plan (each rank seeds its own shards)
            trec = _torchrec_runner(args, trec_group, batches, sizes, runners[0])
            trec.max_abs_diff_vs_neo = _forward_check(runners[0], trec, batches[0], args.dense_dtype, pg.world)
            runners.append(trec)
        for r in runners:                                       # warm-up
            for _ in range(args.warmup):
                r.step()
            r.drain()
            if r.timers is not None:
                r.timers.reset()
        done = 0
        while done < args.steps:
            k = min(args.block, args.steps - done)
            for r in runners:
                dist.barrier(group=pg.world)
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(k):
                    r.step()
                r.drain()
                c1 = time.process_time()
                dist.barrier(group=pg.world)
                r.seconds += time.perf_counter() - t0
                r.cpu_seconds += c1 - c0
                r.steps += k
            done += k
        for r in runners:
            secs = torch.tensor([r.seconds])
            dist.all_reduce(secs, op=dist.ReduceOp.MAX, group=pg.world)
            s = float(secs)
            cpu = torch.tensor([r.cpu_seconds])
            dist.all_reduce(cpu, group=pg.world)                # CPU seconds of all ranks (load-independent-ish)
            records.append({"system": r.system, "sharding_type": r.sharding_type, "workload": workload,
                            "samples_per_s": round(r.steps * args.batch * world_size / s, 1),
                            "step_ms": round(1e3 * s / r.steps, 2), "steps": r.steps, "world_size": world_size,
                            "samples_per_cpu_s": round(r.steps * args.batch * world_size / float(cpu), 1),
                            "batch_per_rank": args.batch, "tables": args.tables, "rows": args.rows, "dim": args.dim,
                            "pipelined": r.system == "neo" and not args.plain, "dense_dtype": args.dense_dtype,
                            "retain_freed_memory": not args.system_malloc,
                            "neo_shm_collectives": pg.uses_shm, "placement": args.placement,
                            "position_weights": args.position_weights,
                            "max_abs_diff_vs_neo": r.max_abs_diff_vs_neo, "machine": machine})
            if r.timers is not None:                            # rank 0's blocked time per phase
                records[-1]["phase_ms"] = {k: round(1e3 * v / r.steps, 2) for k, v in r.timers.snapshot().items()}
        del runners
    return records


def _print(records: List[Dict[str, Any]]) -> None:
    print(f"{'workload':10s} {'system':9s} {'sharding':12s} {'samples/s':>11s} {'step ms':>9s} {'vs TorchRec':>12s} "
          f"{'samples/CPU-s':>14s} {'vs TorchRec':>12s}  max |logit - neo|")
    for r in records:
        ref = next((x for x in records if x["system"] == "torchrec" and x["workload"] == r["workload"]), None)
        ratio = f"{r['samples_per_s'] / ref['samples_per_s']:.2f}x" if ref else "-"
        cratio = f"{r['samples_per_cpu_s'] / ref['samples_per_cpu_s']:.2f}x" if ref else "-"
        diff = f"  {r['max_abs_diff_vs_neo']:.1e}" if r.get("max_abs_diff_vs_neo") is not None else ""
        print(f"{r['workload']:10s} {r['system']:9s} {r['sharding_type']:12s} {r['samples_per_s']:11.0f} "
              f"{r['step_ms']:9.1f} {ratio:>12s} {r['samples_per_cpu_s']:14.0f} {cratio:>12s}{diff}")


TRAIN_DEFAULTS = {"rows": 100_000, "batch": 2048, "warmup": 5, "steps": 30, "block": 5}
TRAIN_QUICK = {"rows": 1000, "batch": 256, "warmup": 2, "steps": 4, "block": 2}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["one-hot", "multi-hot"], choices=["one-hot", "multi-hot"])
    p.add_argument("--neo-plans", nargs="+", default=["table_wise", "row_wise", "mixed"],
                   choices=["table_wise", "row_wise", "mixed"] + list(SIX))
    p.add_argument("--tables", type=positive_int, default=26,
                   help=f"tables (multi-hot: at most {len(MULTI_HOT)}, one per MLPerf bag size)")
    p.add_argument("--rows", type=positive_int, default=None, help=f"default {TRAIN_DEFAULTS['rows']}")
    p.add_argument("--dim", type=multiple_of(4), default=64, help="embedding dim (a positive multiple of 4)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help=f"samples per rank (default {TRAIN_DEFAULTS['batch']})")
    p.add_argument("--world-size", type=positive_int, default=2)
    p.add_argument("--warmup", type=nonneg_int, default=None, help=f"default {TRAIN_DEFAULTS['warmup']}")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"timed steps per system (default {TRAIN_DEFAULTS['steps']})")
    p.add_argument("--block", type=positive_int, default=None,
                   help=f"steps per alternating block (default {TRAIN_DEFAULTS['block']})")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--backend", default="auto")
    p.add_argument("--plain", action="store_true", help="Neo without the pipeline (PlainLoop)")
    p.add_argument("--dense-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="MLP / interaction compute type, both systems (bf16 = torch.autocast)")
    p.add_argument("--placement", choices=["planner", "balanced", "naive"], default="planner",
                   help="table-wise placement, each system's from the same pooling factors: planner (Neo: its "
                        "planner's cost model, which weighs each table's distinct rows a step as well as its ids; "
                        "TorchRec: its planner), balanced (Neo: by ids per sample, longest first to the "
                        "least-loaded rank; TorchRec: its planner), or naive (Neo: tables in blocks of consecutive "
                        "ones per rank; TorchRec's planner without pooling factors)")
    p.add_argument("--position-weights", action="store_true",
                   help="learnable weights by position in the bag on every feature, both systems (see above)")
    p.add_argument("--no-torchrec", action="store_true")
    # tests only: added to TorchRec's last bias after it starts from Neo's weights (the check must fail)
    p.add_argument("--test-perturb-torchrec", type=float, default=0.0, help=argparse.SUPPRESS)
    add_system_malloc_arg(p)
    add_no_shm_arg(p)
    add_isa_arg(p)
    p.add_argument("--quick", action="store_true",
                   help="small tables and batches, few steps: " + ", ".join(f"--{k} {v}" for k, v in TRAIN_QUICK.items())
                        + " (flags given explicitly are kept)")
    p.add_argument("--json", default=None, type=json_path)
    args = p.parse_args(argv)
    if "multi-hot" in args.workloads and args.tables > len(MULTI_HOT):
        p.error(f"argument --tables: the multi-hot workload has {len(MULTI_HOT)} bag sizes (MLPerf DLRM-DCNv2), "
                f"so at most {len(MULTI_HOT)} tables; got {args.tables}")
    apply_quick(args, TRAIN_DEFAULTS, TRAIN_QUICK)
    apply_isa(args.isa)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from tests.multiprocess import run_multiprocess

    t0 = time.time()
    latency_before = memory_latency_ns()
    out = run_multiprocess(_rank_main, args.world_size, args, timeout_s=3600, collective_timeout_s=600,
                           threads=args.threads, env={"OMP_NUM_THREADS": str(args.threads)})
    records = out[0]
    print(describe_machine(records[0]["machine"]))
    note_memory_latency(records, latency_before, memory_latency_ns())
    _print(records)
    print(f"({time.time() - t0:.0f} s; {args.world_size} processes x {args.threads} thread; "
          f"machine load average {os.getloadavg()[0]:.1f})")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
