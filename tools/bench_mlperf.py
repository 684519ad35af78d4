"""MLPerf DLRM-DCNv2, scaled: time to target AUC and samples/s of ``neo mlperf`` against TorchRec.

    python tools/bench_mlperf.py --quick                                   # one timed run each, < 1 minute
    python tools/bench_mlperf.py --json bench_out/mlperf.json --plot bench_out/mlperf_auc.png
    python tools/bench_mlperf.py --config configs/mlperf_dcnv2_tiny.yaml --batch 512 mlperf.target_auc=0.75

Both systems train the config's model (DCNv2: bottom MLP, low-rank cross layers, top MLP) on the
same data at ``--world-size`` gloo ranks (2), one torch thread each, from the same initial
parameters (TorchRec's model is loaded with those of Neo's run; ``--own-init``: TorchRec's own
initialisation), with the same batches in the same order (Neo's loader, seeded alike, its first window read
while the model is built in both: ``warm_up()``, as Neo's trainer calls it), the same
optimizers (Adagrad on everything at the config's lr and eps; embeddings: fused in the backward,
FBGEMM EXACT_ADAGRAD for TorchRec) and the same evaluation: every ``mlperf.eval_every_epochs``
over the whole validation set, exact AUROC of every rank's predictions gathered
(:class:`neo.train.metrics.BinaryMetrics`), stopping at ``mlperf.target_auc`` or ``mlperf.max_epochs``.

* Neo: :func:`neo.mlperf.harness.run_benchmark`, i.e. ``neo mlperf`` (its trainer, pipeline and
  planner; time to target = run_start .. run_stop of its MLPerf log).
* TorchRec: the loop of torchrec_dlrm's reference (``DLRM_DCN`` in ``DistributedModelParallel``,
  the planner restricted to table_wise, as TorchRec has no CPU row-wise kernels for fused training;
  dense parameters by ``torch.optim.Adagrad`` through ``KeyedOptimizerWrapper``), a plain loop
  (``TrainPipelineSparseDist`` needs CUDA streams); time to target from a barrier to the
  evaluation that reaches it.

samples/s counts training only (global samples / seconds outside evaluations); time to target
includes the evaluations. After ``--warmup`` untimed runs of each system, ``--repeats`` runs
alternate which system goes first (load from other jobs on a shared machine hits both alike);
the medians are reported. ``--no-shm``: Neo's embedding AlltoAlls through gloo like TorchRec's
(by default through shared memory, as ``neo mlperf`` does).

Output: a table, the ratios (Neo / TorchRec samples/s, TorchRec / Neo time to target; the
samples/s ratio of each repeat too, whose two runs are back to back) and the AUC gaps (final,
and at the last evaluation both ran); with ``--json`` records with ``system``, ``samples_per_s``,
``time_to_target_s`` (null when the target was not reached), ``final_auc``, ``status``, ``curve``
(samples, auc, seconds of every evaluation) and ``machine`` (CPU model, ISA, load;
tools/bench_common.py), and a ``summary`` with the ratios (``samples_per_s_ratio``,
``samples_per_s_ratio_pairs``, ``time_to_target_ratio``), the runs of each system that reached the
target (``runs_reached_target``) and the AUC gaps; ``--plot`` draws AUC against samples for both.
The time-to-target ratio is of the medians over the repeats in which both systems reached the
target (``time_to_target_repeats``), not over each system's own successful runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench_common import apply_quick, json_path, nonneg_int, positive_int  # noqa: E402
from bench_common import (add_isa_arg, add_no_shm_arg, add_system_malloc_arg, apply_isa, describe_machine,  # noqa: E402
                          machine_info, start_rank, torchrec_local_blocks, write_json)

DEFAULT_CONFIG = str(ROOT / "configs" / "mlperf_dcnv2_tiny.yaml")


def _config(args):
    from neo.config import load_config

    overrides = [f"train.batch_size={args.batch}", f"train.threads={args.threads}", "train.progress=false",
                 f"train.shm_collectives={str(not args.no_shm).lower()}",
                 f"data.synthetic.cache_dir={args.cache_dir}"] + list(args.overrides)
    return load_config(args.config, overrides)


def _neo(cfg, pg, results_dir: str) -> Dict[str, Any]:
    from neo.mlperf.harness import run_benchmark

    summary = run_benchmark(cfg, results_dir, seeds=1, pg=pg, say=lambda *a, **k: None, print_summary=False)
    r = summary["runs"][0]
    return {"system": "neo", "status": r["status"], "samples_per_s": r["samples_per_s"],
            "time_to_target_s": r["time_to_train_s"] if r["status"] == "success" else None,
            "seconds": r["time_to_train_s"], "final_auc": r["final_auc"], "epoch_num": r["epoch_num"],
            "curve": [{"samples": p["samples"], "auc": p["auc"], "seconds": p["seconds"]} for p in r["curve"]]}


def _torchrec_model(cfg, tables, keys, num_dense: int, group):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM_DCN
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    opts = {(t.optimizer.type.value, t.optimizer.lr, t.optimizer.eps) for t in tables}
    if len(opts) != 1 or next(iter(opts))[0] != "adagrad":
        raise SystemExit(f"bench_mlperf: the tables' optimizers must be one Adagrad (TorchRec side), got {opts}")
    (_, lr, eps), = opts
    W, m, o = dist.get_world_size(group), cfg.model, cfg.optim
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                                                            feature_names=[k]) for t, k in zip(tables, keys)],
                                 device=torch.device("meta"))
    torch.manual_seed(cfg.train.seed)
    model = DLRM_DCN(ebc, num_dense, [int(x) for x in m.dense_arch], [int(x) for x in m.over_arch],
                     int(m.dcn_layers), int(m.dcn_rank), dense_device=torch.device("cpu"))
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD,
                                                          "learning_rate": lr, "eps": eps})
    constraints = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=W, compute_device="cpu", local_world_size=W),
                                       constraints=constraints)
    plan = planner.collective_plan(model, [sharder], group)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(group), plan=plan, sharders=[sharder],
                                   device=torch.device("cpu"))
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=o.lr, eps=o.eps))
    return dmp, dense_opt


def _neo_initial_weights(cfg, pg) -> Dict[str, torch.Tensor]:
    """The parameters Neo's run starts from (its Trainer seeds them by ``train.seed``), under
    TorchRec DLRM_DCN's names. Collective (the tables are gathered)."""
    from neo.train.trainer import Trainer

    tr = Trainer(cfg, pg=pg, log=lambda *a, **k: None)
    m = tr.model
    linear = lambda seq: [x for x in seq if isinstance(x, torch.nn.Linear)]  # noqa: E731
    out: Dict[str, torch.Tensor] = {}
    for i, lin in enumerate(linear(m.bottom)):
        out[f"dense_arch.model._mlp.{i}._linear.weight"], out[f"dense_arch.model._mlp.{i}._linear.bias"] = \
            lin.weight, lin.bias
    for i, (down, up) in enumerate(zip(m.interaction.down, m.interaction.up)):   # x0 * (U (V x) + b) + x
        out[f"inter_arch.crossnet.V_kernels.{i}"] = down.weight                   # (r, N)
        out[f"inter_arch.crossnet.W_kernels.{i}"] = up.weight                     # (N, r)
        out[f"inter_arch.crossnet.bias.{i}"] = up.bias
    top = linear(m.top)
    for i, lin in enumerate(top[:-1]):
        out[f"over_arch.model.0._mlp.{i}._linear.weight"], out[f"over_arch.model.0._mlp.{i}._linear.bias"] = \
            lin.weight, lin.bias
    out["over_arch.model.1.weight"], out["over_arch.model.1.bias"] = top[-1].weight, top[-1].bias
    for name, w in tr.sharded.full_weights().items():
        out[f"sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"] = w
    out = {k: v.detach().clone() for k, v in out.items()}
    tr.heartbeat.close()              # the trainer never fits (fit closes it): no beat left in later runs
    del tr
    return out


