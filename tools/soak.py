"""Soak test: train the main job for many steps with checkpoints; watch memory and step time.

    python tools/soak.py --json bench_out/soak.json      # 20,000 steps, W = 2, checkpoint every 1,000
    python tools/soak.py --quick                         # smoke run: 600 steps, checkpoint every 100
    python tools/soak.py --config configs/train_tiny.yaml --steps 40 --checkpoint-every 10 --sample-every 5

The real trainer runs under torchrun (``python -m torch.distributed.run --standalone
--nproc-per-node W -m neo.train CONFIG``) with the overrides ``train.steps``,
``train.checkpoint_every``, ``train.checkpoint_dir=RUN_DIR/checkpoints``, ``train.run_dir``,
``train.log_every`` (= ``--sample-every``), ``train.resume=false`` and ``train.progress=false``;
``train.steps`` replaces the config's epochs, so the run goes over the data as many times as
needed (the main job's epoch is 1,464 steps). Everything else is the config's: the main job
evaluates every 500 steps and must end within 0.01 of the best AUC. Extra ``key=value``
arguments are passed on as further overrides. ``OMP_NUM_THREADS`` is 1 unless set.

Sampling: this process follows ``RUN_DIR/metrics.jsonl``. Each ``train`` record (every
``--sample-every`` steps) is one sample: the step, the wall time, the trainer's own training
time (from the record's cumulative ``samples_per_s``: evaluation and checkpoint pauses
excluded) and every rank's memory from ``/proc/<pid>/status`` of the worker torchrun started
for it (``VmRSS``, and its parts ``RssAnon``, ``RssFile``, ``RssShmem``), read right after the
record appears.

Verdict: warm-up is the first ``--warmup-fraction`` of the steps (10%). Evaluations and
checkpoints move RSS up and down by a few percent for a while, so the soak compares medians:
per rank, RSS at the end of warm-up is the median of the samples of the ``--median-steps`` steps
from the warm-up step on, RSS at the end the median of the last ``--median-steps`` steps
(default: a quarter of the steps after warm-up each, at least one ``--window``: RSS swings by
several percent from sample to sample, and the median of one checkpoint interval's 20 samples
still moved by 3-5% with no trend behind it), and growth = (end - warm-up) / warm-up. ``--no-smooth``
compares the two single samples instead. The soak passes when every rank grows by less than
``--max-growth-pct`` (2%). Also reported: the single-sample growth, the peak after warm-up and
the least-squares trend (percent per 1,000 steps).

Output: a table of windows of ``--window`` steps: median step time (ms, training time only),
wall seconds (pauses included) and every rank's RSS at the window's end; the per-rank
verdict; the time per step after warm-up; with ``--json``, the machine
(tools/bench_common.py), the commands, the date, the trainer's final JSON line and the whole
time series (``records``).

``--quick`` (600 steps, checkpoints and evaluations every 100, warm-up 20%) checks the
machinery in about half a minute; like the full soak's, its warm-up holds a checkpoint and an
evaluation, but 480 steps are too few for its verdict to say much.

Exit status: 0 when memory stayed within the bound; 1 when a rank grew by more; 2 for bad
arguments or a training run that failed (its output is in ``RUN_DIR/train.log``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))          # bench_common, also when imported (tests)

from bench_common import json_path, nonneg_float, nonneg_int, positive_float, positive_int, write_json  # noqa: E402

STATUS_FIELDS = {"VmRSS": "rss_kib", "RssAnon": "rss_anon_kib", "RssFile": "rss_file_kib", "RssShmem": "rss_shmem_kib"}
"""Fields of /proc/<pid>/status (kB) recorded per rank, and their names in the records."""

RUN_OUTPUTS = ("metrics.jsonl", "metrics.jsonl.tmp", "plan.json", "train.log", "tensorboard", "checkpoints", "torchrun")
"""What a soak leaves in its run directory (removed before a new soak starts there)."""


# ----------------------------------------------------------------------------- pure functions
def memory_growth(samples: Sequence[Dict[str, Any]], warmup_step: int, max_growth_pct: float,
                  span: int = 0, key: str = "rss_kib") -> Dict[str, Dict[str, Any]]:
    """Per rank: memory at the end of warm-up and at the end, growth, trend and verdict.

    ``samples``: ``{"step": N, key: {rank: KiB}}`` in step order. With ``span`` = 0 the end of
    warm-up is the first sample at or after ``warmup_step`` (the last sample when there is
    none) and the end is the last sample. With ``span`` > 0 each is the median of the samples
    of ``span`` steps: steps [warmup_step, warmup_step + span) and (last step - span, last
    step] (evaluations and checkpoints move RSS up and down by a few percent for a while;
    a median over a checkpoint interval is not thrown by where one sample fell).

    Returned per rank: ``warmup_kib``, ``end_kib`` and ``growth_pct`` = 100 x (end - warm-up)
    / warm-up; ``point_growth_pct`` (the two single samples), ``peak_growth_pct`` (the largest
    sample from warm-up on), ``trend_pct_per_1k_steps`` (least-squares slope from warm-up on,
    in percent of the warm-up value per 1,000 steps); ``ok``: growth_pct < max_growth_pct."""
    out: Dict[str, Dict[str, Any]] = {}
    ranks = sorted({r for s in samples for r in s.get(key, {})}, key=int)
    for r in ranks:
        mine = [(s["step"], s[key][r]) for s in samples if r in s.get(key, {})]
        base_step, base_point = next(((st, v) for st, v in mine if st >= warmup_step), mine[-1])
        end_step, end_point = mine[-1]
        if span > 0:
            head = [v for st, v in mine if base_step <= st < base_step + span] or [base_point]
            tail = [v for st, v in mine if st > end_step - span] or [end_point]
            base, end = statistics.median(head), statistics.median(tail)
        else:
            base, end = base_point, end_point
        after = [(st, v) for st, v in mine if st >= base_step]
        pct = (lambda x: round(100.0 * (x - base) / base, 3)) if base else (lambda x: math.inf)  # noqa: E731
        trend = None
        if len(after) >= 2 and base:
            n = len(after)
            mx, my = sum(st for st, _ in after) / n, sum(v for _, v in after) / n
            sxx = sum((st - mx) ** 2 for st, _ in after)
            if sxx > 0:
                slope = sum((st - mx) * (v - my) for st, v in after) / sxx
                trend = round(100.0 * 1000 * slope / base, 4)
        growth = pct(end)
        out[r] = {"warmup_step": base_step, "end_step": end_step, "span_steps": span,
                  "warmup_kib": base, "end_kib": end, "growth_pct": growth,
                  "warmup_point_kib": base_point, "end_point_kib": end_point,
                  "point_growth_pct": (round(100.0 * (end_point - base_point) / base_point, 3) if base_point
                                       else math.inf),
                  "peak_kib": max(v for _, v in after), "peak_growth_pct": pct(max(v for _, v in after)),
                  "trend_pct_per_1k_steps": trend, "ok": bool(growth < max_growth_pct)}
    return out


def train_seconds(record: Dict[str, Any], global_batch: int, start_step: int = 0) -> Optional[float]:
    """The trainer's training time up to a ``train`` record (its ``samples_per_s`` is
    cumulative: samples since the start / training seconds, pauses excluded)."""
    sps = record.get("samples_per_s")
    if not sps:
        return None
    return (record["step"] - start_step) * global_batch / sps


def windows(samples: Sequence[Dict[str, Any]], size: int, total_steps: int,
            start_wall: Optional[float] = None) -> List[Dict[str, Any]]:
    """Steps (a, b] in windows of ``size``: the median step time (ms) of the sampling intervals
    that end in the window, the wall seconds it took (the first window: from ``start_wall``,
    when training started) and every rank's RSS at its last sample."""
    out = []
    prev: Optional[Dict[str, Any]] = None
    ms_by_window: Dict[int, List[float]] = {}
    for s in samples:
        if prev is not None and s.get("train_s") is not None and prev.get("train_s") is not None \
                and s["step"] > prev["step"]:
            w = (s["step"] - 1) // size
            ms_by_window.setdefault(w, []).append(1e3 * (s["train_s"] - prev["train_s"]) / (s["step"] - prev["step"]))
        prev = s
    for w in range(math.ceil(total_steps / size)):
        a, b = w * size, min((w + 1) * size, total_steps)
        inside = [s for s in samples if a < s["step"] <= b]
        before = [s for s in samples if s["step"] <= a]
        row: Dict[str, Any] = {"first_step": a + 1, "last_step": b}
        ms = ms_by_window.get(w, [])
        row["step_ms_median"] = round(statistics.median(ms), 3) if ms else None
        if inside:
            last = inside[-1]
            start = before[-1]["wall_s"] if before else (start_wall if a == 0 else None)
            row["wall_s"] = round(last["wall_s"] - start, 2) if start is not None else None
            row["rss_kib"] = dict(last.get("rss_kib", {}))
        out.append(row)
    return out


