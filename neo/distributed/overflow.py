"""One loss-scale decision for every rank of a ShardedEmbeddingCollection under ``GradScaler``.

A fused update whose gradient overflows is skipped and counted on the rank that holds the shard
(:mod:`neo.embedding.loss_scale`); the other ranks never see it. Reported there alone, the
overflow would lower that rank's scale only, and DDP would then average dense gradients scaled
differently; not reported at all, the scale stayed where it was and the overflowing table skipped
every step after (2026-12-05: six steps at ``2**24``, six skips on the owner, the scale unchanged
on both ranks). So, once per backward, each rank offers whether its lookups skipped since the
last time, the ranks take the MAX (one AllReduce of one number over the collection's world
group), and where any rank skipped every rank reports the overflow to its scaler: the scales go
down together, as GradScaler lowers them for an overflowed dense gradient.

"Once per backward" is the collection's ``autograd_anchor``: every lookup's backward (pooled and
sequence, on every rank, a rank without shards included) gives it a gradient, so its
post-accumulate-grad hook runs once per ``backward()``, after every fused update of that backward,
at the same point of every rank's backward. Installed only while an enabled scaler is set and the
collection has more than one rank; set the scaler on every rank alike, as the collection's other
settings.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from neo.embedding.loss_scale import report_overflow

__all__ = ["OverflowConsensus"]


class OverflowConsensus:
    """The anchor's post-accumulate-grad hook: the ranks agree on whether this backward overflowed."""

    def __init__(self, group: Any, skips: Callable[[], int], scaler: Callable[[], Optional[torch.amp.GradScaler]]):
        self.group = group
        """The collection's world group (the one its embedding collectives use, in program order)."""
        self.skips = skips
        """This rank's skipped fused updates so far (a counter that only grows)."""
        self.scaler = scaler
        """The scaler set on the collection now."""
        self.seen = skips()
        """``skips()`` at the last agreement: what grew since is this backward's."""
        self.agreed = 0
        """Backwards in which some rank skipped (every rank counts the same)."""

    def __call__(self, anchor: torch.Tensor) -> None:
        scaler = self.scaler()
        if scaler is None or not scaler.is_enabled():
            return
        now = self.skips()
        # (1,) where the tables live: the world group's backend takes it there (gloo on the CPU, NCCL on GPUs)
        flag = torch.tensor([1 if now > self.seen else 0], dtype=torch.int32, device=anchor.device)
        self.seen = now
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if int(flag) > 0:
            self.agreed += 1
            report_overflow(self, scaler, anchor.device)
