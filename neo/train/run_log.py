"""Where a run's numbers go: ``RUN_DIR/metrics.jsonl``, TensorBoard, a progress bar (rank 0 only).

Every record is one JSON object per line: ``{"kind": "train" | "eval" | "cache" | "restart" | "stopped" | "final", "step": N, ...}``
A run that resumes from a checkpoint (a restart under torchrun included) first drops the records
of the steps after that checkpoint, which it is about to redo, then writes a ``restart`` record
(``from_step``, ``attempt``, ``checkpoint``, ``dropped_records``): no step appears twice. A fresh
run in a run directory an earlier run wrote moves that run's file and TensorBoard events to
``RUN_DIR/previous/`` first.
(nested values, e.g. per-table cache counters, become TensorBoard tags ``kind/table/field``).
TensorBoard events go to ``RUN_DIR/tensorboard`` when ``tensorboard`` is importable (otherwise a
warning, once, and the JSONL file alone).
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from typing import Any, Dict, Optional

__all__ = ["RunLog", "start_run_log", "log_cpu_kernels"]


class RunLog:
    """Metrics sink of one rank; only rank 0 writes."""

    def __init__(self, run_dir: str, rank: int, total_steps: int, initial_step: int = 0, progress: bool = True,
                 tensorboard: bool = True, rewind_to: Optional[int] = None):
        self.active = rank == 0
        self.run_dir = run_dir
        self._jsonl = None
        self._tb = None
        self._bar = None
        self.dropped_records = 0
        """Records of steps after ``rewind_to`` removed from the file (they are being redone)."""
        if not self.active:
            return
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, "metrics.jsonl")
        self.moved_aside: Optional[str] = None
        """Where an earlier run's records went (a fresh run in a run directory already used)."""
        if rewind_to is not None:
            self.dropped_records = _rewind(path, rewind_to)
        else:
            self.moved_aside = _move_aside(run_dir)
        self._jsonl = open(path, "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = None if rewind_to is None else rewind_to + 1       # events of redone steps go too
                self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=purge)
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", file=sys.stderr,
                             dynamic_ncols=True, mininterval=1.0, desc="train")

    def message(self, text: str) -> None:
        """A line for the user (through the progress bar, so it is not garbled)."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def advance(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                      refresh=False)

    def record(self, kind: str, step: int, values: Dict[str, Any]) -> None:
        if not self.active:
            return
        rec = {"kind": kind, "step": step, **values}
        self._jsonl.write(json.dumps(rec, default=_jsonable) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in _flatten(values):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        """Close the progress bar, metrics.jsonl and the TensorBoard writer (whose background
        thread, left running at interpreter exit, can abort the process); a second call does nothing."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def start_run_log(runlog: RunLog, plan: Dict[str, Any], device, step: int) -> None:
    """What a run's log starts with: the sharding plan (``plan.json`` in the run directory, rank
    0) and, on the CPU, the kernels it computes with (:func:`log_cpu_kernels`)."""
    if runlog.active:
        if runlog.moved_aside:
            runlog.message(f"neo train: {runlog.run_dir} held an earlier run's metrics.jsonl and TensorBoard events: "
                           f"moved to {runlog.moved_aside}")
        with open(os.path.join(runlog.run_dir, "plan.json"), "w") as f:
            json.dump(plan, f, indent=1)
    if device.type == "cpu":
        log_cpu_kernels(runlog, step)


def log_cpu_kernels(runlog: RunLog, step: int) -> None:
    """The CPU kernels a run computes with, in its run log: a line for the user (``CPU kernels:
    avx2 (built: baseline, avx2, avx512; runnable here: ...; CPU: <model>; NEO_CPU_ISA=avx2)``,
    :func:`neo.cpp.describe_cpu_kernels`) and a ``cpu_kernels`` record in metrics.jsonl
    (``neo_cpu_isa``, ``built``, ``supported``, ``forced``, ``cpu_model``, ``interaction_tiles``).
    Nothing where ``neo._C`` is not built (the reference kernels run)."""
    from neo.cpp import cpu_isa_info, describe_cpu_kernels

    info = cpu_isa_info()
    if info["neo_cpu_isa"] is None:
        return
    runlog.message(f"CPU kernels: {describe_cpu_kernels(info)}")
    runlog.record("cpu_kernels", step, {k: info[k] for k in ("neo_cpu_isa", "built", "supported", "forced",
                                                             "cpu_model", "interaction_tiles")})


def _move_aside(run_dir: str) -> Optional[str]:
    """A fresh run (step 0, no checkpoint) in ``run_dir`` that an earlier run wrote: that run's
    ``metrics.jsonl`` and ``tensorboard/`` go to ``run_dir/previous/`` (replacing an older one),
    so that the file holds this run's records alone (no step twice) and TensorBoard shows the two
    runs apart. Returns that directory, or None when there was nothing to move."""
    import shutil

    names = [n for n in ("metrics.jsonl", "tensorboard") if os.path.exists(os.path.join(run_dir, n))]
    if not names:
        return None
    previous = os.path.join(run_dir, "previous")
    shutil.rmtree(previous, ignore_errors=True)
    os.makedirs(previous)
    for n in names:
        os.replace(os.path.join(run_dir, n), os.path.join(previous, n))
    return previous


def _rewind(path: str, step: int) -> int:
    """Keep the records of steps up to ``step`` (and no final record of a run that went beyond
    it); rewrite the file atomically. Returns how many records were dropped."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        try:
            rec = json.loads(line)
            late = int(rec.get("step", 0)) > step or (rec.get("kind") == "final" and int(rec.get("step", 0)) >= step)
        except (ValueError, TypeError, AttributeError):
            late = True                                  # a line cut short by the crash
        if not late:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(x + "\n" for x in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(lines) - len(kept)


def _flatten(values: Dict[str, Any], prefix: str = ""):
    """(``a/b``, value) pairs of a nested dict (TensorBoard tags)."""
    for k, v in values.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


def _jsonable(x: Any) -> Optional[Any]:
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)
