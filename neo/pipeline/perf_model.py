"""Step time and bubble of each pipeline schedule, from per-stage times (docs/pipeline.md, "Performance model").

Inputs are per micro-batch: stage s's forward ``f_s`` and backward ``b_s`` (ms; profile the layers
at the micro-batch size), the one-way transfer time ``c_s`` of the boundary after stage s
(activation forward, the same bytes of gradient back; ``c_{S-1} = 0``). Transfers block the stage
that sends (gloo on CPU), as in the partitioner: stage s is busy ``F_s = f_s + c_s`` per forward,
``B_s = b_s + c_s`` per backward, ``t_s = F_s + B_s`` per micro-batch (= ``Partition.stage_ms``
at the micro-batch size). S stages, M micro-batches per step and pipeline, R data-parallel
replicas of the whole pipeline. With equal stages (``t_s = t``) every formula is the paper's:

    gpipe             sum_s t_s + (M - 1)(max_s F_s + max_s B_s)      bubble (S-1)/(M+S-1)
    1f1b              sum_s t_s + (M - 1) max_s t_s                   bubble (S-1)/(M+S-1)
    interleaved_1f1b  M max t' + (sum t' - max t') / v                bubble (S-1)/(vM+S-1)
    zero_bubble       M t_k + sum_{s != k} (t_s - 2 W_s)              bubble time (S-1)(T_F+T_B-T_W)
    chimera           M max u + (S-2)/(2(S-1)) (sum u - max u)        bubble (S-2)/(2M+S-2)
    data_parallel     (M / S) sum_s (f_s + b_s)                       no bubble

GPipe: Huang et al., NeurIPS 2019. 1F1B: PipeDream-Flush, Narayanan et al., ICML 2021.
Interleaved 1F1B: Narayanan et al., SC 2021 (Megatron-LM), section 2.2.2. Zero bubble: ZB-H1,
Qi et al., ICLR 2024, section 2.1. Chimera: Li & Hoefler, SC 2021, Table 1.

- GPipe runs all forwards, then all backwards: each phase is a flow shop of identical jobs, whose
  makespan is the sum of the stage times plus (M - 1) times the slowest; exact under this model.
- 1F1B (one forward, one backward in the steady state) moves at the rate of the slowest stage's
  ``t``; fill and drain cost the other stages once (``sum - max``; (S-1) t for equal stages).
- Interleaved 1F1B: v model chunks per rank divide fill and drain by v (bubble (p-1)/v of the
  ideal, Megatron's eq.); each micro-batch crosses S v - 1 boundaries, so a rank sends v times
  (the last rank v - 1): ``t'_s = f_s + b_s + 2 v c_mean`` with c_mean the mean boundary transfer.
- Zero bubble: the backward splits into input gradient ``B`` and weight gradient ``W`` (default
  ``W_s = b_s / 2``: a Linear's dX and dW are the same FLOPs); W fills the drain. ZB-H1's bubble
  is ``(p-1)(T_F + T_B - T_W)`` against 1F1B's ``(p-1)(T_F + T_B + T_W)`` (with T_B the input
  gradient only): here the fill and drain of the non-slowest stages, each ``t_s - 2 W_s``,
  clamped at 0; k is the slowest stage. torch's ``ScheduleZBVZeroBubble`` (ZB-V, 2 chunks) can do
  better (no bubble when F = B = W): this is the bound of the memory-equal schedule.
- Chimera: two 1F1B pipelines in opposite directions, M / 2 micro-batches each (M and S even);
  worker w holds stage w of the down pipeline and stage S-1-w of the up one, so it is busy
  ``u_w = (t_w + t_{S-1-w}) / 2`` per micro-batch on average. The paper's bubble ratio
  (D-2)/(2N+D-2), N the micro-batches of a worker per iteration (here M), assumes forward =
  backward; its fill and drain are (S-2)/(2(S-1)) of 1F1B's, which is what is scaled here.

Two costs no layer profile shows. The runtime's work per schedule action (one forward or
backward of one micro-batch on one chunk: the schedule's bookkeeping, the fixed cost of each
send and receive), ``op_ms``, is added to the stage's time of every action (:data:`ACTIONS`;
``tools/bench_pipeline.py`` measures it by running each schedule on a null model, the same
layers and split with next to no arithmetic). And on a CPU host whose cores the ranks outnumber,
they take turns: the pipelined part lasts at least the devices' compute (``M sum_s (f_s + b_s)``
per pipeline, times the threads of a rank, over R replicas) over the ``cores``; transfers are
waiting, not compute.

Gradient synchronisation after the flush, not overlapped (ring AllReduce: ``2 (n-1)/n * bytes /
bandwidth``): pipelines, each stage's parameters over its R replicas (the slowest stage's
group); Chimera, each worker's two stages over 2 R holders (the mirrored copies); data
parallel, every parameter over S R ranks. ``bubble_fraction`` is the idle share of the devices
during the pipelined part: ``1 - busy / (S * pipeline_ms)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from neo.pipeline.partition import Partition, Profile

__all__ = ["SCHEDULES", "PIPELINE_SCHEDULES", "ACTIONS", "Prediction", "StageTimes", "predict", "best_schedule",
           "resolve_schedule", "stage_times", "allreduce_ms", "per_rank", "fastest"]

PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "zero_bubble", "chimera")
"""The config's ``parallel.pipeline.schedule`` values (besides ``auto``), in tie-breaking order."""
SCHEDULES = PIPELINE_SCHEDULES + ("data_parallel",)


