"""Pipeline stages: this rank's model chunks, timed, and the loss the last chunk computes.

A *chunk* is a contiguous run of the dense layers (:class:`neo.pipeline.layers.LayerStack`,
cut by ``parallel.pipeline.split``); a rank runs ``virtual_stages`` of them (two in Chimera,
one per direction). Every rank builds the whole dense model from the same seed, so the
chunks start identical to single-process training's layers; a rank then trains only its own.

:class:`TimedStage` is torch's :class:`~torch.distributed.pipelining.PipelineStage` with its
compute timed: ``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk``
add their wall time to a :class:`BusyMeter`. Those methods run the stage's module and autograd
only (the schedule posts and waits the point-to-point transfers around them), so the meter
reads a rank's busy time, and ``1 - busy / (S x step time)`` the measured bubble.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage

__all__ = ["BusyMeter", "TimedStage", "ContiguousOutputs", "ReplicaLoss", "chunk_output_meta", "ChunkMeta"]


class BusyMeter:
    """Wall seconds a rank spends computing its chunks (forward, backward), summed; and the CPU
    seconds of its thread in them (``cpu_seconds``: without the waits for a core where ranks
    outnumber the cores)."""

    def __init__(self) -> None:
        self.seconds = self.cpu_seconds = 0.0

    @contextmanager
    def __call__(self):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0
            self.cpu_seconds += time.thread_time() - c0

    def reset(self) -> None:
        self.seconds = self.cpu_seconds = 0.0


class TimedStage(PipelineStage):
    """A :class:`PipelineStage` whose forward and backward compute is timed into ``meter``."""

    def __init__(self, *args, meter: BusyMeter, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = meter

    def forward_one_chunk(self, *args, **kwargs):
        with self.meter():
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        with self.meter():
            return super().backward_one_chunk(*args, **kwargs)

    def backward_weight_one_chunk(self, *args, **kwargs):
        with self.meter():
            return super().backward_weight_one_chunk(*args, **kwargs)


class _ContiguousGrad(torch.autograd.Function):
    """A copy whose backward makes the gradient contiguous. A copy, not a view: zero-bubble's
    split backward detaches stage outputs in place, which a passed-through view would forbid."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class ContiguousOutputs(nn.Module):
    """A chunk whose output tensors and input gradients are contiguous: point-to-point
    transfers need it, and a column slice, a passed-through input or the gradient of a
    concatenation (DCNv2's x0) may not be. Same parameters as the chunk.

    Outputs are copies: torch's zero-bubble schedules detach a stage's outputs in place after
    the input-gradient pass, and an output the chunk itself saved for backward (DCNv2's x0,
    used by every cross layer's product) would break their weight-gradient pass. The copy is
    one memcpy of the boundary activations per micro-batch."""

    def __init__(self, chunk: nn.Module):
        super().__init__()
        self.chunk = chunk

    def forward(self, *acts: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        acts = tuple(_ContiguousGrad.apply(a) if a.requires_grad else a for a in acts)
        return tuple(_ContiguousGrad.apply(a) if a.requires_grad else a.contiguous() for a in self.chunk(*acts))


class ReplicaLoss(nn.Module):
    """``loss_fn(output, labels)`` of the last chunk: BCE-with-logits summed over the micro-batch,
    divided by the pipeline replica's whole batch (``replica_batch`` samples).

    The micro-batches' losses then add up to the replica batch's mean loss, and so do their
    gradients: the schedules run with ``scale_grads=False``, and the gradient of the pooled
    input that goes back to the embeddings is exact without rescaling by the micro-batch
    count (torch's ``scale_grads`` divides parameter gradients only)."""

    def __init__(self, replica_batch: int):
        super().__init__()
        self.replica_batch = replica_batch

    def forward(self, output, labels: torch.Tensor) -> torch.Tensor:
        logits = output[0] if isinstance(output, (tuple, list)) else output          # (b,)
        return F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum") / self.replica_batch


@torch.no_grad()
def chunk_output_meta(chunks: Sequence[nn.Module], dense: torch.Tensor,
                      pooled: torch.Tensor) -> List[List[Tuple[torch.Size, torch.dtype]]]:
    """(shape, dtype) of every output tensor of every chunk for one micro-batch: what each
    boundary sends forward (and its gradient back). Runs the whole dense model once on
    ``dense (b, n)``, ``pooled (b, F D)`` (zeros will do), without autograd."""
    acts: Tuple[torch.Tensor, ...] = (dense, pooled)
    out = []
    for chunk in chunks:
        acts = chunk(*acts)
        out.append([(a.shape, a.dtype) for a in acts])
    return out


class ChunkMeta:
    """:func:`chunk_output_meta` of ``chunks`` at a micro-batch shape, computed once per shape:
    ``meta(micro_batch, num_dense, pooled_width, dtype)``."""

    def __init__(self, chunks: Sequence[nn.Module]):
        self.chunks = chunks
        self._key: Optional[tuple] = None
        self._meta: List[List[Tuple[torch.Size, torch.dtype]]] = []

    def __call__(self, micro_batch: int, num_dense: int, pooled_width: int,
                 dtype: torch.dtype) -> List[List[Tuple[torch.Size, torch.dtype]]]:
        key = (micro_batch, num_dense, pooled_width, dtype)
        if self._key != key:
            self._meta = chunk_output_meta(self.chunks, torch.zeros(micro_batch, num_dense, dtype=dtype),
                                           torch.zeros(micro_batch, pooled_width, dtype=dtype))
            self._key = key
        return self._meta
