"""Synchronous (BSP) against wave synchronous parallel (WSP, staleness 1 and 4) training on a
heterogeneous 4-rank setup, and synchronous 1F1B against the asynchronous pipeline schedules
(pipedream_async, pipedream_2bw) on 2 stages: throughput, final AUC and the staleness seen.

    python tools/bench_async.py --json bench_out/async.json --plot bench_out/async.png
    python tools/bench_async.py --quick                       # smoke run (fewer samples and steps)
    python tools/bench_async.py --quick --modes 1f1b pipedream_async pipedream_2bw   # pipeline modes only

Setup: the tiny DLRM of ``configs/train_tiny.yaml`` on its planted-teacher synthetic data
(``data.synthetic``: labels drawn from a hidden teacher, whose AUC ``best_auc`` is the ceiling),
4 gloo ranks on this host (one torch thread each), batch 128 per rank, every rank a virtual
worker, through :class:`neo.async_train.WSPTrainer`:

- ``bsp``: staleness 0, one step per wave: every step waits for every rank (the arithmetic of
  the synchronous trainer, bit for bit: tests/async_train/test_wsp.py), through the same engine
  as the WSP modes, so that only the synchronization policy differs;
- ``wsp1``, ``wsp4``: staleness 1 and 4, one step per wave.

Scenarios (``--scenarios``): ``one_slow``: rank 3 is a 3x slower device (each of its steps
stretched by a sleep of twice its compute); ``stragglers``: every rank is slowed 4x on a random
10% of its steps (transient stragglers, independent per rank).

Pipeline modes (``--modes 1f1b pipedream_async pipedream_2bw``, scenario ``pipeline``): the
``Trainer`` on a small variant of ``configs/pipeline_deep_mlp.yaml`` (the same planted-teacher
data; top MLP of 6 x 128, 2 ranks = 2 stages x 1 replica, 4 micro-batches per step, split auto),
every mode on the same samples (equal steps and batch); ``1f1b`` is the synchronous reference.
Their final AUCs are compared at convergence: ``--pipeline-steps`` (1024) steps over
``--pipeline-samples`` (524,288) samples, where 1F1B is within 0.004 of the teacher. Early in
training 2BW trails by more (0.02 AUC at 128 steps, 0.009 at 256: its dense update is one step
late by design, PipeDream-2BW's ``W(t+1) = W(t) - lr grad f(W(t-1))``; docs/benchmarks.md).
``staleness_bound``: ``max_versions - 1`` (pipedream_async, max_versions = stages by default) or 1
(2BW); ``max_staleness_observed``: the largest lag of a forward's weight version behind the
version sequential training would have used, from the stages' version counters
(``PipelinedDense.version_log``); ``mean_staleness`` its mean over micro-batches and stages.

Output: a table and, with ``--json``, records with ``mode`` (bsp, wsp1, wsp4, 1f1b,
pipedream_async, pipedream_2bw), ``scenario``, ``samples_per_s`` (all ranks' samples over the
wall time from the common start to the last rank's last update), ``auc`` (the final state, whole
validation set), ``best_auc`` (the teacher's), ``staleness_bound``, ``max_staleness_observed``
(the largest wave - version any worker computed on), ``mean_staleness``, ``train_seconds`` and
``machine`` (CPU model, ISA, load average: tools/bench_common.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import apply_quick, json_path, positive_int  # noqa: E402
from bench_common import add_isa_arg, apply_isa, describe_machine, machine_info, write_json  # noqa: E402

MODES = {"bsp": 0, "wsp1": 1, "wsp4": 4}
"""Mode -> staleness bound."""
PIPELINE_MODES = {"1f1b": 0, "pipedream_async": None, "pipedream_2bw": 1}
"""Pipeline schedule -> staleness bound (None: max_versions - 1, max_versions = stages)."""
PIPELINE_STAGES, PIPELINE_MICRO_BATCHES = 2, 4
SCENARIOS = {
    "one_slow": ["async_train.slowdown=[{rank: 3, factor: 3}]"],
    "stragglers": ["async_train.slowdown=[" + ", ".join(f"{{rank: {r}, factor: 4, probability: 0.1}}"
                                                         for r in range(4)) + "]"],
}


def _overrides(args, run_dir: str) -> List[str]:
    return [f"data.synthetic.num_samples={args.samples}", "data.synthetic.val_samples=4096",
            f"data.synthetic.cache_dir={args.cache_dir}", f"train.run_dir={run_dir}", "train.progress=false",
            f"train.batch_size={args.batch}", f"train.steps={args.steps}", "train.log_every=1000",
            "async_train.mode=wsp", f"async_train.wave_steps={args.wave_steps}", "train.threads=1"]


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    from neo.async_train import WSPTrainer
    from neo.config import load_config

    records = []
    for scenario in args.scenarios:
        for mode in args.modes:
            run_dir = os.path.join(args.out_dir, f"{scenario}-{mode}")
            cfg = load_config(str(ROOT / "configs" / "train_tiny.yaml"),
                              _overrides(args, run_dir) + SCENARIOS[scenario]
                              + [f"async_train.staleness={MODES[mode]}"])
            tr = WSPTrainer(cfg, log=lambda *a, **k: None)
            final = tr.fit()
            mean = sum(w["staleness"] for w in tr.waves_log) / max(len(tr.waves_log), 1)
            means = [None] * world_size
            import torch.distributed as dist

            dist.all_gather_object(means, mean)
            if rank == 0:
                records.append({
                    "mode": mode, "scenario": scenario, "samples_per_s": final["samples_per_s"],
                    "auc": final["auc"], "best_auc": final["best_auc"], "staleness_bound": MODES[mode],
                    "max_staleness_observed": final["max_staleness_observed"],
                    "mean_staleness": round(sum(means) / len(means), 3), "train_seconds": final["train_seconds"],
                    "steps": final["steps"], "wave_steps": final["wave_steps"], "world_size": world_size,
                    "batch_per_rank": args.batch, "slowdown": SCENARIOS[scenario][0].split("=", 1)[1],
                    "phase_ms_per_step_rank0": final["phase_ms_per_step"],
                })
            dist.barrier()
    return records


def _pipeline_overrides(args, run_dir: str, mode: str) -> List[str]:
    return [f"data.synthetic.num_samples={args.pipeline_samples}", "data.synthetic.val_samples=4096",
            f"data.synthetic.cache_dir={args.cache_dir}", f"train.run_dir={run_dir}", "train.progress=false",
            f"train.batch_size={args.batch}", f"train.steps={args.pipeline_steps}", "train.log_every=1000",
            "train.threads=1", "model.over_arch=[128,128,128,128,128,128,1]",
            f"parallel.pipeline.stages={PIPELINE_STAGES}", f"parallel.pipeline.micro_batches={PIPELINE_MICRO_BATCHES}",
            f"parallel.pipeline.schedule={mode}"]


def _pipeline_rank_main(rank: int, world_size: int, args, modes: List[str]) -> List[Dict[str, Any]]:
    """The Trainer on 2 pipeline stages, once per schedule; rank 0 returns the records."""
    import torch.distributed as dist

    from neo.config import load_config
    from neo.train.trainer import Trainer

    records = []
    for mode in modes:
        run_dir = os.path.join(args.out_dir, f"pipeline-{mode}")
        cfg = load_config(str(ROOT / "configs" / "pipeline_deep_mlp.yaml"), _pipeline_overrides(args, run_dir, mode))
        tr = Trainer(cfg, log=lambda *a, **k: None)
        final = tr.fit()
        log = tr.pipeline.version_log
        stats = [max((r["staleness"] for r in log), default=0), sum(r["staleness"] for r in log), len(log)]
        every: List[Any] = [None] * world_size
        dist.all_gather_object(every, stats)
        bound = PIPELINE_MODES[mode]
        if bound is None:
            mv = cfg.parallel.pipeline.max_versions
            bound = min(mv if mv is not None else PIPELINE_STAGES, PIPELINE_STAGES) - 1
        if rank == 0:
            records.append({
                "mode": mode, "scenario": "pipeline", "samples_per_s": final["samples_per_s"],
                "auc": final["auc"], "best_auc": final["best_auc"], "staleness_bound": bound,
                "max_staleness_observed": max(s[0] for s in every),
                "mean_staleness": round(sum(s[1] for s in every) / max(sum(s[2] for s in every), 1), 3),
                "train_seconds": final["train_seconds"], "steps": final["steps"], "world_size": world_size,
                "batch_per_rank": args.batch, "train_samples": args.pipeline_samples, "stages": PIPELINE_STAGES,
                "micro_batches": PIPELINE_MICRO_BATCHES,
                "phase_ms_per_step_rank0": final.get("phase_ms_per_step"),
            })
        dist.barrier()
    return records


def _print(records: List[Dict[str, Any]]) -> None:
    print(f"{'scenario':<11} {'mode':<15} {'samples/s':>10} {'AUC':>7} {'best':>7} {'bound':>5} {'max st.':>7} "
          f"{'mean st.':>8} {'seconds':>8}")
    for r in records:
        print(f"{r['scenario']:<11} {r['mode']:<15} {r['samples_per_s']:>10.0f} {r['auc']:>7.4f} {r['best_auc']:>7.4f} "
              f"{r['staleness_bound']:>5} {r['max_staleness_observed']:>7} {r['mean_staleness']:>8.2f} "
              f"{r['train_seconds']:>8.2f}")


def plot(records: List[Dict[str, Any]], path: str) -> None:
    """Samples/s per mode, one group of bars per scenario, each bar labelled with its AUC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in records))
    modes = list(dict.fromkeys(r["mode"] for r in records))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(modes), 1)
    for k, mode in enumerate(modes):
        xs, ys, aucs = [], [], []
        for i, s in enumerate(scenarios):
            r = next((r for r in records if r["scenario"] == s and r["mode"] == mode), None)
            if r is not None:
                xs.append(i + k * width)
                ys.append(r["samples_per_s"])
                aucs.append(r["auc"])
        bars = ax.bar(xs, ys, width, label=mode)
        for b, auc in zip(bars, aucs):
            ax.annotate(f"AUC {auc:.3f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(scenarios))], scenarios)
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title("BSP vs WSP (4 ranks); 1F1B vs asynchronous pipelines (2 stages)")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


# --samples/--steps/--pipeline-samples/--pipeline-steps default to None: filled in after parsing
# from DEFAULTS, or with --quick from QUICK, but only where the flag was not given (--quick never
# overrides an explicit flag).
DEFAULTS = {"samples": 65536, "steps": 128, "pipeline_samples": 524288, "pipeline_steps": 1024}
QUICK = {"samples": 16384, "steps": 48, "pipeline_samples": 16384, "pipeline_steps": 48}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with --quick's or the default workload filled in for the flags not given."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=list(MODES) + list(PIPELINE_MODES),
                   choices=list(MODES) + list(PIPELINE_MODES))
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--samples", type=positive_int, default=None,
                   help=f"synthetic training samples (WSP scenarios; default {DEFAULTS['samples']})")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"local steps per rank (WSP scenarios; default {DEFAULTS['steps']})")
    p.add_argument("--pipeline-samples", type=positive_int, default=None,
                   help=f"synthetic training samples of the pipeline modes (default {DEFAULTS['pipeline_samples']}: "
                        "enough that no sample is seen more than twice in --pipeline-steps)")
    p.add_argument("--pipeline-steps", type=positive_int, default=None,
                   help=f"steps of the pipeline modes (default {DEFAULTS['pipeline_steps']}: to convergence, "
                        "the final AUCs compared)")
    p.add_argument("--batch", type=positive_int, default=128, help="samples per rank per step")
    p.add_argument("--wave-steps", type=positive_int, default=1)
    p.add_argument("--cache-dir", default=str(ROOT / ".cache" / "neo-synthetic"))
    p.add_argument("--out-dir", default=str(ROOT / "bench_out" / "async_runs"))
    p.add_argument("--quick", action="store_true",
                   help="16k samples, 48 steps (every scenario and mode), for the flags not given")
    p.add_argument("--json", default=None, type=json_path)
    p.add_argument("--plot", default=None, help="PNG: samples/s per mode and scenario, AUC on each bar")
    add_isa_arg(p)
    args = p.parse_args(argv)
    apply_quick(args, DEFAULTS, QUICK)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_isa(args.isa)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from tests.multiprocess import run_multiprocess

    t0 = time.time()
    wsp_modes = [m for m in args.modes if m in MODES]
    pipe_modes = [m for m in args.modes if m in PIPELINE_MODES]
    records: List[Dict[str, Any]] = []
    if wsp_modes:
        args.modes = wsp_modes
        records += run_multiprocess(_rank_main, 4, args, timeout_s=3600, collective_timeout_s=600, threads=1,
                                    env={"OMP_NUM_THREADS": "1"})[0]
    if pipe_modes:
        records += run_multiprocess(_pipeline_rank_main, PIPELINE_STAGES, args, pipe_modes, timeout_s=3600,
                                    collective_timeout_s=600, threads=1, env={"OMP_NUM_THREADS": "1"})[0]
    machine = machine_info(args.isa)
    for r in records:
        r["machine"] = machine
    print(describe_machine(machine))
    _print(records)
    print(f"({time.time() - t0:.0f} s; 4 (WSP) or 2 (pipeline) processes x 1 thread; load average {os.getloadavg()[0]:.1f})")
    if args.json:
        write_json(args.json, records)
    if args.plot:
        plot(records, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