@dataclass(frozen=True)
class Prediction:
    """One schedule's predicted step."""

    step_ms: float
    """Pipelined part plus the exposed gradient AllReduce, ms."""
    bubble_fraction: float
    """Idle share of the devices during the pipelined part (0 for data parallel)."""
    pipeline_ms: float = 0.0
    """The pipelined part (forwards, backwards, transfers), ms."""
    sync_ms: float = 0.0
    """Gradient AllReduce after the flush, ms."""


@dataclass(frozen=True)
class StageTimes:
    """Per-stage inputs of :func:`predict`, from a profile and a partition (:func:`stage_times`)."""

    fwd_ms: List[float]
    bwd_ms: List[float]
    comm_ms: List[float]
    """One-way transfer of each boundary (S - 1 values)."""
    param_bytes: List[int]


def _shared(busy_ms: float, replicas: int, cores: int, threads_per_rank: int) -> float:
    """Wall time of ``busy_ms`` of one pipeline's work (every replica doing as much) on ``cores``
    shared cores: 0 where there is no such bound."""
    if cores <= 0:
        return 0.0
    return busy_ms * replicas * max(1, threads_per_rank) / cores


def per_rank(per_chunk: Sequence[float], stages: int) -> List[float]:
    """Each of ``stages`` ranks' sum over its chunks' values (chunk k runs on rank k mod ``stages``)."""
    return [float(sum(per_chunk[p::stages])) for p in range(stages)]


