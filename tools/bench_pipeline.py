"""Pipeline schedules, predicted against measured: step time and bubble, at 2 and 4 ranks.

    python tools/bench_pipeline.py --json bench_out/pipeline.json --plot bench_out/pipeline.png
    python tools/bench_pipeline.py --quick                        # smaller model, fewer steps

Model: DLRM with a deep top MLP (dot interaction, 8 features of D = 16, bottom 13-64-16, top
``--top-layers`` x ``--width`` then the logit); its embeddings sharded table-wise over every
rank; ``--batch`` samples per rank, fp32, Adagrad. For each world size (``--worlds``) every
schedule runs the dense layers pipelined over S = W stages (1 replica): gpipe, 1f1b,
interleaved_1f1b (2 chunks per rank), zero_bubble (ZB-1P, 1 chunk) and chimera, with
``--micro-batches`` micro-batches; beside them a data-parallel baseline (the whole dense model on
every rank, gradients AllReduced).

Predicted (neo/pipeline/simulate.py, each schedule's order of actions replayed): the layers are
profiled at the micro-batch size (:func:`neo.pipeline.profile.profile_layers`) by as many ranks at
once as the machine has cores, the mean over them, and the partitioner cuts the profile into
S x v chunks (the measured runs use that same split). Each chunk is then timed whole as its stage
runs it (:func:`neo.pipeline.profile.profile_chunks`: one autograd graph through its layers costs
10-30% more than their sum here), with zero bubble's input and weight passes as torch's schedules
run them, by every rank at once (with more ranks than cores, by the CPU each call costs: process
time). The chunks are timed again just before and just after each schedule's run, and the model
takes the mean of the two: on this shared machine the speed of the same code drifts by up to a
fifth from one minute to the next. The gloo point-to-point times (a tiny and the largest
activation, ranks 0 and 1) give each boundary's latency, and AllReduces probed on the groups that
run them (every rank for data parallel, each pair of mirrored Chimera workers) give the gradient
synchronisation's bandwidth. :func:`neo.pipeline.simulate.predict_replayed` then replays every
rank's actions in the schedule's own order, with the ranks sharing the cores
(``formula_ms``: the closed form of :func:`neo.pipeline.perf_model.predict` on the same inputs).

The runtime's cost per action (the schedule's bookkeeping, the copies, buffers and transfers of
its activations) comes from each schedule run once more on a null model: the same layers, split
and activation shapes, each Linear hollowed out to a broadcast multiply (:class:`_Hollow`). With a
core per rank it is the ``op_ms`` under which the replay gives the null model's measured step
(``fit_op_ms``); with more ranks than cores it is CPU the ranks compete for: the null run's
CPU (process time of every rank) less its chunks' compute, per action (``runtime_cpu_ms``). The
model side, pure functions of these measurements, is tools/pipeline_prediction.py.
The data-parallel baseline's prediction times the whole model on a rank's batch at once.

Measured: per step (a barrier before each), the wall time of the pipelined part (the schedule's
``run``) plus the gradient AllReduce, the slowest rank's; ``bubble_fraction = 1 - sum of the
ranks' busy time / (W x pipelined time)``, busy time summed by timers around every stage's
forward and backward (neo/pipeline/stages.py). The embedding lookup, the routing of pooled rows
and the embedding backward are outside both figures (``full_step_ms`` has them). Medians over
``--steps`` steps after ``--warmup``.

Output: a table, and with ``--json`` records with ``schedule``, ``world_size``, ``stages``,
``micro_batches``, ``predicted_ms``, ``measured_ms``, ``bubble_fraction``,
``predicted_bubble_fraction``, ``ratio`` (predicted / measured), ``full_step_ms``, ``formula_ms``,
the CPU accounts (``cpu_ms``: every rank's process CPU in the pipelined part, summed; ``busy_cpu_ms``:
of which in the chunks' compute; ``chunk_ms``: what the chunk profile says that compute costs;
``null_cpu_ms``: the null model's ``cpu_ms``; ``null_busy_cpu_ms``, ``null_chunk_ms``: its
``busy_cpu_ms`` and ``chunk_ms``), and ``machine`` (CPU model, ISA flags, load average;
tools/bench_common.py). ``--schedules`` runs some of the pipeline schedules only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import apply_quick, json_path, nonneg_int, positive_int  # noqa: E402
from bench_common import (add_isa_arg, apply_isa, describe_machine, machine_info, start_rank,  # noqa: E402
                          write_json)
from neo.pipeline.simulate import COST_FIELDS  # noqa: E402
from pipeline_measurement import (D, F, NUM_DENSE, _allreduce_ms, _batch, _CpuTimers, _median,  # noqa: E402
                                  _model, _one_way_ms, _split, _tables)
from pipeline_prediction import (allreduce_gbps, compute_ms, fit_op_ms, predict_pipeline,  # noqa: E402
                                 runtime_cpu_ms)

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1), ("chimera", 1)]
"""(schedule, virtual_stages) measured at every world size."""


def _rank_main(rank: int, W: int, args) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from neo.config.parallel import PipelineConfig
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
    from neo.pipeline.layers import LayerStack, layers_of
    from neo.pipeline.partition import LayerProfile
    from neo.machine import usable_cores
    from neo.pipeline.layers import split_stages
    from neo.pipeline.profile import build_profile, profile_chunks, profile_layers
    from neo.pipeline.stages import ContiguousOutputs
    from neo.pipeline.trainer import PipelinedDense
    from neo.train.trainer import dense_optimizer
    from neo.config.train import OptimConfig

    start_rank(args.threads, system_malloc=False)
    pg = ProcessGroups.build(W)
    tables = _tables()
    plan = even_plan(tables, {t.name: "table_wise" for t in tables}, W)
    micro = W * args.batch // args.micro_batches
    # The profiles: the ranks that have a core each measure at the same time (so that each layer is
    # timed beside the others' work, as in the runs; the ranks beyond the cores wait, since a layer
    # timed while it takes turns for a core would count the turns, which the model's cores bound
    # counts once), the mean over them.
    profilers = max(1, min(W, usable_cores() // max(1, args.threads)))

    def mean_of(mine, keys):
        every: List[Any] = [None] * W
        dist.all_gather_object(every, mine)
        got = [e for e in every if e is not None]
        return [dict(r, **{key: statistics.mean(e[k][key] for e in got) for key in keys}) for k, r in enumerate(got[0])]

    def profiled(hollow: bool = False):
        dist.barrier()
        mine = None
        if rank < profilers:
            mine = [dataclasses.asdict(r) for r in profile_layers(layers_of(_model(args, torch.nn.Identity(), hollow)),
                                                                  micro, NUM_DENSE, F * D, repeats=args.repeats)]
        return mean_of(mine, ("fwd_ms", "bwd_ms"))

    # The chunks of a split: every rank times them at once, as they will run; with more ranks than
    # cores by the CPU each call costs (process time: the turns drop out, the ranks' slowing of
    # each other stays in), else by wall time.
    shared_cores = W * max(1, args.threads) > usable_cores()

    def chunks_profiled(split, hollow: bool = False, batch: int = micro, wrap: bool = True):
        """Each chunk of ``split`` timed whole at ``batch``, as a stage runs it (profile_chunks)."""
        dist.barrier()
        layers = layers_of(_model(args, torch.nn.Identity(), hollow))
        chunks = [ContiguousOutputs(c) if wrap else c for c in split_stages(layers, [tuple(x) for x in split])]
        mine = [dataclasses.asdict(c) for c in profile_chunks(
            chunks, batch, NUM_DENSE, F * D, repeats=args.repeats,
            clock=time.process_time if shared_cores else time.perf_counter)]
        return mean_of(mine, COST_FIELDS)

    rows, null_rows = profiled(), profiled(hollow=True)
    profile = build_profile([LayerProfile(**r) for r in rows], args.bandwidth_gbps, batch_size=micro)
    splits = {v: _split(profile, W * v) for v in sorted({v for _, v in SCHEDULES})}
    chunk_rows = {str(v): chunks_profiled(splits[v]) for v in splits}
    null_chunk_rows = {str(v): chunks_profiled(splits[v], hollow=True) for v in splits}
    def whole_profiled():
        """Data parallel's model: the whole one on the rank's batch at once."""
        return chunks_profiled([[0, len(rows) - 1]], batch=args.batch, wrap=False)

    big = max(r["activation_bytes"] for r in rows)
    one_way = {n: _one_way_ms(rank, n) for n in (4, big)}                # ranks 0 and 1, the others idle
    # the gradient AllReduces as they run: every parameter over the W ranks (data parallel), and
    # the mirrored stages' over each pair of Chimera's workers
    layer_bytes = [r["param_bytes"] for r in rows]
    allreduce = {"world": (sum(layer_bytes), W, _allreduce_ms(layer_bytes))}
    if W % 2 == 0:
        pairs = [dist.new_group([w, W - 1 - w]) for w in range(W // 2)]
        chunk_bytes = [layer_bytes[a:z + 1] for a, z in splits[1]]
        w = max(range(W // 2), key=lambda w: sum(chunk_bytes[w]) + sum(chunk_bytes[W - 1 - w]))
        mirrored = chunk_bytes[w] + chunk_bytes[W - 1 - w]          # the largest pair's two chunks
        allreduce["pairs"] = (sum(mirrored), 2, _allreduce_ms(mirrored, pairs[min(rank, W - 1 - rank)]))
    gen = torch.Generator().manual_seed(100 + rank)
    batches = [_batch(args, rank, W, gen) for _ in range(2)]
    out: Dict[str, Any] = {"profile": rows, "null_profile": null_rows, "chunks": chunk_rows,
                           "null_chunks": null_chunk_rows, "one_way_ms": one_way,
                           "allreduce": allreduce, "runs": {}, "null_runs": {}}

    def run(schedule: str, v: int, hollow: bool = False) -> Dict[str, Any]:
        S = W
        sec = ShardedEmbeddingCollection(tables, plan, pg, seed=0)
        model = _model(args, sec, hollow)
        cfg = PipelineConfig(stages=S, schedule=schedule, micro_batches=args.micro_batches, virtual_stages=v,
                             split=splits[v])
        cfg.validate()
        pipe = PipelinedDense(cfg, model, pg, args.batch, NUM_DENSE, F * D)
        opt = dense_optimizer(OptimConfig(type="adagrad", lr=0.01), pipe.parameters())
        timers = _CpuTimers()
        pipe_s, sync_s, busy_s, full_s, cpu_s, busy_cpu_s = [], [], [], [], [], []
        for step in range(args.warmup + args.steps):
            dense, sparse, y = batches[step % len(batches)]
            dist.barrier()
            timers.reset()
            pipe.meter.reset()
            t0 = time.perf_counter()
            pooled = sec(sparse)
            pipe.step(dense, pooled, y, timers)
            opt.step()
            full = time.perf_counter() - t0
            if step >= args.warmup:
                pipe_s.append(timers.seconds["pipeline"])
                sync_s.append(timers.seconds["pipeline_sync"])
                busy_s.append(pipe.meter.seconds)
                full_s.append(full)
                cpu_s.append(timers.cpu["pipeline"])
                busy_cpu_s.append(pipe.meter.cpu_seconds)
        return {"virtual_stages": v, "split": cfg.split, "pipeline_s": pipe_s, "sync_s": sync_s,
                "busy_s": busy_s, "full_s": full_s, "cpu_s": cpu_s, "busy_cpu_s": busy_cpu_s}

    def averaged(before, after):
        """Chunk profiles taken before and after a run, their costs averaged."""
        return [dict(a, **{k: (a[k] + b[k]) / 2 for k in COST_FIELDS}) for a, b in zip(before, after)]

    out["chunks_at"] = {}
    for schedule, v in SCHEDULES:
        if schedule not in args.schedules:
            continue
        if schedule == "chimera" and (W % 2 or args.micro_batches % 2):
            continue
        # the chunks timed again just before and after the run, on this shared machine whose speed
        # drifts from minute to minute (by up to a fifth): the model's input from the same minute
        before = chunks_profiled(splits[v])
        out["runs"][schedule] = run(schedule, v)
        after = chunks_profiled(splits[v])
        out["chunks_at"][schedule] = averaged(before, after)
        # the same schedule, layers and split with next to no arithmetic: the runtime's own cost
        out["null_runs"][schedule] = run(schedule, v, hollow=True)

    # data-parallel baseline: the whole dense model here, on this rank's B samples (timed just
    # before and after, as the schedules' chunks are)
    before = whole_profiled()
    model = _model(args, torch.nn.Identity())
    whole = LayerStack(layers_of(model))
    params = list(whole.parameters())
    opt = dense_optimizer(OptimConfig(type="adagrad", lr=0.01), params)
    dp_s, dp_sync = [], []
    pooled_in = torch.randn(args.batch, F * D)
    for step in range(args.warmup + args.steps):
        dense, _, y = batches[step % len(batches)]
        dist.barrier()
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        (logits,) = whole(dense, pooled_in.requires_grad_())
        torch.nn.functional.binary_cross_entropy_with_logits(logits, y).backward()
        t1 = time.perf_counter()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=pg.dense)
        t2 = time.perf_counter()
        opt.step()
        if step >= args.warmup:
            dp_s.append(t2 - t0)
            dp_sync.append(t2 - t1)
    after = whole_profiled()
    out["whole"] = averaged(before, after)
    out["runs"]["data_parallel"] = {"pipeline_s": [a - b for a, b in zip(dp_s, dp_sync)], "sync_s": dp_sync,
                                    "busy_s": dp_s, "full_s": dp_s}
    if rank == 0:
        out["machine"] = machine_info(args.isa)
    return out


def _records(W: int, out: List[Dict[str, Any]], args, bandwidth: float) -> List[Dict[str, Any]]:
    from neo.machine import usable_cores

    rows = out[0]["profile"]
    cores, threads = usable_cores(), args.threads
    records = []
    for schedule, run in out[0]["runs"].items():
        steps = len(run["pipeline_s"])
        # per step: the slowest rank's pipelined part + sync; the ranks' summed busy time
        wall = [max(o["runs"][schedule]["pipeline_s"][i] + o["runs"][schedule]["sync_s"][i] for o in out)
                for i in range(steps)]
        pipe = [max(o["runs"][schedule]["pipeline_s"][i] for o in out) for i in range(steps)]
        sync = [max(o["runs"][schedule]["sync_s"][i] for o in out) for i in range(steps)]
        busy = [sum(o["runs"][schedule]["busy_s"][i] for o in out) for i in range(steps)]
        full = [max(o["runs"][schedule]["full_s"][i] for o in out) for i in range(steps)]
        if schedule == "data_parallel":
            from neo.pipeline.perf_model import predict

            whole = out[0]["whole"][0]
            bw = allreduce_gbps(out[0]["allreduce"]["world"])
            pred = predict("data_parallel", [whole["fwd_ms"]], [whole["bwd_ms"]], 1, replicas=W,
                           stage_param_bytes=[sum(r["param_bytes"] for r in rows)], bandwidth_gbps=bw, cores=cores,
                           threads_per_rank=threads)
            bubble, op_ms, null_ms, formula = 0.0, 0.0, None, pred
            v, split = 1, None
        else:
            v, split = run["virtual_stages"], run["split"]
            bw = allreduce_gbps(out[0]["allreduce"]["pairs"]) if schedule == "chimera" else bandwidth
            null_ms = 1e3 * _median([max(o["null_runs"][schedule]["pipeline_s"][i] for o in out)
                                     for i in range(len(out[0]["null_runs"][schedule]["pipeline_s"]))])
            null_cpu = 1e3 * _median([sum(o["null_runs"][schedule]["cpu_s"][i] for o in out)
                                      for i in range(len(out[0]["null_runs"][schedule]["cpu_s"]))])
            if W * threads > cores:     # shared cores: the runtime's cost is CPU the ranks compete for
                op_ms = runtime_cpu_ms(out[0]["null_chunks"][str(v)], schedule, v, W, args.micro_batches, null_cpu)
            else:                       # a core each: the wall time it adds to the null model's step
                op_ms = fit_op_ms(out[0]["null_chunks"][str(v)], out[0]["null_profile"], schedule, v, split, W,
                                  args.micro_batches, bw, out[0]["one_way_ms"], null_ms, cores, threads)
            chunks = out[0]["chunks_at"][schedule]
            pred, formula = (predict_pipeline(chunks, rows, schedule, v, split, W, args.micro_batches, bw,
                                      out[0]["one_way_ms"], op_ms, cores, threads, replayed)
                             for replayed in (True, False))
            bubble = _median([1 - b / (W * p) for b, p in zip(busy, pipe)])
        measured = 1e3 * _median(wall)
        records.append({
            "schedule": schedule, "world_size": W, "stages": W if schedule != "data_parallel" else 1,
            "virtual_stages": v, "micro_batches": args.micro_batches, "batch_per_rank": args.batch,
            "split": split, "predicted_ms": round(pred.step_ms, 3), "measured_ms": round(measured, 3),
            "ratio": round(pred.step_ms / measured, 3) if measured > 0 else None,
            "predicted_bubble_fraction": round(pred.bubble_fraction, 4), "bubble_fraction": round(bubble, 4),
            "measured_pipeline_ms": round(1e3 * _median(pipe), 3), "measured_sync_ms": round(1e3 * _median(sync), 3),
            "predicted_pipeline_ms": round(pred.pipeline_ms, 3), "predicted_sync_ms": round(pred.sync_ms, 3),
            "formula_ms": round(formula.step_ms, 3),
            "full_step_ms": round(1e3 * _median(full), 3), "op_ms": round(op_ms, 4),
            "cpu_ms": None if schedule == "data_parallel" else
            round(1e3 * _median([sum(o["runs"][schedule]["cpu_s"][i] for o in out) for i in range(steps)]), 3),
            "busy_cpu_ms": None if schedule == "data_parallel" else
            round(1e3 * _median([sum(o["runs"][schedule]["busy_cpu_s"][i] for o in out) for i in range(steps)]), 3),
            "null_cpu_ms": None if schedule == "data_parallel" else
            round(1e3 * _median([sum(o["null_runs"][schedule]["cpu_s"][i] for o in out) for i in range(steps)]), 3),
            "chunk_ms": None if schedule == "data_parallel" else
            round(compute_ms(out[0]["chunks_at"][schedule], schedule, v, W, args.micro_batches)[0], 3),
            "null_busy_cpu_ms": None if schedule == "data_parallel" else
            round(1e3 * _median([sum(o["null_runs"][schedule]["busy_cpu_s"][i] for o in out)
                                 for i in range(steps)]), 3),
            "null_chunk_ms": None if schedule == "data_parallel" else
            round(compute_ms(out[0]["null_chunks"][str(v)], schedule, v, W, args.micro_batches)[0], 3),
            "null_pipeline_ms": None if null_ms is None else round(null_ms, 3), "cores": cores,
            "bandwidth_gbps": round(bandwidth, 3),
            "allreduce_gbps": round(bw, 3) if schedule in ("chimera", "data_parallel") else None,
            "one_way_ms": out[0]["one_way_ms"], "steps": steps})
    return records


def _print(records) -> None:
    print(f"{'schedule':18s} {'W':>2s} {'M':>3s} {'pred ms':>9s} {'meas ms':>9s} {'pred/meas':>9s} "
          f"{'pred bubble':>11s} {'meas bubble':>11s} {'full step ms':>12s} {'formula ms':>10s}")
    for r in records:
        print(f"{r['schedule']:18s} {r['world_size']:2d} {r['micro_batches']:3d} {r['predicted_ms']:9.2f} "
              f"{r['measured_ms']:9.2f} {r['ratio']:9.2f} {r['predicted_bubble_fraction']:11.3f} "
              f"{r['bubble_fraction']:11.3f} {r['full_step_ms']:12.2f} {r['formula_ms']:10.2f}")


def _plot(records, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world_size"] for r in records})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 3.8), squeeze=False)
    for ax, W in zip(axes[0], worlds):
        rs = [r for r in records if r["world_size"] == W]
        x = range(len(rs))
        ax.bar([i - 0.2 for i in x], [r["predicted_ms"] for r in rs], 0.4, label="predicted")
        ax.bar([i + 0.2 for i in x], [r["measured_ms"] for r in rs], 0.4, label="measured")
        for i, r in enumerate(rs):
            if r["schedule"] != "data_parallel":
                ax.text(i, max(r["predicted_ms"], r["measured_ms"]), f"bubble\n{r['predicted_bubble_fraction']:.2f} / "
                        f"{r['bubble_fraction']:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, 1.25 * max(max(r["predicted_ms"], r["measured_ms"]) for r in rs))
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["schedule"] for r in rs], rotation=25, fontsize=8)
        ax.set_ylabel("step ms (pipelined part + gradient sync)")
        ax.set_title(f"{W} ranks, {rs[0]['micro_batches']} micro-batches")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


# --batch/--top-layers/--width/--warmup/--steps/--repeats default to None: filled in after parsing
# from DEFAULTS, or with --quick from QUICK, but only where the flag was not given (--quick never
# overrides an explicit flag).
DEFAULTS = {"batch": 256, "top_layers": 12, "width": 512, "warmup": 3, "steps": 20, "repeats": 10}
QUICK = {"batch": 128, "top_layers": 8, "width": 256, "warmup": 3, "steps": 12, "repeats": 5}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with --quick's or the default workload filled in for the flags not given."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", nargs="+", type=positive_int, default=[2, 4])
    p.add_argument("--batch", type=positive_int, default=None, help=f"samples per rank (default {DEFAULTS['batch']})")
    p.add_argument("--micro-batches", type=positive_int, default=8, help="per step and pipeline (a multiple of every world size)")
    names = [s for s, _ in SCHEDULES]
    p.add_argument("--schedules", nargs="+", default=names, choices=names,
                   help="the pipeline schedules to run (the data-parallel baseline always runs)")
    p.add_argument("--top-layers", type=positive_int, default=None, help=f"default {DEFAULTS['top_layers']}")
    p.add_argument("--width", type=positive_int, default=None, help=f"default {DEFAULTS['width']}")
    p.add_argument("--warmup", type=nonneg_int, default=None, help=f"default {DEFAULTS['warmup']}")
    p.add_argument("--steps", type=positive_int, default=None, help=f"default {DEFAULTS['steps']}")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help=f"profile repeats per layer (default {DEFAULTS['repeats']})")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--bandwidth-gbps", type=float, default=None, help="default: measured (gloo send/recv)")
    p.add_argument("--quick", action="store_true",
                   help="a smaller model, fewer steps: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                        + ", for the flags not given")
    p.add_argument("--json", default=None, type=json_path)
    p.add_argument("--plot", default=None, help="PNG of predicted and measured step time per schedule")
    add_isa_arg(p)
    args = p.parse_args(argv)
    apply_quick(args, DEFAULTS, QUICK)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_isa(args.isa)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from neo.pipeline.profile import measure_p2p_bandwidth
    from tests.multiprocess import run_multiprocess

    t0 = time.time()
    if args.bandwidth_gbps is None:
        args.bandwidth_gbps = measure_p2p_bandwidth()
    records: List[Dict[str, Any]] = []
    machine = None
    for W in args.worlds:
        out = run_multiprocess(_rank_main, W, args, timeout_s=3600, collective_timeout_s=600, threads=args.threads,
                               env={"OMP_NUM_THREADS": str(args.threads)})
        machine = out[0]["machine"]
        records += _records(W, out, args, args.bandwidth_gbps)
    for r in records:
        r["machine"] = machine
    print(describe_machine(machine))
    _print(records)
    print(f"({time.time() - t0:.0f} s; bandwidth {args.bandwidth_gbps:.2f} GB/s; {args.threads} thread per rank; "
          f"load average {os.getloadavg()[0]:.1f})")
    if args.json:
        write_json(args.json, records)
    if args.plot:
        _plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