# ----------------------------------------------------------------------------- the workers' memory
def read_status(pid: int) -> Optional[Dict[str, int]]:
    """``STATUS_FIELDS`` of a process in KiB (None when it has exited)."""
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in STATUS_FIELDS:
                    out[STATUS_FIELDS[name]] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return out if "rss_kib" in out else None


def worker_pids(agent: int) -> Dict[str, int]:
    """{RANK: pid} of the workers torchrun's agent ``agent`` started (its children with RANK set)."""
    out: Dict[str, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != agent:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            out[env[b"RANK"].decode()] = int(name)
        except (OSError, ValueError, IndexError, KeyError):
            continue
    return out


class _Follower:
    """New complete lines of a growing file."""

    def __init__(self, path: str):
        self.path, self.offset, self.rest = path, 0, b""

    def lines(self) -> List[Dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *complete, self.rest = (self.rest + data).split(b"\n")
        out = []
        for line in complete:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


# ----------------------------------------------------------------------------- the run
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/main_job.yaml", help="Neo config (default: the main job's)")
    p.add_argument("--steps", type=positive_int, default=20000, help="training steps (default 20000)")
    p.add_argument("--checkpoint-every", type=nonneg_int, default=1000, help="checkpoint cadence in steps (default 1000)")
    p.add_argument("--nproc", type=positive_int, default=2, help="ranks (torchrun --nproc-per-node; default 2)")
    p.add_argument("--sample-every", type=positive_int, default=50,
                   help="steps between samples (= train.log_every; default 50)")
    p.add_argument("--warmup-fraction", type=float, default=None,
                   help="share of the steps that is warm-up (default 0.1; 0.2 with --quick)")
    p.add_argument("--max-growth-pct", type=nonneg_float, default=2.0,
                   help="the bound: RSS growth after warm-up, percent (default 2)")
    p.add_argument("--window", type=nonneg_int, default=0,
                   help="steps per row of the table and of the medians the verdict compares (default: the "
                        "checkpoint interval)")
    p.add_argument("--median-steps", type=nonneg_int, default=0,
                   help="steps of the two windows whose median RSS the verdict compares (default: a quarter of "
                        "the steps after warm-up, at least one --window)")
    p.add_argument("--no-smooth", dest="smooth", action="store_false",
                   help="compare the single samples at the end of warm-up and at the end instead of the medians "
                        "of a window at each")
    p.add_argument("--run-dir", default="runs/soak",
                   help="train.run_dir (default runs/soak); the soak's earlier outputs there are removed first")
    p.add_argument("--json", default=None, type=json_path, help="write the results here")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 600 steps, checkpoints and evaluations every 100 (train.eval_every=100), "
                        "a sample every 10 steps, warm-up 20%%")
    p.add_argument("--poll-s", type=positive_float, default=0.1, help="seconds between looks at the run log")
    p.add_argument("overrides", nargs="*", help="further dotted config overrides, e.g. train.eval_every=0")
    return p


def _command(args, run_dir: str) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
            "--log-dir", os.path.join(run_dir, "torchrun"), "-m", "neo.train", args.config, f"train.steps={args.steps}",
            f"train.checkpoint_every={args.checkpoint_every}",
            f"train.checkpoint_dir={os.path.join(run_dir, 'checkpoints')}", f"train.run_dir={run_dir}",
            f"train.log_every={args.sample_every}", "train.resume=false", "train.progress=false"] + list(args.overrides)


def _final_line(log: str) -> Optional[Dict[str, Any]]:
    """The trainer's final JSON line (the last line of its stdout that is a JSON object)."""
    try:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def run_soak(args) -> Dict[str, Any]:
    """Launch the training, sample it until it ends; return the results (see module doc)."""
    from neo.config import load_config

    run_dir = os.path.abspath(args.run_dir)
    if not os.path.exists(args.config) and (ROOT / args.config).exists():
        args.config = str(ROOT / args.config)                           # configs/... from anywhere
    args.config = os.path.abspath(args.config)
    cmd = _command(args, run_dir)
    cfg = load_config(args.config, cmd[cmd.index(args.config) + 1:])      # a config error stops here
    global_batch = cfg.train.batch_size * args.nproc
    os.makedirs(run_dir, exist_ok=True)
    for name in RUN_OUTPUTS:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    log_path = os.path.join(run_dir, "train.log")
    follower = _Follower(os.path.join(run_dir, "metrics.jsonl"))
    samples: List[Dict[str, Any]] = []
    events: List[Dict[str, Any]] = []
    pids: Dict[str, int] = {}
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            while True:
                done = agent.poll() is not None
                for rec in follower.lines():
                    kind = rec.get("kind")
                    if kind not in ("train", "final"):
                        events.append({k: v for k, v in rec.items() if not isinstance(v, (dict, list))})
                        continue
                    now = round(time.monotonic() - t0, 3)
                    if kind == "final":
                        events.append({"kind": "final", "step": rec.get("step"), "wall_s": now})
                        continue
                    if len(pids) < args.nproc or any(read_status(p) is None for p in pids.values()):
                        pids = worker_pids(agent.pid)
                    sample: Dict[str, Any] = {"step": rec["step"], "wall_s": now,
                                              "train_s": train_seconds(rec, global_batch), "loss": rec.get("loss")}
                    for rank, pid in sorted(pids.items()):
                        st = read_status(pid)
                        for field, value in (st or {}).items():
                            sample.setdefault(field, {})[rank] = value
                    samples.append(sample)
                if done:
                    break
                time.sleep(args.poll_s)
        except BaseException:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGTERM)
                try:
                    agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(agent.pid, signal.SIGKILL)
            raise
    wall = time.monotonic() - t0
    warmup_step = max(1, math.ceil(args.warmup_fraction * args.steps))
    have_rss = [s for s in samples if s.get("rss_kib")]
    size = args.window or args.checkpoint_every or max(1, args.steps // 20)
    # the verdict's medians: a quarter of the steps after warm-up each (at least one window). RSS
    # swings by +-8% between samples (gc, evaluation, checkpoint staging): over 20 samples of one
    # checkpoint interval the median still moved by 3 to 5% with no trend behind it
    span = max(size, args.median_steps or (args.steps - warmup_step) // 4) if args.smooth else 0
    growth = memory_growth(have_rss, warmup_step, args.max_growth_pct, span) if have_rss else {}
    growth_anon = memory_growth([s for s in samples if s.get("rss_anon_kib")], warmup_step, args.max_growth_pct,
                                span, key="rss_anon_kib") if have_rss else {}
    timed = [s for s in samples if s.get("train_s") is not None]
    post = [s for s in timed if s["step"] >= warmup_step]
    per_step = None
    if len(post) >= 2 and post[-1]["step"] > post[0]["step"]:
        n = post[-1]["step"] - post[0]["step"]
        per_step = {"train_ms": round(1e3 * (post[-1]["train_s"] - post[0]["train_s"]) / n, 3),
                    "wall_ms": round(1e3 * (post[-1]["wall_s"] - post[0]["wall_s"]) / n, 3)}
    first = timed[0] if timed else None
    startup = round(first["wall_s"] - first["train_s"], 2) if first else None
    final = _final_line(log_path)
    latest = None
    try:
        with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
            latest = f.read().strip()
    except OSError:
        pass
    status = agent.returncode
    complete = status == 0 and bool(samples) and samples[-1]["step"] == args.steps
    return {
        "tool": "soak", "config": args.config, "run_dir": run_dir, "steps": args.steps,
        "checkpoint_every": args.checkpoint_every,
        "world_size": args.nproc, "global_batch": global_batch, "sample_every": args.sample_every,
        "warmup_fraction": args.warmup_fraction, "warmup_step": warmup_step, "max_growth_pct": args.max_growth_pct,
        "median_span_steps": span,
        "command": {"soak": [sys.executable] + sys.argv, "train": cmd},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "train_exit_status": status, "complete": complete, "wall_s": round(wall, 2), "startup_s": startup,
        "per_step_after_warmup": per_step, "latest_checkpoint": latest,
        "growth": growth, "growth_anon": growth_anon,
        "passed": bool(complete and growth and all(g["ok"] for g in growth.values())),
        "windows": windows(samples, size, args.steps, startup), "events": events, "final": final, "records": samples,
    }


def _mib(kib: Optional[int]) -> str:
    return f"{kib / 1024:9.1f}" if kib is not None else f"{'-':>9}"


def report(res: Dict[str, Any]) -> str:
    """The table and the verdict, as printed."""
    ranks = sorted(res["growth"], key=int)
    lines = [f"soak: {res['config']}, {res['steps']} steps, W = {res['world_size']}, "
             f"checkpoint every {res['checkpoint_every']}, warm-up to step {res['warmup_step']}",
             f"{'steps':>13} {'step ms':>9} {'wall s':>8}" + "".join(f" {'rss r' + r + ' MiB':>13}" for r in ranks)]
    for w in res["windows"]:
        ms = f"{w['step_ms_median']:9.2f}" if w.get("step_ms_median") is not None else f"{'-':>9}"
        wall = f"{w['wall_s']:8.1f}" if w.get("wall_s") is not None else f"{'-':>8}"
        lines.append(f"{w['first_step']:>6}-{w['last_step']:<6} {ms} {wall}"
                     + "".join(f"    {_mib(w.get('rss_kib', {}).get(r))}" for r in ranks))
    what = (f"median of steps {res['warmup_step']}-{res['warmup_step'] + res['median_span_steps'] - 1} -> "
            f"median of the last {res['median_span_steps']} steps") if res["median_span_steps"] else \
        f"sample at step {res['warmup_step']} -> last sample"
    lines.append(f"RSS growth after warm-up ({what}); bound {res['max_growth_pct']:g}%:")
    for r in ranks:
        g, a = res["growth"][r], res["growth_anon"].get(r)
        anon = f"; anonymous memory {a['growth_pct']:+.2f}%" if a else ""
        t = g["trend_pct_per_1k_steps"]
        trend = f", trend {t:+.3f}%/1k steps" if t is not None else ""
        lines.append(f"  rank {r}: {g['warmup_kib'] / 1024:.1f} -> {g['end_kib'] / 1024:.1f} MiB: "
                     f"{g['growth_pct']:+.2f}% {'ok' if g['ok'] else 'OVER THE BOUND'} (single samples "
                     f"{g['point_growth_pct']:+.2f}%, peak {g['peak_growth_pct']:+.2f}%{trend}{anon})")
    ps = res.get("per_step_after_warmup")
    if ps:
        est = res["startup_s"] + 20000 * ps["wall_ms"] / 1e3 if res.get("startup_s") is not None else None
        lines.append(f"after warm-up: {ps['train_ms']:.2f} ms/step training, {ps['wall_ms']:.2f} ms/step wall "
                     f"(evaluations and checkpoints included); startup {res['startup_s']} s; wall {res['wall_s']} s"
                     + (f"; 20,000 steps at this rate: about {est / 60:.0f} min" if est is not None else ""))
    final = res.get("final") or {}
    if final:
        lines.append(f"final: steps {final.get('steps')}, auc {final.get('auc')}, samples/s "
                     f"{final.get('samples_per_s')}, state_sha256 {str(final.get('state_sha256'))[:16]}...; "
                     f"latest checkpoint {res['latest_checkpoint']}")
    if not res["complete"]:
        lines.append(f"training did not complete (exit status {res['train_exit_status']}): see "
                     f"{os.path.join(res['run_dir'], 'train.log')}")
    lines.append("PASS" if res["passed"] else "FAIL")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    args = p.parse_intermixed_args(argv)
    if args.quick:                 # like the full soak, the warm-up holds a checkpoint and an evaluation
        args.steps, args.checkpoint_every, args.sample_every = 600, 100, 10
        args.overrides = ["train.eval_every=100"] + list(args.overrides)
        if args.warmup_fraction is None:
            args.warmup_fraction = 0.2
    if args.warmup_fraction is None:
        args.warmup_fraction = 0.1
    if args.steps <= 0 or args.checkpoint_every < 0 or args.sample_every <= 0 or args.nproc <= 0 \
            or not 0 <= args.warmup_fraction < 1:
        p.error("--steps, --sample-every and --nproc must be > 0, --checkpoint-every >= 0, "
                "--warmup-fraction in [0, 1)")
    from neo.config import ConfigError

    machine = None
    if args.json:
        from bench_common import machine_info

        machine = machine_info()                    # before the run: the load average the soak started under
    try:
        res = run_soak(args)
    except ConfigError as e:
        print(f"soak: config error: {e}", file=sys.stderr)
        return 2
    if args.json:
        res["machine"] = machine
        write_json(args.json, res)
    print(report(res))
    if not res["complete"]:
        print(f"soak: the training run failed (exit status {res['train_exit_status']}); its log: "
              f"{os.path.join(res['run_dir'], 'train.log')}", file=sys.stderr)
        return 2
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
