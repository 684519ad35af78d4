"""Asynchronous pipeline schedules: PipeDream's 1F1B with weight stashing, and PipeDream-2BW.

Both run 1F1B (one forward, one backward in the steady state; at most ``S - s`` micro-batches
in flight on stage s) over one chunk per rank, with plain point-to-point transfers as
:mod:`neo.pipeline.chimera` does, but without the synchronous schedules' rule that every
micro-batch of a step computes on the same weights.

``pipedream_async`` (Narayanan et al., "PipeDream", SOSP 2019, sections 3.3 and 3.4). PipeDream
has no micro-batches: each input it pipelines is a mini-batch, and a stage updates its weights as
soon as that input's backward is done on the stage (section 3.3, "1F1B"). Neo's micro-batch plays
PipeDream's mini-batch: stage s applies the optimizer after the backward of every micro-batch, on
that micro-batch's mean gradient (summed over the data-parallel copies of the stage, divided by
R). **Weight stashing** (section 3.4): a forward runs on the stage's latest version, and that
version is stashed with the micro-batch; its backward differentiates the stashed copy, not the
current weights, so the gradient is that of the function the forward computed. The stash holds
at most ``max_versions`` versions: a stage admits a new forward only while fewer than
``min(max_versions, S - s)`` micro-batches are in flight on it (each in-flight micro-batch pins
one version; ``max_versions`` defaults to S, 1F1B's own bound). With ``max_versions`` 1 every
backward follows its forward before the next forward: sequential SGD over micro-batches.

``pipedream_2bw`` (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML
2021, section 3.1). Gradients accumulate over the M micro-batches of a mini-batch (a step), and
one new weight version is generated per mini-batch; a stage keeps two buffers, the latest
version and the *shadow* one before it. Every micro-batch of mini-batch k computes (forward and
backward) on version k-1, the shadow, and the update it produces is applied to the latest:
``W(k+1) = W(k) - lr grad f(W(k-1))`` (the paper's update with delay term 1; W(-1) = W(0), so
mini-batch 0 and 1 both compute on version 0). At the end of mini-batch k the shadow becomes
W(k) (copied in place, before the optimizer makes W(k+1)): two buffers, never more.

What stays synchronous. The embeddings: every step routes the replica's pooled rows to the first
stage and their gradients back (:mod:`neo.pipeline.route`), and the sharded collection applies
its update once per step as with the synchronous schedules. So the pipeline drains at the end of
every step (the first stage's last backward produces the last rows of the pooled gradient), and
the asynchrony is within a step, across its micro-batches: pipedream_async has no flush between
micro-batches, and 2BW's delayed version is what lets PipeDream-2BW skip the flush between
mini-batches (here the embedding update forces one anyway). Carrying micro-batches across the
step boundary would need the embedding gradients one step late too: not done.

Version counters. A stage's version is the number of updates applied to its weights. Every stage
records, per micro-batch, the version its forward ran on, the version its backward
differentiated (weight stashing: always the same) and the version sequential training would have
used (pipedream_async: the micro-batch's global index, one update per micro-batch; 2BW: the
mini-batch index); *staleness* is the difference (at most ``min(max_versions, S) - 1``; 2BW: 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from neo.pipeline.mesh import DOWN, PipelineGroups
from neo.pipeline.route import Routed
from neo.pipeline.stages import BusyMeter, ChunkMeta, ContiguousOutputs, ReplicaLoss

__all__ = ["ASYNC_SCHEDULES", "VersionRecord", "async_1f1b_order", "AsyncPipeline"]

ASYNC_SCHEDULES = ("pipedream_async", "pipedream_2bw")
"""Schedule names this module runs."""


@dataclass(frozen=True)
class VersionRecord:
    """The weight versions one micro-batch used on one stage."""

    step: int
    micro: int
    stage: int
    forward_version: int
    backward_version: int
    sequential_version: int
    """The version sequential (unpipelined) training would have used."""

    @property
    def staleness(self) -> int:
        return self.sequential_version - self.forward_version


def async_1f1b_order(stage: int, stages: int, micro_batches: int, max_in_flight: int) -> List[Tuple[str, int]]:
    """Stage ``stage``'s ops, ``("F", m)`` or ``("B", m)``: a forward whenever fewer than
    ``min(max_in_flight, stages - stage)`` micro-batches are in flight, else the oldest backward.

    With ``max_in_flight >= stages`` this is 1F1B (``S - s - 1`` warm-up forwards, then
    alternating, then the cool-down backwards). The cap does not increase with the stage, so
    every receive waits on an op its peer has already scheduled: no deadlock
    (tests/pipeline/test_pipeline_async.py replays the orders)."""
    cap = max(1, min(max_in_flight, stages - stage))
    order: List[Tuple[str, int]] = []
    f = b = 0
    while b < micro_batches:
        if f < micro_batches and f - b < cap:
            order.append(("F", f))
            f += 1
        else:
            order.append(("B", b))
            b += 1
    return order


class _Version:
    """One stashed weight version of a chunk: leaf copies of its parameters."""

    def __init__(self, number: int, params: Dict[str, torch.Tensor]):
        self.number = number
        self.leaves = {n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in params.items()}

    @torch.no_grad()
    def load(self, number: int, params: Dict[str, torch.Tensor]) -> None:
        """Overwrite in place with ``params`` (2BW's shadow buffer becoming the next version)."""
        self.number = number
        for n, p in params.items():
            self.leaves[n].copy_(p)
            self.leaves[n].grad = None


class AsyncPipeline:
    """pipedream_async or pipedream_2bw over this rank's chunk (module docstring).

    Args:
        schedule: one of :data:`ASYNC_SCHEDULES`.
        chunks: every chunk of the split (S, one per rank); this rank runs chunk ``groups.position``.
        groups: the pipeline's process groups (transfers over ``groups.replica``, the
            per-micro-batch gradient AllReduce of pipedream_async over ``groups.sync``).
        micro_batches: M per step.
        loss: the last chunk's loss.
        meter: collects this rank's compute time.
        max_versions: pipedream_async's bound on stashed versions (None: S); 2BW keeps two.
    """

    def __init__(self, schedule: str, chunks: Sequence[nn.Module], groups: PipelineGroups, micro_batches: int,
                 loss: ReplicaLoss, meter: BusyMeter, max_versions: Optional[int] = None):
        if schedule not in ASYNC_SCHEDULES:
            raise ValueError(f"schedule: {schedule!r} is not one of {list(ASYNC_SCHEDULES)}")
        self.schedule = schedule
        self.chunks = [ContiguousOutputs(c) for c in chunks]
        self.groups, self.loss, self.meter = groups, loss, meter
        self.mesh = groups.mesh
        self.S, self.M = self.mesh.stages, micro_batches
        self.stage = groups.position
        self.chunk = self.chunks[self.stage]
        self.params = dict(self.chunk.named_parameters())
        self.max_versions = self.S if max_versions is None else int(max_versions)
        in_flight = self.max_versions if schedule == "pipedream_async" else self.S
        self.order = async_1f1b_order(self.stage, self.S, micro_batches, in_flight)
        self.updates_inside = schedule == "pipedream_async"
        """True: the driver applies the optimizer itself (``run`` needs it); False: the caller steps it."""
        self.version = 0
        """Updates applied to this stage's weights."""
        self.steps = 0
        self.log: List[VersionRecord] = []
        self.max_stashed = 0
        """The most versions this stage held at once (stashed copies in flight)."""
        self._latest: Optional[_Version] = None         # pipedream_async: the latest version's copy
        self._shadow: Optional[_Version] = None         # 2BW: version k-1
        self.meta = ChunkMeta(self.chunks)               # output shapes of every chunk, per micro-batch shape

    # ------------------------------------------------------------------ transfers
    def _peer(self, stage: int) -> int:
        return self.groups.global_rank(stage)

    def _tag(self, kind: str, micro: int, index: int) -> int:
        return 1000 + ("FB".index(kind) * self.M + micro) * 16 + index

    def _recv(self, meta, src: int, kind: str, micro: int) -> Tuple[torch.Tensor, ...]:
        bufs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in meta)
        works = [dist.irecv(b, src=src, group=self.groups.replica, tag=self._tag(kind, micro, i))
                 for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
        return bufs

    # ------------------------------------------------------------------ versions
    def _forward_version(self) -> _Version:
        if self.schedule == "pipedream_2bw":
            if self._shadow is None:                     # W(-1) = W(0)
                self._shadow = _Version(0, self.params)
            return self._shadow
        if self._latest is None or self._latest.number != self.version:
            self._latest = _Version(self.version, self.params)
        return self._latest

    def _sequential_version(self, micro: int) -> int:
        return self.steps * self.M + micro if self.schedule == "pipedream_async" else self.steps

    def _apply_update(self, stash: _Version, optimizer, scale: float) -> None:
        """pipedream_async: the micro-batch's gradient (on its stashed copy) -> the latest weights."""
        names = list(self.params)
        if names:                                        # none: a stage of parameterless layers
            grads = [stash.leaves[n].grad if stash.leaves[n].grad is not None else torch.zeros_like(self.params[n])
                     for n in names]
            flat = torch.cat([g.reshape(-1) for g in grads]) * scale
            if self.groups.sync is not None:             # its copies hold the same (no) parameters
                dist.all_reduce(flat, group=self.groups.sync)
                flat.div_(self.mesh.replicas)
            for n, g in zip(names, torch.split(flat, [g.numel() for g in grads])):
                self.params[n].grad = g.view_as(self.params[n])
                stash.leaves[n].grad = None
        optimizer.step()
        for p in self.params.values():
            p.grad = None
        self.version += 1

    # ------------------------------------------------------------------ one step
    def run(self, routed: Routed, micro_batch: int, num_dense: int, pooled_width: int,
            optimizer=None) -> torch.Tensor:
        """One step; the sum of this rank's micro-batch losses. pipedream_async updates this
        stage with ``optimizer`` after each micro-batch's backward; 2BW leaves the accumulated
        gradient (computed on version k-1) in the chunk parameters' ``.grad`` for the caller's
        optimizer step, which must follow (it makes version k+1)."""
        if self.updates_inside and optimizer is None:
            raise ValueError("pipedream_async applies the optimizer inside the schedule: pass optimizer")
        S, s = self.S, self.stage
        meta = self.meta(micro_batch, num_dense, pooled_width, torch.float32)
        if s == 0:
            dense, pooled = routed.inputs[DOWN]
            inputs = (dense.split(micro_batch), pooled.split(micro_batch))      # views: grads reach the leaf
        if s == S - 1:
            labels = routed.labels[DOWN].split(micro_batch)
        saved: Dict[int, Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...], _Version]] = {}
        forward_version: Dict[int, int] = {}
        sends: List[dist.Work] = []
        total = torch.zeros(())
        for kind, m in self.order:
            if kind == "F":
                if s == 0:
                    args: Tuple[torch.Tensor, ...] = (inputs[0][m], inputs[1][m])
                else:
                    args = self._recv(meta[s - 1], self._peer(s - 1), "F", m)
                    for a in args:
                        a.requires_grad_(a.is_floating_point())
                stash = self._forward_version()
                with self.meter():
                    out = functional_call(self.chunk, stash.leaves, args)
                    if s == S - 1:
                        out = (self.loss(out, labels[m]),)
                if s < S - 1:
                    sends += [dist.isend(o.detach(), dst=self._peer(s + 1), group=self.groups.replica,
                                         tag=self._tag("F", m, i)) for i, o in enumerate(out)]
                saved[m] = (args, out, stash)
                forward_version[m] = stash.number
                self.max_stashed = max(self.max_stashed, len({id(v) for _, _, v in saved.values()}))
            else:
                args, out, stash = saved.pop(m)
                if s == S - 1:
                    with self.meter():
                        out[0].backward()
                    total = total + out[0].detach()
                else:
                    grads = self._recv(meta[s], self._peer(s + 1), "B", m)
                    pairs = [(o, g) for o, g in zip(out, grads) if o.requires_grad]
                    with self.meter():
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                if s > 0:
                    for i, a in enumerate(args):
                        g = a.grad if a.grad is not None else torch.zeros_like(a)
                        sends.append(dist.isend(g, dst=self._peer(s - 1), group=self.groups.replica,
                                                tag=self._tag("B", m, i)))
                self.log.append(VersionRecord(self.steps, m, s, forward_version.pop(m), stash.number,
                                              self._sequential_version(m)))
                if self.updates_inside:                  # the micro-batch's mean gradient: x M
                    self._apply_update(stash, optimizer, float(self.M))
        if not self.updates_inside:
            self._finish_2bw()
        for w in sends:
            w.wait()
        self.steps += 1
        return total

    @torch.no_grad()
    def _finish_2bw(self) -> None:
        """The gradient accumulated on the shadow (version k-1) -> the latest weights' ``.grad``;
        the shadow becomes the latest, W(k), before the caller's optimizer makes W(k+1)."""
        assert self._shadow is not None
        for n, p in self.params.items():
            g = self._shadow.leaves[n].grad
            p.grad = g.clone() if g is not None else torch.zeros_like(p)
        self._shadow.load(self.steps, self.params)
        self.version = self.steps + 1                    # after the caller's optimizer step

    def version_log(self) -> List[dict]:
        """The version records as plain dicts (``staleness`` included)."""
        return [dict(asdict(r), staleness=r.staleness) for r in self.log]