def allreduce_ms(nbytes: float, ranks: int, bandwidth_gbps: Optional[float]) -> float:
    """Ring AllReduce of ``nbytes`` over ``ranks``: ``2 (n-1)/n * bytes / bandwidth`` ms (0 for one rank)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if bandwidth_gbps is None or not bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps: a gradient AllReduce over {ranks} ranks needs a bandwidth > 0, "
                         f"got {bandwidth_gbps!r}")
    return 2 * (ranks - 1) / ranks * nbytes / (bandwidth_gbps * 1e6)


def _times(name: str, values: Sequence[float], n: int, per: str = "stage") -> List[float]:
    vals = [float(v) for v in values]
    if len(vals) != n:
        raise ValueError(f"{name}: needs {n} values (one per {per}), got {len(vals)}")
    for k, v in enumerate(vals):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}[{k}]: must be a finite number >= 0, got {v!r}")
    return vals


def _positive_int(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
    return v


ACTIONS = {"gpipe": (1, 1), "1f1b": (1, 1), "interleaved_1f1b": (1, 1), "zero_bubble": (1, 2), "chimera": (1, 1)}
"""Schedule actions per micro-batch and chunk, (forward, backward): zero bubble splits the
backward into the input gradient and the weight gradient."""


def predict(schedule: str, stage_fwd_ms: Sequence[float], stage_bwd_ms: Sequence[float], micro_batches: int,
            comm_ms: Union[float, Sequence[float]] = 0.0, virtual_stages: int = 2, replicas: int = 1,
            stage_wgrad_ms: Optional[Sequence[float]] = None, stage_input_grad_ms: Optional[Sequence[float]] = None,
            stage_param_bytes: Optional[Sequence[float]] = None,
            bandwidth_gbps: Optional[float] = None, op_ms: float = 0.0, cores: int = 0,
            threads_per_rank: int = 1) -> Prediction:
    """Predicted step of ``schedule`` (one of :data:`SCHEDULES`; module docstring for the formulas).

    Args:
        schedule: ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``zero_bubble``, ``chimera`` or ``data_parallel``.
        stage_fwd_ms, stage_bwd_ms: per stage, one micro-batch's forward and full backward, ms.
        micro_batches: M per step and pipeline (Chimera: split M / 2 per direction, M even).
        comm_ms: one-way transfer per micro-batch of each of the S - 1 boundaries (or one value for all), ms.
        virtual_stages: v, model chunks per rank (``interleaved_1f1b`` only).
        replicas: R, data-parallel copies of the whole pipeline (the devices are S R).
        stage_wgrad_ms: per stage, the weight-gradient part of the backward (``zero_bubble``;
            default half the backward).
        stage_input_grad_ms: per stage, zero bubble's input-gradient pass as measured
            (:func:`neo.pipeline.profile.profile_chunks`); with it, zero bubble's backward is the
            two passes, ``stage_input_grad_ms + stage_wgrad_ms`` (torch's split costs more than one
            backward), and the other schedules keep ``stage_bwd_ms``.
        stage_param_bytes, bandwidth_gbps: per-stage parameter bytes and the AllReduce bandwidth
            (GB/s) for the gradient synchronisation; without them it costs 0.
        op_ms: the runtime's cost of one schedule action (one forward or backward of one
            micro-batch on one chunk: the schedule's bookkeeping, its sends' and receives' fixed
            costs), on the stage that runs it; :data:`ACTIONS` per micro-batch.
        cores, threads_per_rank: a CPU host's cores for the S R ranks: where the ranks' threads
            outnumber them, they take turns and the step lasts at least the ranks' busy time
            (times their threads) over the cores (0: no such bound).
    """
    S = len(stage_fwd_ms)
    if S < 1:
        raise ValueError("stage_fwd_ms: needs at least one stage")
    f = _times("stage_fwd_ms", stage_fwd_ms, S)
    b = _times("stage_bwd_ms", stage_bwd_ms, S)
    M = _positive_int("micro_batches", micro_batches)
    v = _positive_int("virtual_stages", virtual_stages)
    R = _positive_int("replicas", replicas)
    if isinstance(comm_ms, (int, float)):
        c = [float(comm_ms)] * (S - 1)
    else:
        c = [float(x) for x in comm_ms]
    c = _times("comm_ms", c, S - 1) + [0.0] if S > 1 else [0.0]
    w = [x / 2 for x in b] if stage_wgrad_ms is None else _times("stage_wgrad_ms", stage_wgrad_ms, S)
    if stage_input_grad_ms is None:
        for k in range(S):
            if w[k] > b[k] + 1e-12:
                raise ValueError(f"stage_wgrad_ms[{k}]: {w[k]} exceeds the stage's backward {b[k]}")
    elif stage_wgrad_ms is None:
        raise ValueError("stage_input_grad_ms: needs stage_wgrad_ms (the weight pass) beside it")
    elif schedule == "zero_bubble":                         # the two passes as measured
        b = [i + x for i, x in zip(_times("stage_input_grad_ms", stage_input_grad_ms, S), w)]
    p = [0.0] * S if stage_param_bytes is None else _times("stage_param_bytes", stage_param_bytes, S)
    if not (math.isfinite(op_ms) and op_ms >= 0):
        raise ValueError(f"op_ms: must be a finite number >= 0, got {op_ms!r}")
    if schedule in ACTIONS:
        af, ab = ACTIONS[schedule]
        v_ = v if schedule == "interleaved_1f1b" else 1
        f = [x + v_ * af * op_ms for x in f]
        b = [x + v_ * ab * op_ms for x in b]
        w = [x + (op_ms if schedule == "zero_bubble" else 0.0) for x in w]

    # with more ranks than cores: the stages' compute over the cores (transfers are waiting)
    shared = _shared(M * sum(f[s] + b[s] for s in range(S)), R, cores, threads_per_rank)
    F = [f[s] + c[s] for s in range(S)]
    B = [b[s] + c[s] for s in range(S)]
    t = [F[s] + B[s] for s in range(S)]
    k = max(range(S), key=lambda s: t[s])                  # the slowest stage
    if schedule == "gpipe":
        pipe = sum(t) + (M - 1) * (max(F) + max(B))
        busy = M * sum(t)
    elif schedule == "1f1b":
        pipe = sum(t) + (M - 1) * t[k]
        busy = M * sum(t)
    elif schedule == "interleaved_1f1b":
        cbar = sum(c[:S - 1]) / (S - 1) if S > 1 else 0.0
        ti = [f[s] + b[s] + 2 * (v if s < S - 1 else v - 1) * cbar for s in range(S)]
        pipe = M * max(ti) + (sum(ti) - max(ti)) / v
        busy = M * sum(ti)
    elif schedule == "zero_bubble":
        fill = sum(t[s] - 2 * w[s] for s in range(S)) - (t[k] - 2 * w[k])
        pipe = M * t[k] + max(0.0, fill)
        busy = M * sum(t)
    elif schedule == "chimera":
        if S % 2 or M % 2:
            raise ValueError(f"chimera: needs an even number of stages and micro-batches, got S={S}, M={M}")
        u = [(t[s] + t[S - 1 - s]) / 2 for s in range(S)]
        pipe = M * max(u) + (S - 2) / (2 * (S - 1)) * (sum(u) - max(u)) if S > 1 else M * u[0]
        busy = M * sum(u)
    elif schedule == "data_parallel":
        pipe = max(M / S * sum(f[s] + b[s] for s in range(S)), shared)
        sync = allreduce_ms(sum(p), S * R, bandwidth_gbps)
        return Prediction(pipe + sync, 0.0, pipe, sync)
    else:
        raise ValueError(f"schedule: must be one of {list(SCHEDULES)}, got {schedule!r}")
    pipe = max(pipe, shared)
    if schedule == "chimera":
        sync = max(allreduce_ms(p[s] + p[S - 1 - s], 2 * R, bandwidth_gbps) for s in range(S)) if S > 1 else 0.0
    else:
        sync = max(allreduce_ms(p[s], R, bandwidth_gbps) for s in range(S))
    bubble = 1.0 - busy / (S * pipe) if pipe > 0 else 0.0
    return Prediction(pipe + sync, max(0.0, bubble), pipe, sync)


def best_schedule(stage_fwd_ms: Sequence[float], stage_bwd_ms: Sequence[float], micro_batches: int,
                  candidates: Sequence[str] = PIPELINE_SCHEDULES, **kwargs) -> Tuple[str, Prediction]:
    """The fastest of ``candidates`` (ties: the earlier in :data:`PIPELINE_SCHEDULES`, the simpler);
    a schedule the shape rules out (Chimera with odd S or M) is skipped. ``kwargs`` go to :func:`predict`."""
    found: Dict[str, Prediction] = {}
    reasons = []
    for name in candidates:
        try:
            found[name] = predict(name, stage_fwd_ms, stage_bwd_ms, micro_batches, **kwargs)
        except ValueError as e:
            if not str(e).startswith(f"{name}:"):
                raise
            reasons.append(str(e))
    if not found:
        raise ValueError(f"schedule: no candidate fits ({'; '.join(reasons)})")
    return fastest(found)


def fastest(found: Dict[str, Prediction]) -> Tuple[str, Prediction]:
    """The schedule of ``found`` with the shortest step; ties (equal but for rounding) go to the
    earlier in :data:`SCHEDULES`, the simpler."""
    order = {n: k for k, n in enumerate(SCHEDULES)}
    best = min(p.step_ms for p in found.values())
    tied = [n for n in found if found[n].step_ms <= best * (1 + 1e-9)]
    name = min(tied, key=lambda n: order.get(n, len(order)))
    return name, found[name]


def resolve_schedule(schedule: str, stage_fwd_ms: Sequence[float], stage_bwd_ms: Sequence[float],
                     micro_batches: int, **kwargs) -> str:
    """``schedule`` itself, or for ``auto`` the :func:`best_schedule` of the pipeline schedules."""
    if schedule == "auto":
        return best_schedule(stage_fwd_ms, stage_bwd_ms, micro_batches, **kwargs)[0]
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"schedule: must be 'auto' or one of {list(PIPELINE_SCHEDULES)}, got {schedule!r}")
    return schedule


def stage_times(profile: Profile, part: Partition, bandwidth_gbps: Optional[float] = None,
                speeds: Optional[Sequence[float]] = None) -> StageTimes:
    """Per-stage forward, backward, boundary transfer (one way) and parameter bytes of a partition,
    the inputs of :func:`predict`. A stage with r replicas (``partition(devices=...)``) takes every
    r-th micro-batch, so its times are divided by r (an approximation for synchronous schedules)."""
    bw = profile.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    S = len(part.stages)
    sp = [1.0] * S if speeds is None else [float(x) for x in speeds]
    fwd, bwd, comm, params = [], [], [], []
    for s, ((a, z), r) in enumerate(zip(part.stages, part.replicas)):
        layers = profile.layers[a:z + 1]
        fwd.append(sum(l.fwd_ms for l in layers) / sp[s] / r)
        bwd.append(sum(l.bwd_ms for l in layers) / sp[s] / r)
        params.append(sum(l.param_bytes for l in layers))
        if s < S - 1:
            if bw is None:
                raise ValueError("bandwidth_gbps: the profile has none; give one")
            comm.append(layers[-1].activation_bytes / (bw * 1e6) / r)
    return StageTimes(fwd, bwd, comm, params)
