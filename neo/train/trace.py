"""A timeline of a training run: every rank's phases as spans, written as a Chrome / Perfetto trace.

``neo train CONFIG train.trace=run.json`` records, for the first ``train.trace_steps`` steps (and
every evaluation and checkpoint after them), one span per timed phase on the thread, or lane,
where it ran, and writes one JSON file in the Trace Event Format (rank 0 gathers every rank's
spans after training)::

    {"traceEvents": [
       {"name": "dense_fwd", "ph": "X", "ts": 1523.4, "dur": 310.2, "pid": 1, "tid": 1,
        "args": {"step": 7, "lane": "main"}},                       # rank 1, main thread
       {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "rank 1"}},
       {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "main"}}, ...],
     "displayTimeUnit": "ms", "otherData": {"unix_origin_us": ..., "ranks": 2, ...}}

``ts`` and ``dur`` are microseconds; ``ts`` counts from the earliest span of any rank (the wall
clock, ``otherData.unix_origin_us``, so ranks of one host line up). ``pid`` is the rank, ``tid``
a lane (its name in the ``thread_name`` metadata and in ``args.lane``):

    main        the training loop's thread: every phase of :class:`neo.train.step.Timers`
                (data, input_dist, lookup, output_dist, dense_fwd, backward, embedding_bwd,
                output_dist_bwd, optimizer, metrics, evaluate, checkpoint), nested in a ``step`` span
    input_dist  a batch's input distribution from launch to arrival (in flight under the step
                before it: neo/train/pipeline.py)
    grad_sync   DDP's gradient AllReduce of each bucket, from launch (in the backward) to arrival
    loader      the loader's background thread building each batch (data_pipeline/loader.py)
    reader      the loader's reader thread decoding Parquet row groups
    cache       the cache's worker making a batch's rows resident (neo/embedding/cache/prefetch.py)

Lanes of work in flight (``input_dist``, ``grad_sync``) may hold overlapping spans; they are
spread over ``input_dist``, ``input_dist 2``, ... so that spans on one lane nest or are disjoint.

The recorder is attached to :class:`~neo.train.step.Timers` (``timers.trace``), so every timed
phase becomes a span with no change at its call site; background threads record through
``recorder.span`` / ``iterate`` / ``wrap``. Off (``train.trace: null``) nothing is allocated and
each timed phase pays one ``is None`` test.

Checks on a written trace: :func:`idle_gaps` (the main lane's time outside any span),
:func:`input_dist_overlap` (each step's input distribution in flight under its compute),
:func:`lane_violations` (spans of one lane that overlap without nesting).
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["TraceRecorder", "attach", "trace_ddp", "write_trace", "to_chrome", "load_trace", "idle_gaps",
           "input_dist_overlap", "lane_violations", "spans", "LANES", "COMPUTE"]

LANES = ("main", "input_dist", "grad_sync", "loader", "reader", "cache", "ps")
"""Lanes in display order (tid 1, 2, ...); other lanes follow."""
_IN_FLIGHT = {"input_dist", "grad_sync"}
"""Lanes whose spans may overlap (work in flight); packed onto sub-lanes when written."""
_ALWAYS = {"evaluate", "checkpoint", "state_digest"}
"""Recorded after ``max_steps`` too (rare, and what a long run's trace is often wanted for)."""
_THREAD_LANES = (("MainThread", "main"), ("neo-data-loader", "loader"), ("neo-data-read", "reader"),
                 ("neo-cache", "cache"))
COMPUTE = ("lookup", "output_dist", "dense_fwd", "backward", "embedding_bwd", "output_dist_bwd", "optimizer")
"""Main-lane phases of a step's compute (what the next batch's input distribution should hide under)."""


def _thread_lane() -> str:
    name = threading.current_thread().name
    for prefix, lane in _THREAD_LANES:
        if name.startswith(prefix):
            return lane
    return name


class TraceRecorder:
    """Spans of one rank (see the module docstring); thread-safe, bounded.

    Args:
        rank: this process's rank (the trace's ``pid``).
        max_steps: steps recorded (``train.trace_steps``); later spans are dropped, but for
            evaluations and checkpoints.
        max_events: a hard bound on the spans kept (default 500 per step + 10,000).
    """

    def __init__(self, rank: int, max_steps: int = 200, max_events: Optional[int] = None):
        self.rank, self.max_steps = rank, max_steps
        self.max_events = max_events if max_events is not None else 500 * max_steps + 10_000
        self.step = 0
        """The step the main loop is in (set by :meth:`begin_step`); spans carry it in ``args.step``."""
        self.dropped = 0
        """Spans not kept (past ``max_steps`` or ``max_events``)."""
        self._events: List[Tuple[str, str, float, float, int, Optional[Dict[str, Any]]]] = []
        self._lock = threading.Lock()
        self._perf0, self._unix0 = time.perf_counter(), time.time()
        self._step_token: Optional[tuple] = None

    # ------------------------------------------------------------------ recording
    def add(self, name: str, lane: Optional[str], t0: float, t1: float, args: Optional[Dict[str, Any]] = None,
            step: Optional[int] = None) -> None:
        """One span from ``t0`` to ``t1`` (``time.perf_counter()`` seconds) on ``lane`` (None: this thread's)."""
        step = self.step if step is None else step
        if (step >= self.max_steps and name not in _ALWAYS) or len(self._events) >= self.max_events:
            self.dropped += 1
            return
        with self._lock:
            self._events.append((name, lane or _thread_lane(), t0, t1, step, args))

    @contextmanager
    def span(self, name: str, lane: Optional[str] = None, **args: Any) -> Iterator[None]:
        """``with recorder.span("load", "loader"): ...``: the block as one span."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, lane, t0, time.perf_counter(), args or None)

    def begin(self, name: str, lane: Optional[str] = None, **args: Any) -> tuple:
        """Open a span that :meth:`end` closes, possibly on another thread (work in flight)."""
        return (name, lane or _thread_lane(), time.perf_counter(), self.step, args or None)

    def end(self, token: Optional[tuple]) -> None:
        if token is not None:
            name, lane, t0, step, args = token
            self.add(name, lane, t0, time.perf_counter(), args, step)

    def iterate(self, items: Iterable[Any], name: str, lane: Optional[str] = None) -> Iterator[Any]:
        """``items`` with the making of each one (its ``next``) as a span."""
        it = iter(items)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                self.add(name, lane, t0, time.perf_counter())
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def wrap(self, fn: Callable[..., Any], name: str, lane: Optional[str] = None) -> Callable[..., Any]:
        """``fn`` with each call a span (on the thread that calls it)."""
        def traced(*a: Any, **k: Any) -> Any:
            with self.span(name, lane):
                return fn(*a, **k)
        return traced

    def begin_step(self, step: int) -> None:
        """The main loop starts step ``step`` (0-based): closes the previous ``step`` span, opens this one."""
        self.end_step()
        self.step = step
        self._step_token = ("step", "main", time.perf_counter(), step, {"step": step})

    def end_step(self) -> None:
        token, self._step_token = self._step_token, None
        self.end(token)

    # ------------------------------------------------------------------ output
    def events(self) -> List[Dict[str, Any]]:
        """This rank's spans as Trace Event Format dicts, ``ts`` in microseconds since the Unix epoch."""
        with self._lock:
            raw = list(self._events)
        out = []
        for name, lane, t0, t1, step, args in raw:
            a = {"step": step, "lane": lane}
            if args:
                a.update(args)
            out.append({"name": name, "ph": "X", "ts": (self._unix0 + t0 - self._perf0) * 1e6,
                        "dur": max(0.0, (t1 - t0) * 1e6), "pid": self.rank, "args": a})
        return out


def attach(recorder: TraceRecorder, timers=None, loaders: Sequence[Any] = (), embedding=None, ddp=None) -> None:
    """Route spans to ``recorder``: the phase ``timers``, the ``loaders``' background threads, the
    cache worker of ``embedding`` (a sharded collection or a TableBatchedEmbedding) and the
    gradient AllReduce of ``ddp``. Each is optional."""
    if timers is not None:
        timers.trace = recorder
    for loader in loaders:
        if loader is not None:
            loader.trace = recorder
    lookup = getattr(embedding, "lookup", embedding)
    cache = getattr(lookup, "_cache", None) if lookup is not None else None   # the cache's owner is the module
    if cache is not None:
        cache.trace = recorder
    if ddp is not None:
        trace_ddp(ddp, recorder)


def trace_ddp(ddp, recorder: TraceRecorder) -> None:
    """Record each DDP bucket's AllReduce (lane ``grad_sync``) through a communication hook doing
    what DDP's built-in one does: scale by 1 / W while in the bucket (as ``at::mul_out`` with the
    scalar 1 / W), AllReduce-sum, asynchronously."""
    import torch.distributed as dist

    shm = getattr(ddp, "neo_grad_sync", None)         # the reduction through shared memory (ddp_hook)
    if shm is not None:                               # already a hook (DDP takes one): it records the spans
        shm.recorder = recorder
        return
    group = ddp.process_group

    def hook(state, bucket):
        buf = bucket.buffer()
        token = recorder.begin("grad_sync", "grad_sync", bytes=buf.numel() * buf.element_size())
        buf.mul_(1.0 / dist.get_world_size(group))
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

        def done(f):
            recorder.end(token)
            return f.value()[0]
        return fut.then(done)

    ddp.register_comm_hook(None, hook)


# ---------------------------------------------------------------------------- files
def _pack_lanes(events: List[Dict[str, Any]]) -> None:
    """Spread overlapping spans of in-flight lanes over sub-lanes (``grad_sync 2``...), in place."""
    by_key: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for e in events:
        if e["args"]["lane"] in _IN_FLIGHT:
            by_key.setdefault((e["pid"], e["args"]["lane"]), []).append(e)
    for (_, lane), evs in by_key.items():
        ends: List[float] = []                                  # end of the last span on each sub-lane
        for e in sorted(evs, key=lambda e: e["ts"]):
            k = next((i for i, end in enumerate(ends) if end <= e["ts"]), len(ends))
            if k == len(ends):
                ends.append(0.0)
            ends[k] = e["ts"] + e["dur"]
            if k:
                e["args"]["lane"] = f"{lane} {k + 1}"


def to_chrome(per_rank: Sequence[List[Dict[str, Any]]], meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The trace file's JSON object from every rank's :meth:`TraceRecorder.events`."""
    events = [dict(e, args=dict(e["args"])) for evs in per_rank for e in evs]
    _pack_lanes(events)
    origin = min((e["ts"] for e in events), default=0.0)
    lanes: Dict[Tuple[int, str], int] = {}
    order = {name: k for k, name in enumerate(LANES)}
    for pid, lane in sorted({(e["pid"], e["args"]["lane"]) for e in events},
                            key=lambda pl: (pl[0], order.get(pl[1].split(" ")[0], len(LANES)), pl[1])):
        lanes[(pid, lane)] = sum(1 for p, _ in lanes if p == pid) + 1
    for e in events:
        e["ts"] = round(e["ts"] - origin, 3)
        e["dur"] = round(e["dur"], 3)
        e["tid"] = lanes[(e["pid"], e["args"]["lane"])]
    metadata = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid}"}}
                for pid in sorted({p for p, _ in lanes})]
    for (pid, lane), tid in lanes.items():
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}})
        metadata.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    return {"traceEvents": metadata + events, "displayTimeUnit": "ms",
            "otherData": {"unix_origin_us": origin, "ranks": len(per_rank), **(meta or {})}}


def write_trace(recorder: TraceRecorder, path: str, rank: int = 0, world_size: int = 1, group=None,
                meta: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """Gather every rank's spans to rank 0 (collective when ``world_size > 1``) and write ``path``
    there. Returns the path on rank 0, None elsewhere."""
    mine = recorder.events()
    dropped = recorder.dropped
    if world_size > 1:
        import torch.distributed as dist

        gathered: List[Any] = [None] * world_size if rank == 0 else None
        dist.gather_object((mine, dropped), gathered, dst=0, group=group)
        if rank != 0:
            return None
        per_rank, drops = [g[0] for g in gathered], [g[1] for g in gathered]
    else:
        per_rank, drops = [mine], [dropped]
    trace = to_chrome(per_rank, dict(meta or {}, dropped_spans=drops, trace_steps=recorder.max_steps))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)
    return path


def load_trace(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------- checks
def spans(trace: Dict[str, Any], rank: int, lane: Optional[str] = None, names: Optional[Iterable[str]] = None):
    """The complete (``X``) spans of ``rank`` (on ``lane``, named one of ``names``), by start."""
    keep = None if names is None else set(names)
    out = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == rank
           and (lane is None or e["args"]["lane"] == lane) and (keep is None or e["name"] in keep)]
    return sorted(out, key=lambda e: (e["ts"], -e["dur"]))


def _union(intervals: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    merged: List[Tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def idle_gaps(trace: Dict[str, Any], rank: int, lane: str = "main", ignore: Sequence[str] = ("step",),
              top: int = 10) -> Dict[str, Any]:
    """The time ``lane`` of ``rank`` spent outside every span (but those named in ``ignore``)
    between the start of its first step and the end of its last (the whole lane's extent when
    it has no ``step`` spans): the host's untimed work and idle waits.

    Returns ``{"window_us", "busy_us", "idle_us", "idle_share", "gaps": [(start_us, dur_us), ...]}``
    with the ``top`` longest gaps."""
    steps = spans(trace, rank, lane, ["step"])
    work = [e for e in spans(trace, rank, lane) if e["name"] not in ignore]
    ref = steps or work
    if not ref:
        return {"window_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "idle_share": 0.0, "gaps": []}
    lo, hi = ref[0]["ts"], max(e["ts"] + e["dur"] for e in ref)
    busy = _union([(max(lo, e["ts"]), min(hi, e["ts"] + e["dur"])) for e in work
                   if e["ts"] < hi and e["ts"] + e["dur"] > lo])
    gaps, t = [], lo
    for a, b in busy:
        if a > t:
            gaps.append((t, a - t))
        t = max(t, b)
    if hi > t:
        gaps.append((t, hi - t))
    window = hi - lo
    idle = sum(d for _, d in gaps)
    return {"window_us": window, "busy_us": window - idle, "idle_us": idle,
            "idle_share": idle / window if window > 0 else 0.0,
            "gaps": sorted(gaps, key=lambda g: -g[1])[:top]}


def input_dist_overlap(trace: Dict[str, Any], rank: int, compute: Sequence[str] = COMPUTE) -> List[Dict[str, Any]]:
    """Per input distribution in flight (lane ``input_dist``, launched under step s): how long it
    was in flight and how much of that overlapped step s's compute on the main lane.

    Returns ``[{"step": s, "in_flight_us": ..., "overlap_us": ...}, ...]`` by step."""
    by_step: Dict[int, List[Tuple[float, float]]] = {}
    for e in spans(trace, rank, "main", compute):
        by_step.setdefault(e["args"]["step"], []).append((e["ts"], e["ts"] + e["dur"]))
    out = []
    for e in spans(trace, rank, None, ["input_dist"]):
        if not e["args"]["lane"].startswith("input_dist"):
            continue
        s, a, b = e["args"]["step"], e["ts"], e["ts"] + e["dur"]
        overlap = sum(max(0.0, min(b, y) - max(a, x)) for x, y in _union(by_step.get(s, [])))
        out.append({"step": s, "in_flight_us": e["dur"], "overlap_us": overlap})
    return sorted(out, key=lambda r: r["step"])


def lane_violations(trace: Dict[str, Any]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """Pairs of spans on one lane of one rank that overlap without one containing the other."""
    bad = []
    lanes: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    eps = 1e-3                                                   # rounding of ts and dur to 1 ns
    for evs in lanes.values():
        stack: List[Dict[str, Any]] = []                         # enclosing spans
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack and end > stack[-1]["ts"] + stack[-1]["dur"] + eps:
                bad.append((stack[-1], e))
            stack.append(e)
    return bad
