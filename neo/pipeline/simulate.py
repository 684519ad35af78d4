"""A pipeline step replayed action by action: each schedule's real order of operations, on
ranks that may share CPU cores (docs/pipeline.md, "Performance model").

The closed forms of :mod:`neo.pipeline.perf_model` are the papers' (one number per stage, equal
micro-batches, a rank always has its own device). This replays the order each schedule actually
runs instead:

- **orders** (:func:`orders`): per rank, its actions in execution order: GPipe (every forward,
  then every backward) and 1F1B (``S - s`` forwards, then backward/forward pairs) as
  ``torch.distributed.pipelining`` runs them for one chunk per rank; interleaved 1F1B and zero
  bubble from torch's own schedule classes (their ``pipeline_order``, built for stand-in stages:
  the order is a function of S, v and M only); Chimera from :func:`neo.pipeline.chimera.chimera_order`.
- **dependencies**: a forward of chunk k waits for the forward of chunk k - 1 of its
  micro-batch, and a backward (or zero bubble's input pass) of chunk k for the backward (input
  pass) of chunk k + 1, plus the transfer's one-way latency (``comm_ms[k]`` of the boundary after
  chunk k) between the two; a weight pass follows its input pass. A rank runs its actions in
  order, each as soon as its inputs have arrived and the previous one is done.
- **cores** (processor sharing): with ``cores > 0``, the ranks that are computing at a moment
  share the cores evenly: each runs at ``min(1, cores / (threads_per_rank * running))`` of its
  own speed, so a rank that waits for a transfer leaves its core to the others. With
  ``cores = 0`` every rank has a device of its own.

An action costs its chunk's profiled time (forward, backward, or zero bubble's input and weight
passes) plus ``op_ms``, the runtime's own cost per action. Transfers are waiting, not compute.
The result is the time from the first action to the last (the pipelined part of a step) and
the bubble: the share of the ranks' time not spent in their chunks' compute.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from neo.pipeline.perf_model import Prediction, _times, allreduce_ms, fastest, per_rank

__all__ = ["Action", "ChunkCosts", "Replay", "COST_FIELDS", "orders", "replay", "chunk_costs_of", "chunk_costs",
           "predict_replayed", "best_replayed"]

COST_FIELDS = ("fwd_ms", "bwd_ms", "input_grad_ms", "weight_grad_ms")
"""A chunk's times, as :class:`neo.pipeline.profile.ChunkProfile` names them."""


class Action(NamedTuple):
    """One operation of one micro-batch on one chunk."""

    kind: str
    """``F`` forward, ``B`` full backward, ``I`` input-gradient pass, ``W`` weight-gradient pass."""
    chunk: int
    """Index of the chunk in its pipeline (0 .. C - 1)."""
    micro: int
    pipe: int = 0
    """Which pipeline (Chimera's down 0 and up 1; 0 otherwise)."""


@dataclass(frozen=True)
class ChunkCosts:
    """Per chunk of the split, one micro-batch's times, ms (:func:`neo.pipeline.profile.profile_chunks`)."""

    fwd_ms: Sequence[float]
    bwd_ms: Sequence[float]
    input_grad_ms: Optional[Sequence[float]] = None
    """Zero bubble's input pass (default: half the backward; 0 on the first chunk)."""
    weight_grad_ms: Optional[Sequence[float]] = None
    """Zero bubble's weight pass (default: the rest of the backward)."""

    def of(self, kind: str, chunk: int) -> float:
        if kind == "F":
            return float(self.fwd_ms[chunk])
        if kind == "B":
            return float(self.bwd_ms[chunk])
        b = float(self.bwd_ms[chunk])
        i = (0.0 if chunk == 0 else b / 2) if self.input_grad_ms is None else float(self.input_grad_ms[chunk])
        w = b - i if self.weight_grad_ms is None else float(self.weight_grad_ms[chunk])
        return i if kind == "I" else w


@dataclass(frozen=True)
class Replay:
    """The replayed pipelined part of one step."""

    pipeline_ms: float
    """From the first action's start to the last action's end."""
    bubble_fraction: float
    """``1 - compute / (ranks x pipeline_ms)``, compute = the wall time the ranks spent in their
    chunks' compute (stretched where they share cores; ``op_ms`` not counted)."""
    busy_ms: List[float]
    """Per rank, that compute time."""


