"""Chimera: two pipelines in opposite directions over the same ranks (Li and Hoefler, SC'21).

S stages (even), M micro-batches per step (even). The *down* pipeline runs stage s on
position s and takes micro-batches 0 .. M/2-1 (the samples of positions 0 .. S/2-1); the *up*
pipeline runs stage s on position S-1-s and takes the other half. Each position therefore
holds two chunks, stage p of the down pipeline and stage S-1-p of the up one, and the fill of
one pipeline overlaps the drain of the other (paper, section 3.2, Fig. 3). The two copies of
stage s (positions s and S-1-s) start equal and sum their gradients after the step (with every
other replica's copies, :meth:`neo.pipeline.mesh.PipelineMesh.sync_groups`), so they stay equal
and the update is single-process training's on the global batch.

The order of operations is computed, not hand-written: :func:`chimera_order` list-schedules
every forward and backward with unit costs (forward 1, backward 2), each position taking the
op that can start earliest (ties: forward first, then the lower micro-batch), with at most
S - s micro-batches in flight on stage s of each direction as in 1F1B (the activation memory
of Chimera's paper, about one 1F1B pipeline per direction). With S = 2 it has no bubble (the
paper's schedule: position 0 runs F(down) F(up) B(up) B(down) for M = 2); bubble fractions of
the unit schedule, against 1F1B's (S-1)/(M+S-1)::

    S, M    4, 4    4, 8    8, 8    8, 16
    chimera 0.250   0.143   0.333   0.200
    1f1b    0.429   0.273   0.467   0.304

(The paper's (S-2)/(2M+S-2), for forward = backward, is lower: 0.2 at S = M = 4; this greedy
order is not its hand-built one, and ties forward-first vs backward-first trade a few percent.)

Driver. torch's schedules drive ``PipelineStage`` objects of ONE pipeline per process group
(stage k on group rank ``k mod S``), and a stage's send/receive buffers are set up by
private methods the schedules call (``_prepare_forward_infra`` and ``_prepare_backward_infra``).
Two pipelines of opposite placement on the same ranks would need both, so this driver runs
the chunks with plain point-to-point transfers instead: a forward receives its input tuple
from the previous stage's position (shapes from :func:`~neo.pipeline.stages.chunk_output_meta`),
runs the chunk and posts the sends of its outputs; a backward receives the output gradients,
runs autograd and posts the input gradients back. Sends are asynchronous and receives block:
since every position executes its ops in the order of one feasible global schedule, no
receive waits on an op that waits on it (no deadlock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from neo.pipeline.mesh import DOWN, UP, PipelineGroups
from neo.pipeline.route import Routed
from neo.pipeline.stages import BusyMeter, ChunkMeta, ContiguousOutputs, ReplicaLoss

__all__ = ["Op", "chimera_order", "ChimeraPipeline"]


@dataclass(frozen=True)
class Op:
    """One forward (``F``) or backward (``B``) of one micro-batch on one stage of one direction."""

    kind: str
    direction: int
    micro: int
    """Micro-batch index within its direction (0 .. M/2 - 1)."""
    stage: int
    """Stage within its direction (0 .. S - 1)."""


def _position(S: int, direction: int, stage: int) -> int:
    return stage if direction == DOWN else S - 1 - stage


def chimera_order(stages: int, micro_batches: int, fwd_cost: float = 1.0,
                  bwd_cost: float = 2.0) -> Tuple[List[List[Op]], float]:
    """Per position, its ops in execution order; and the schedule's length in cost units.

    List scheduling (module docstring): repeatedly, of every position's ready ops, the one that
    can start earliest runs next. ``fwd_cost`` / ``bwd_cost``: relative times of a forward and a
    backward (the paper's unit schedule takes a backward as two forwards)."""
    S, half = stages, micro_batches // 2
    if S < 2 or S % 2 or micro_batches < 2 or micro_batches % 2:
        raise ValueError(f"chimera: needs an even number of stages and micro-batches, got S={S}, M={micro_batches}")
    finish: Dict[Op, float] = {}
    free = [0.0] * S
    in_flight = {(d, s): 0 for d in (DOWN, UP) for s in range(S)}
    todo = {Op(k, d, m, s) for k in "FB" for d in (DOWN, UP) for m in range(half) for s in range(S)}
    order: List[List[Op]] = [[] for _ in range(S)]

    def deps(op: Op) -> List[Op]:
        if op.kind == "F":
            return [Op("F", op.direction, op.micro, op.stage - 1)] if op.stage else []
        out = [Op("F", op.direction, op.micro, op.stage)]
        if op.stage < S - 1:
            out.append(Op("B", op.direction, op.micro, op.stage + 1))
        return out

    while todo:
        best: Optional[Tuple[float, int, int, int, Op]] = None
        for op in todo:
            if any(d not in finish for d in deps(op)):
                continue
            if op.kind == "F" and in_flight[(op.direction, op.stage)] >= S - op.stage:
                continue
            p = _position(S, op.direction, op.stage)
            start = max([free[p]] + [finish[d] for d in deps(op)])
            key = (start, 0 if op.kind == "F" else 1, op.micro, op.direction, op)
            if best is None or key[:4] < best[:4]:
                best = key
        assert best is not None, "chimera_order: no op can run (dependency cycle)"
        start, _, _, _, op = best
        p = _position(S, op.direction, op.stage)
        finish[op] = free[p] = start + (fwd_cost if op.kind == "F" else bwd_cost)
        in_flight[(op.direction, op.stage)] += 1 if op.kind == "F" else -1
        order[p].append(op)
        todo.remove(op)
    return order, max(free)


class ChimeraPipeline:
    """Runs :func:`chimera_order` on this rank's two chunks (module docstring).

    Args:
        chunks: every chunk of the split (S), in order; this position runs chunk p down and
            chunk S-1-p up.
        groups: the pipeline's process groups (transfers over ``groups.replica``).
        micro_batches: M per step (M / 2 per direction).
        loss: the last chunk's loss.
        meter: collects this rank's compute time.
    """

    def __init__(self, chunks: Sequence[nn.Module], groups: PipelineGroups, micro_batches: int, loss: ReplicaLoss,
                 meter: BusyMeter):
        self.chunks = [ContiguousOutputs(c) for c in chunks]
        self.groups, self.loss, self.meter = groups, loss, meter
        self.mesh = groups.mesh
        self.S, self.M = self.mesh.stages, micro_batches
        self.order = chimera_order(self.S, micro_batches)[0][groups.position]
        self.meta = ChunkMeta(self.chunks)               # output shapes of every chunk, per micro-batch shape

    def _peer(self, direction: int, stage: int) -> int:
        return self.groups.global_rank(_position(self.S, direction, stage))

    def _tag(self, kind: str, direction: int, micro: int, index: int) -> int:
        return ((("FB".index(kind) * 2 + direction) * self.M + micro) * 16 + index) + 100

    def run(self, routed: Routed, micro_batch: int, num_dense: int, pooled_width: int) -> torch.Tensor:
        """One step; the sum of this rank's micro-batch losses. ``micro_batch``: samples per
        micro-batch; ``num_dense``, ``pooled_width``: the first chunk's input widths."""
        S, group = self.S, self.groups.replica
        meta = self.meta(micro_batch, num_dense, pooled_width, torch.float32)
        inputs = {d: (dense.split(micro_batch), pooled.split(micro_batch))        # views: grads reach the leaf
                  for d, (dense, pooled) in routed.inputs.items()}
        labels = {d: y.split(micro_batch) for d, y in routed.labels.items()}
        saved: Dict[Tuple[int, int], Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]] = {}
        sends: List[dist.Work] = []
        total = torch.zeros(())
        for op in self.order:
            d, m, s = op.direction, op.micro, op.stage
            chunk = self.chunks[s]
            if op.kind == "F":
                if s == 0:
                    args: Tuple[torch.Tensor, ...] = (inputs[d][0][m], inputs[d][1][m])
                else:
                    args = self._recv(meta[s - 1], self._peer(d, s - 1), "F", d, m, group)
                    for a in args:
                        a.requires_grad_(a.is_floating_point())
                with self.meter():
                    out = chunk(*args)
                    if s == S - 1:
                        out = (self.loss(out, labels[d][m]),)
                if s < S - 1:
                    sends += [dist.isend(o.detach(), dst=self._peer(d, s + 1), group=group, tag=self._tag("F", d, m, i))
                              for i, o in enumerate(out)]
                saved[(d, m)] = (args, out)
            else:
                args, out = saved.pop((d, m))
                if s == S - 1:
                    with self.meter():
                        out[0].backward()
                    total = total + out[0].detach()
                else:
                    grads = self._recv(meta[s], self._peer(d, s + 1), "B", d, m, group)
                    pairs = [(o, g) for o, g in zip(out, grads) if o.requires_grad]
                    with self.meter():
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                if s > 0:
                    for i, a in enumerate(args):
                        g = a.grad if a.grad is not None else torch.zeros_like(a)
                        sends.append(dist.isend(g, dst=self._peer(d, s - 1), group=group, tag=self._tag("B", d, m, i)))
        for w in sends:
            w.wait()
        return total

    def _recv(self, meta, src: int, kind: str, direction: int, micro: int, group) -> Tuple[torch.Tensor, ...]:
        bufs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in meta)
        works = [dist.irecv(b, src=src, group=group, tag=self._tag(kind, direction, micro, i))
                 for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
        return bufs