@torch.no_grad()
def _load_into(dmp, weights: Dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` into the sharded model in place (dense parameters; each rank's table shards)."""
    state = dmp.state_dict()
    missing = sorted(set(weights) - set(state))
    if missing:
        raise SystemExit(f"bench_mlperf: TorchRec's DLRM_DCN has no parameters {missing}")
    for name, w in weights.items():
        for r, c, blk in torchrec_local_blocks(state[name]):
            blk.copy_(w if blk.shape == w.shape else w[r:r + blk.shape[0], c:c + blk.shape[1]])


def _torchrec(cfg, pg, group, same_init: bool) -> Dict[str, Any]:
    """torchrec_dlrm's loop on Neo's loaders, with ``neo mlperf``'s cadence and stop rule."""
    import torch.nn.functional as F

    from neo.mlperf.hook import Cadence
    from neo.train.build import resolve_tables
    from neo.train.data import make_loaders, prepare_data
    from neo.train.metrics import BinaryMetrics

    quiet = lambda *a, **k: None  # noqa: E731
    tables = resolve_tables(cfg)
    data = prepare_data(cfg, tables, pg, log=quiet)
    train, val = make_loaders(cfg, data, pg)
    train.warm_up()                   # as Neo's Trainer: the first window is read while the model is built
    W, B = pg.world_size, cfg.train.batch_size
    if val.shard_size % B or val.num_samples % W:
        raise SystemExit(f"bench_mlperf: the validation set ({val.num_samples}) must split into full batches of "
                         f"{B} on {W} ranks (TorchRec's table-wise AlltoAll needs equal batches)")
    steps_per_epoch = (train.num_samples // W) // B
    mp = cfg.mlperf
    cad = Cadence.of(mp.eval_every_epochs, mp.max_epochs, steps_per_epoch, B * W, train.num_samples)
    initial = _neo_initial_weights(cfg, pg) if same_init else None
    dmp, dense_opt = _torchrec_model(cfg, tables, train.meta.sparse_names, data.num_dense, group)
    if initial is not None:
        _load_into(dmp, initial)

    def forward(b) -> torch.Tensor:
        """DLRM_DCN's logits (B,); under ``train.dense_dtype: bf16`` in bf16 autocast, as Neo's dense
        part (the embedding lookups have no autocast kernels: they stay fp32 in both)."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.dense_dtype == "bf16"):
            return dmp(b.dense, b.sparse.to_torchrec()).squeeze(-1).float()

    @torch.no_grad()
    def evaluate() -> float:
        metrics = BinaryMetrics()
        dmp.eval()
        val.set_epoch(0)
        for b in val:
            metrics.update(forward(b), b.labels)
        dmp.train()
        return metrics.compute(pg.world)["auc"]

    def batches():
        epoch = 0
        while True:
            train.set_epoch(epoch)
            it = iter(train)
            for _ in range(steps_per_epoch):
                yield next(it)
            it.close()
            epoch += 1

    source, curve, status, step, train_s = batches(), [], "aborted", 0, 0.0
    dist.barrier(group=pg.world)
    t_start = seg = time.perf_counter()
    while step < cad.max_steps:
        b = next(source)
        logits = forward(b)
        loss = F.binary_cross_entropy_with_logits(logits, b.labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        step += 1
        if step % cad.eval_every_steps == 0 or step >= cad.max_steps:
            train_s += time.perf_counter() - seg
            auc = evaluate()
            curve.append({"samples": step * B * W, "auc": auc, "seconds": round(time.perf_counter() - t_start, 3)})
            if auc >= mp.target_auc:
                status = "success"
                break
            seg = time.perf_counter()
    seconds = curve[-1]["seconds"]
    return {"system": "torchrec", "status": status, "samples_per_s": round(step * B * W / max(train_s, 1e-9), 1),
            "time_to_target_s": seconds if status == "success" else None, "seconds": seconds,
            "final_auc": curve[-1]["auc"], "epoch_num": cad.epoch_num(step), "curve": curve}


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    from neo.train.build import init_process_groups

    start_rank(args.threads, args.system_malloc)
    machine = machine_info(args.isa)
    cfg = _config(args)
    pg = init_process_groups(cfg.train)
    trec_group = dist.new_group(list(range(world_size)), timeout=datetime.timedelta(seconds=600))
    records = []
    systems = ["neo"] if args.no_torchrec else ["neo", "torchrec"]
    with tempfile.TemporaryDirectory(prefix="bench_mlperf_") as tmp:
        for rep in range(-args.warmup, args.repeats):           # rep < 0: warm-up runs, not recorded
            for system in (systems if rep % 2 == 0 else systems[::-1]):
                rec = _neo(cfg, pg, os.path.join(tmp, f"neo_{rep}")) if system == "neo" else \
                    _torchrec(cfg, pg, trec_group, not args.own_init)
                if rep < 0:
                    continue
                rec.update(repeat=rep, world_size=world_size, global_batch=cfg.train.batch_size * world_size,
                           target_auc=cfg.mlperf.target_auc, config=os.path.relpath(args.config, ROOT),
                           threads=args.threads, dense_dtype=cfg.train.dense_dtype,
                           neo_shm_collectives=not args.no_shm, same_init=not args.own_init,
                           retain_freed_memory=not args.system_malloc, machine=machine)
                records.append(rec)
    return records


def _median(records, system: str, key: str):
    vals = [r[key] for r in records if r["system"] == system and r[key] is not None]
    return statistics.median(vals) if vals else None


def _paired_ratios(records) -> List[float]:
    """Neo / TorchRec samples/s of each repeat: its two runs ran back to back, so the ratio
    sees the machine at one speed (a shared machine's speed drifts over a bench's minutes)."""
    by_rep: Dict[int, Dict[str, float]] = {}
    for r in records:
        by_rep.setdefault(r["repeat"], {})[r["system"]] = r["samples_per_s"]
    return [round(p["neo"] / p["torchrec"], 3) for _, p in sorted(by_rep.items())
            if p.get("neo") and p.get("torchrec")]


def _time_to_target(records) -> Dict[str, Any]:
    """Per system how many runs reached the target, and the time-to-target ratio (TorchRec / Neo,
    of the medians) over the repeats in which both did: medians over different sets of runs would
    compare a system's lucky runs with the other's every run."""
    reached: Dict[str, Dict[int, float]] = {}
    for r in records:
        runs = reached.setdefault(r["system"], {})
        if r["time_to_target_s"] is not None:
            runs[r["repeat"]] = r["time_to_target_s"]
    out: Dict[str, Any] = {"runs_reached_target": {s: len(runs) for s, runs in reached.items()},
                           "runs": {s: sum(r["system"] == s for r in records) for s in reached}}
    both = sorted(set(reached.get("neo", {})) & set(reached.get("torchrec", {})))
    if both:
        neo_t = statistics.median(reached["neo"][k] for k in both)
        trec_t = statistics.median(reached["torchrec"][k] for k in both)
        out.update(time_to_target_ratio=round(trec_t / neo_t, 3), time_to_target_repeats=both,
                   time_to_target_median_s={"neo": neo_t, "torchrec": trec_t},
                   time_to_target_ratio_over="the repeats in which both systems reached the target "
                                             "(time_to_target_repeats): medians of those runs only")
    return out


def _print(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    print(f"{'system':9s} {'rep':>3s} {'status':>8s} {'samples/s':>10s} {'time to target s':>17s} {'final auc':>10s} "
          f"{'epochs':>7s} {'evals':>6s}")
    for r in records:
        ttt = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        print(f"{r['system']:9s} {r['repeat']:3d} {r['status']:>8s} {r['samples_per_s']:10.0f} {ttt:>17s} "
              f"{r['final_auc']:10.5f} {r['epoch_num']:7.4f} {len(r['curve']):6d}")
    out: Dict[str, Any] = {}
    neo_sps, trec_sps = _median(records, "neo", "samples_per_s"), _median(records, "torchrec", "samples_per_s")
    if neo_sps and trec_sps:
        out["samples_per_s_ratio"] = round(neo_sps / trec_sps, 3)
        print(f"samples/s (median): Neo {neo_sps:.0f}, TorchRec {trec_sps:.0f}: Neo {out['samples_per_s_ratio']:.2f}x "
              f"(goal >= 2x)")
        pairs = _paired_ratios(records)
        if pairs:
            out["samples_per_s_ratio_pairs"] = pairs
            print(f"  per repeat (the two runs of a repeat back to back): {' '.join(f'{x:.2f}x' for x in pairs)}; "
                  f"median {statistics.median(pairs):.2f}x, {sum(x >= 2.0 for x in pairs)} of {len(pairs)} >= 2x")
    ttt = _time_to_target(records)
    out.update(ttt)
    print("runs that reached the target: " + ", ".join(f"{s} {n} of {ttt['runs'][s]}"
                                                      for s, n in ttt["runs_reached_target"].items()))
    if "time_to_target_ratio" in ttt:
        medians = ttt["time_to_target_median_s"]
        print(f"time to target (median of the {len(ttt['time_to_target_repeats'])} repeats both reached it): "
              f"Neo {medians['neo']:.2f} s, TorchRec {medians['torchrec']:.2f} s: "
              f"Neo {ttt['time_to_target_ratio']:.2f}x faster")
    final_gaps, common_gaps = [], []
    for rep in sorted({r["repeat"] for r in records}):
        pair = {r["system"]: r for r in records if r["repeat"] == rep}
        if len(pair) == 2:
            a, b = ({p["samples"]: p["auc"] for p in pair[s]["curve"]} for s in ("neo", "torchrec"))
            common = sorted(set(a) & set(b))
            if common:
                common_gaps.append(a[common[-1]] - b[common[-1]])
            final_gaps.append(pair["neo"]["final_auc"] - pair["torchrec"]["final_auc"])
    if final_gaps:
        out["final_auc_gap"] = round(max(final_gaps, key=abs), 5)
        out["auc_gap_at_last_common_eval"] = round(max(common_gaps, key=abs), 5) if common_gaps else None
        print(f"AUC, Neo - TorchRec (largest of the repeats; goal |gap| <= 0.002): final {out['final_auc_gap']:+.4f}; "
              f"at the last evaluation both ran (same samples) {out['auc_gap_at_last_common_eval']:+.4f}")
    return out


def _plot(records: List[Dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"neo": "tab:blue", "torchrec": "tab:orange"}
    for r in records:
        xs = [p["samples"] for p in r["curve"]]
        neo = r["system"] == "neo"                  # wide under narrow: equal curves stay visible
        ax.plot(xs, [p["auc"] for p in r["curve"]], marker="o", ms=6 if neo else 3, lw=4 if neo else 1.2,
                color=colors[r["system"]], alpha=(0.5 if neo else 1.0) * (1.0 if r["repeat"] == 0 else 0.5),
                label=r["system"] if r["repeat"] == 0 else None, zorder=1 if neo else 2)
    target = records[0]["target_auc"]
    ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target}")
    ax.set_xlabel("training samples")
    ax.set_ylabel("validation AUROC (exact, whole set)")
    m = records[0]["machine"]
    ax.set_title(f"MLPerf DLRM-DCNv2 (scaled): {records[0]['config']}, {records[0]['world_size']} ranks\n"
                 f"{m['cpu_model']}, load {m['load_average']}", fontsize=9)
    ax.legend()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


# --repeats defaults to None: filled in after parsing from DEFAULTS, or with --quick from QUICK, but
# only where the flag was not given (--quick never overrides an explicit flag).
DEFAULTS = {"repeats": 15}
QUICK = {"repeats": 1}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with --quick's or the default number of runs filled in where not given."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="dotted config overrides for both systems, e.g. mlperf.target_auc=0.75")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="Neo config with an mlperf section (default: the tiny one)")
    p.add_argument("--batch", type=positive_int, default=256, help="samples per rank (default 256: global 512 on 2 ranks, "
                                                          "the tiny config's global batch)")
    p.add_argument("--world-size", type=positive_int, default=2)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="runs per system (default 15), alternating which goes first (a tiny run is about a "
                        "second: its samples/s moves by 20%% from run to run on a shared machine)")
    p.add_argument("--warmup", type=nonneg_int, default=1, help="untimed runs per system first (imports, first-step "
                                                         "allocations, page cache)")
    p.add_argument("--cache-dir", default=str(ROOT / ".cache" / "neo-synthetic"), help="synthetic data cache")
    p.add_argument("--no-torchrec", action="store_true")
    p.add_argument("--own-init", action="store_true",
                   help="TorchRec initialises its own parameters (by default it starts from Neo's initial ones, "
                        "so that the AUC curves compare the training, not two random draws)")
    add_system_malloc_arg(p)
    add_no_shm_arg(p)
    add_isa_arg(p)
    p.add_argument("--quick", action="store_true",
                   help="one timed run per system (after the warm-up run), unless --repeats is given")
    p.add_argument("--json", default=None, type=json_path)
    p.add_argument("--plot", default=None, help="PNG of AUC against training samples, both systems")
    args = p.parse_args(argv)
    apply_quick(args, DEFAULTS, QUICK)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_isa(args.isa)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from tests.multiprocess import run_multiprocess

    t0 = time.time()
    records = run_multiprocess(_rank_main, args.world_size, args, timeout_s=3600, collective_timeout_s=600,
                               threads=args.threads, env={"OMP_NUM_THREADS": str(args.threads)})[0]
    print(describe_machine(records[0]["machine"]))
    summary = _print(records)
    print(f"({time.time() - t0:.0f} s; {args.world_size} processes x {args.threads} thread; "
          f"machine load average {os.getloadavg()[0]:.1f})")
    if args.json:
        write_json(args.json, {"records": records, "summary": summary})
    if args.plot:
        _plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