# ----------------------------------------------------------------------------- orders
def _single_orders(schedule: str, S: int, M: int) -> List[List[Action]]:
    out = []
    for s in range(S):
        if schedule == "gpipe":
            out.append([Action("F", s, m) for m in range(M)] + [Action("B", s, m) for m in range(M)])
            continue
        warm = min(M, S - s)                     # torch's Schedule1F1B: S - s forwards, then B/F pairs
        acts = [Action("F", s, m) for m in range(warm)]
        f = warm
        for b in range(M):
            acts.append(Action("B", s, b))
            if f < M:
                acts.append(Action("F", s, f))
                f += 1
        out.append(acts)
    return out


def _torch_orders(schedule: str, S: int, v: int, M: int) -> List[List[Action]]:
    """torch's own order for S ranks of v chunks each (chunk k on rank k mod S), from its
    schedule class built over stand-ins for the stages (the order depends on S, v and M only)."""
    import torch
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

    cls = ScheduleInterleaved1F1B if schedule == "interleaved_1f1b" else ScheduleInterleavedZeroBubble
    C = S * v
    stand_ins = [types.SimpleNamespace(num_stages=C, group_size=S, group_rank=0, stage_index=k * S, is_first=k == 0,
                                       is_last=k * S == C - 1, submod=torch.nn.Identity()) for k in range(v)]
    order = cls(stand_ins, M, loss_fn=lambda out, target: out).pipeline_order
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    out = []
    for r in range(S):
        acts = []
        for a in order[r]:
            if a is None:
                continue
            kind = kinds.get(getattr(a.computation_type, "name", str(a.computation_type)))
            if kind is not None:
                acts.append(Action(kind, int(a.stage_index), int(a.microbatch_index)))
        out.append(acts)
    return out


def _chimera_orders(S: int, M: int) -> List[List[Action]]:
    from neo.pipeline.chimera import chimera_order

    return [[Action(op.kind, op.stage, op.micro, op.direction) for op in ops] for ops in chimera_order(S, M)[0]]


def orders(schedule: str, stages: int, micro_batches: int, virtual_stages: int = 1) -> List[List[Action]]:
    """Per rank, its actions in the order ``schedule`` runs them (module docstring)."""
    S, M, v = int(stages), int(micro_batches), int(virtual_stages)
    if schedule in ("gpipe", "1f1b"):
        return _single_orders(schedule, S, M)
    if schedule in ("interleaved_1f1b", "zero_bubble"):
        return _torch_orders(schedule, S, v, M)
    if schedule == "chimera":
        return _chimera_orders(S, M)
    raise ValueError(f"schedule: no order for {schedule!r}")


# ----------------------------------------------------------------------------- replay
def _upstream(a: Action, chunks: int, split: bool) -> Optional[Action]:
    """The action whose output ``a`` receives from another chunk (None: none)."""
    if a.kind == "F":
        return Action("F", a.chunk - 1, a.micro, a.pipe) if a.chunk > 0 else None
    if a.kind in ("B", "I") and a.chunk < chunks - 1:
        return Action("I" if split else "B", a.chunk + 1, a.micro, a.pipe)
    return None


def replay(rank_orders: Sequence[Sequence[Action]], costs: ChunkCosts, comm_ms: Sequence[float] = (),
           op_ms: float = 0.0, cores: float = 0.0, threads_per_rank: int = 1) -> Replay:
    """Replays ``rank_orders`` (:func:`orders`) with ``costs``; ``comm_ms[k]``: one-way latency of
    the boundary after chunk k; ``cores``: the ranks' shared CPU cores (0: a device each)."""
    R = len(rank_orders)
    C = len(costs.fwd_ms)
    split = any(a.kind in ("I", "W") for acts in rank_orders for a in acts)
    lat = [float(x) for x in comm_ms] + [0.0] * max(0, C - len(comm_ms))
    done: Dict[Action, float] = {}
    nxt = [0] * R                               # index of each rank's next action
    left = [0.0] * R                            # work left of its running action (ms at full speed)
    share = [0.0] * R                           # of which compute (not op_ms), for the busy time
    running = [False] * R
    start = [0.0] * R
    busy = [0.0] * R
    now, total = 0.0, sum(len(a) for a in rank_orders)
    threads = max(1, int(threads_per_rank))

    def ready_at(r: int) -> float:
        a = rank_orders[r][nxt[r]]
        up = _upstream(a, C, split)
        if up is None:
            return now
        if up not in done:
            return math.inf
        k = min(a.chunk, up.chunk)              # the boundary between the two chunks
        return done[up] + lat[k]

    finished = 0
    while finished < total:
        wake = math.inf
        for r in range(R):                      # start what can start now
            if not running[r] and nxt[r] < len(rank_orders[r]):
                t = ready_at(r)
                if t <= now + 1e-12:
                    a = rank_orders[r][nxt[r]]
                    c = costs.of(a.kind, a.chunk)
                    left[r], share[r], running[r], start[r] = c + op_ms, c, True, now
                else:
                    wake = min(wake, t)
        n = sum(running)
        if n == 0:
            if math.isinf(wake):
                stuck = {r: rank_orders[r][nxt[r]] for r in range(R) if nxt[r] < len(rank_orders[r])}
                raise ValueError(f"replay: the orders deadlock (waiting: {stuck})")
            now = wake
            continue
        rate = 1.0 if cores <= 0 else min(1.0, cores / (threads * n))
        dt = min(min(left[r] for r in range(R) if running[r]) / rate, wake - now)
        now += dt
        for r in range(R):
            if running[r]:
                left[r] -= dt * rate
                if left[r] <= 1e-9:
                    a = rank_orders[r][nxt[r]]
                    done[a] = now
                    c = share[r] + op_ms
                    busy[r] += (now - start[r]) * (share[r] / c if c > 0 else 0.0)
                    running[r] = False
                    nxt[r] += 1
                    finished += 1
    bubble = 1.0 - sum(busy) / (R * now) if now > 0 else 0.0
    return Replay(now, max(0.0, bubble), busy)


