"""Where a training run's host time goes: ``neo train`` in one process under ``torch.profiler``.

    python tools/profile_train.py configs/train_tiny.yaml train.steps=20
    python tools/profile_train.py configs/main_job.yaml train.device=cuda train.embedding_backend=triton \\
        train.batch_size=2048 train.steps=300 --out bench_out/profile_main_job.txt --json bench_out/profile.json

A step that is bound by its host (a GPU step whose kernels are microseconds, a Python loop
around them) shows it in three counts, each per training step:

- device synchronisations (``cudaStreamSynchronize`` and the other waits; 0 on the CPU);
- host reads of tensor values (``.item()``, ``int()``, ``float()``, ``bool()``, ``.tolist()``,
  ``.cpu()``, ``.numpy()``), each by the call site in ``neo/`` that made it: on a GPU each is a
  wait for every kernel queued before it;
- kernel launches (CUDA; 0 on the CPU).

The whole run is profiled (the first steps' Triton compilation and the final evaluation too: use
enough steps that they weigh little). Prints, and writes to ``--out``, the profiler's operator
tables by self CPU and self device time and the counts; ``--json`` writes the counts with the
machine. Overrides after the config are ``neo train``'s (``train.progress``, ``train.run_dir``
and ``train.checkpoint_dir`` default to off / a temporary folder / none here).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import traceback
from typing import Callable, Counter, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from bench_common import json_path, machine_info, write_json  # noqa: E402

import torch  # noqa: E402

import neo  # noqa: E402

NEO_DIR = os.path.dirname(os.path.abspath(neo.__file__)) + os.sep
"""The neo package's folder: a read's site is the innermost frame in a file under it (not any path
with a folder named neo: a checkout is often called that)."""

HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy")
"""The ``torch.Tensor`` methods that hand a tensor's values to Python (on a GPU: after a wait)."""
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


class HostReads:
    """Counts the host reads of tensor values by call site while installed (``with``): the
    innermost frame in ``neo/`` that asked, as ``method path:line function``."""

    def __init__(self):
        self.sites: Counter[str] = collections.Counter()
        self._saved: Dict[str, Callable] = {}

    def _wrap(self, name: str, fn: Callable) -> Callable:
        sites = self.sites

        def counted(tensor, *args, **kwargs):
            for frame in reversed(traceback.extract_stack(limit=8)[:-1]):
                if os.path.abspath(frame.filename).startswith(NEO_DIR):
                    site = f"{os.path.abspath(frame.filename)[len(NEO_DIR):]}:{frame.lineno} {frame.name}"
                    break
            else:
                site = "(outside neo/)"
            sites[f"{name} {site}"] += 1
            return fn(tensor, *args, **kwargs)

        return counted

    def __enter__(self) -> "HostReads":
        for name in HOST_READS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(torch.Tensor, name, fn)
        self._saved.clear()


def train_argv(config: str, overrides: List[str], run_dir: str) -> List[str]:
    """``neo train``'s arguments: quiet, in a temporary run folder, no checkpoints, unless overridden."""
    given = {o.split("=", 1)[0] for o in overrides}
    defaults = {"train.progress": "false", "train.run_dir": run_dir, "train.checkpoint_dir": "null"}
    return [config] + [f"{k}={v}" for k, v in defaults.items() if k not in given] + list(overrides)


def counts(events, sites: Counter[str], steps: int) -> Dict[str, object]:
    """The per-step counts of a profile (``events``: ``key_averages()``) and the host reads."""
    by_key = {e.key: e.count for e in events}
    syncs = sum(by_key.get(k, 0) for k in SYNCS)
    launches = sum(by_key.get(k, 0) for k in LAUNCHES)
    reads = sum(sites.values())
    per = max(steps, 1)
    return dict(steps=steps, device_syncs=syncs, device_syncs_per_step=syncs / per, kernel_launches=launches,
                kernel_launches_per_step=launches / per, host_reads=reads, host_reads_per_step=reads / per,
                host_reads_by_site=dict(sites.most_common()))


def report(events, c: Dict[str, object], wall_s: float, device: bool) -> str:
    lines = [f"neo train under torch.profiler: {c['steps']} steps in {wall_s:.2f} s (profiler overhead included)", ""]
    lines.append(events.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70))
    if device:
        lines += ["", events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70)]
    lines += ["", f"per training step: {c['device_syncs_per_step']:.1f} device synchronisations, "
                  f"{c['kernel_launches_per_step']:.0f} kernel launches, {c['host_reads_per_step']:.1f} host reads "
                  "of tensor values", "", "host reads by call site (the whole run, evaluation included):"]
    lines += [f"  {n:>8}  {site}" for site, n in c["host_reads_by_site"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="a neo train config (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", help="neo train's dotted overrides, e.g. train.steps=300 train.device=cuda")
    p.add_argument("--out", metavar="FILE", help="also write the report here")
    p.add_argument("--json", metavar="FILE", type=json_path, help="write the counts and the machine here")
    args = p.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from neo.commands.train import main as neo_train
    from neo.config import load_config

    device = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    with tempfile.TemporaryDirectory(prefix="neo_profile_") as run_dir:
        train_args = train_argv(args.config, args.overrides, run_dir)
        steps_cfg = load_config(train_args[0], train_args[1:]).train.steps
        if steps_cfg <= 0:
            p.error("give train.steps=N (the counts are per training step; a whole epoch profiled is too long)")
        with HostReads() as reads, profile(activities=activities) as prof:
            t0 = time.perf_counter()
            status = neo_train(train_args)
            wall_s = time.perf_counter() - t0
    if status != 0:
        print(f"profile_train: neo train exited with status {status}", file=sys.stderr)
        return status
    events = prof.key_averages()
    c = counts(events, reads.sites, steps_cfg)
    text = report(events, c, wall_s, device)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        write_json(args.json, [dict(c, config=args.config, overrides=args.overrides, wall_s=wall_s,
                                    device=torch.cuda.get_device_name(0) if device else "cpu", machine=machine_info())])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
