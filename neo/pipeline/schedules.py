"""The synchronous schedules of ``torch.distributed.pipelining`` over this rank's chunks.

====================  =================================  =======================================
``schedule``          torch class                        chunks per rank (``virtual_stages``)
====================  =================================  =======================================
``gpipe``             ScheduleGPipe                      1
``1f1b``              Schedule1F1B                       1
``interleaved_1f1b``  ScheduleInterleaved1F1B            2 or more
``zero_bubble``       ScheduleInterleavedZeroBubble      any (1: ZB-1P; input and weight
                                                         gradients split, weights fill bubbles)
``chimera``           neo.pipeline.chimera (Neo's own)   1 per direction
====================  =================================  =======================================

Every one is synchronous: a step runs all micro-batches' forwards and backwards and leaves
the summed gradients in ``.grad``, so after the replicas' gradient AllReduce the update equals
single-process training on the global batch (tests/pipeline/test_pipeline_equivalence.py).

A runner's ``run(routed)`` feeds the first chunk the routed ``(dense, pooled)`` of the replica
batch and the last chunk its labels (:mod:`neo.pipeline.route`), and returns the sum of the
micro-batch losses this rank computed (0 on ranks without the last chunk).
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble)

from neo.models.mlp import split_backward
from neo.pipeline.mesh import DOWN, PipelineGroups
from neo.pipeline.route import Routed
from neo.pipeline.stages import BusyMeter, ContiguousOutputs, ReplicaLoss, TimedStage

__all__ = ["TORCH_SCHEDULES", "TorchPipeline"]

TORCH_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
}
"""Schedule names of the config -> torch's schedule classes."""

_SINGLE = ("gpipe", "1f1b")


class TorchPipeline:
    """One of :data:`TORCH_SCHEDULES` over this rank's chunks of one pipeline replica.

    Args:
        schedule: a key of :data:`TORCH_SCHEDULES`.
        chunks: every chunk of the split, in order (this rank runs those ``groups.mesh`` assigns it).
        groups: the pipeline's process groups (stages talk over ``groups.replica``).
        micro_batches: M per step.
        loss: the last chunk's loss (:class:`~neo.pipeline.stages.ReplicaLoss`).
        meter: collects this rank's compute time.
    """

    def __init__(self, schedule: str, chunks: Sequence[nn.Module], groups: PipelineGroups, micro_batches: int,
                 loss: ReplicaLoss, meter: BusyMeter, device: torch.device = torch.device("cpu")):
        if schedule not in TORCH_SCHEDULES:
            raise ValueError(f"schedule: {schedule!r} is not one of {list(TORCH_SCHEDULES)}")
        mesh = groups.mesh
        self.mine = [k for _, k in mesh.chunks_on(groups.position)]
        C = mesh.chunks
        if schedule == "zero_bubble":          # the input and weight passes compute one gradient each
            for k in self.mine:
                split_backward(chunks[k])
        self.stages = [TimedStage(ContiguousOutputs(chunks[k]), k, C, device, group=groups.replica, meter=meter)
                       for k in self.mine]
        cls = TORCH_SCHEDULES[schedule]
        target = self.stages[0] if schedule in _SINGLE else self.stages
        self.schedule = cls(target, micro_batches, loss_fn=loss, scale_grads=False)
        self.has_first = 0 in self.mine
        self.has_last = (C - 1) in self.mine

    def run(self, routed: Routed) -> torch.Tensor:
        """One step over the replica batch; the sum of this rank's micro-batch losses."""
        args = routed.inputs[DOWN] if self.has_first else ()
        if self.has_last:
            losses: List[torch.Tensor] = []
            self.schedule.step(*args, target=routed.labels[DOWN], losses=losses)
            return torch.stack([l.detach() for l in losses]).sum()
        self.schedule.step(*args)
        return torch.zeros(())