def chunk_costs_of(fwd: Sequence[float], bwd: Sequence[float], input_grad: Optional[Sequence[float]] = None,
                   weight_grad: Optional[Sequence[float]] = None) -> ChunkCosts:
    """:class:`ChunkCosts` with each list checked: finite, >= 0, one value per chunk."""
    n = len(fwd)
    lists = (fwd, bwd, input_grad, weight_grad)
    return ChunkCosts(*(None if xs is None else _times(name, xs, n, per="chunk")
                        for name, xs in zip(COST_FIELDS, lists)))


def chunk_costs(profiles: Sequence[object]) -> ChunkCosts:
    """:func:`chunk_costs_of` the chunks' profiles (:class:`neo.pipeline.profile.ChunkProfile`, or
    anything with its :data:`COST_FIELDS`)."""
    return chunk_costs_of(*([getattr(p, name) for p in profiles] for name in COST_FIELDS))


def predict_replayed(schedule: str, costs: ChunkCosts, micro_batches: int, stages: int, virtual_stages: int = 1,
                     comm_ms: Sequence[float] = (), op_ms: float = 0.0, cores: float = 0.0,
                     threads_per_rank: int = 1, replicas: int = 1,
                     chunk_param_bytes: Optional[Sequence[float]] = None,
                     bandwidth_gbps: Optional[float] = None) -> Prediction:
    """One schedule's step (:class:`neo.pipeline.perf_model.Prediction`) by :func:`replay`: the
    pipelined part replayed, plus the gradient AllReduce after the flush as the closed form
    charges it. ``costs``: per chunk (chunk k on rank k mod ``stages``; Chimera: one chunk per
    stage, each rank holding two); ``comm_ms``: per boundary between chunks; ``replicas``: R
    copies of the pipeline, whose S R ranks share the ``cores``."""
    S, R = int(stages), max(1, int(replicas))
    v = int(virtual_stages) if schedule in ("interleaved_1f1b", "zero_bubble") else 1
    rep = replay(orders(schedule, S, micro_batches, v), costs, comm_ms, op_ms, cores / R if cores > 0 else 0.0,
                 threads_per_rank)
    p = [0.0] * len(costs.fwd_ms) if chunk_param_bytes is None else [float(x) for x in chunk_param_bytes]
    if schedule == "chimera":   # worker w holds stage w down and stage S-1-w up: mirrored pairs over 2 R holders
        sync = max(allreduce_ms(p[s] + p[S - 1 - s], 2 * R, bandwidth_gbps) for s in range(S)) if S > 1 else 0.0
    else:
        sync = max(allreduce_ms(x, R, bandwidth_gbps) for x in per_rank(p, S))
    return Prediction(rep.pipeline_ms + sync, rep.bubble_fraction, rep.pipeline_ms, sync)


def best_replayed(candidates: Sequence[str], costs: ChunkCosts, micro_batches: int, stages: int,
                  virtual_stages: int = 1, **kwargs) -> Tuple[str, Prediction]:
    """The fastest of ``candidates`` by :func:`predict_replayed` (ties as
    :func:`neo.pipeline.perf_model.fastest` breaks them); ``kwargs`` go to it."""
    if not candidates:
        raise ValueError("schedule: no candidate to choose from")
    return fastest({name: predict_replayed(name, costs, micro_batches, stages, virtual_stages, **kwargs)
                    for name in candidates})
