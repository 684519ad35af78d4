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
at the same point of every rank's backward. Attached while a scaler is set on a collection of more
than one rank (its ``grad_scaler`` setter); set the scaler on every rank alike, as the
collection's other settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from neo.embedding.loss_scale import report_overflow

if TYPE_CHECKING:
    from neo.distributed.sharded_embedding import ShardedEmbeddingCollection

__all__ = ["OverflowConsensus"]


class OverflowConsensus:
    """The anchor's post-accumulate-grad hook: the ranks agree on whether this backward overflowed."""

    def __init__(self, collection: "ShardedEmbeddingCollection"):
        self.collection = collection
        self.seen = collection.skipped_updates
        """This rank's skips at the last agreement: what grew since is this backward's."""
        self.agreed = 0
        """Backwards in which some rank skipped (every rank counts the same)."""
        self._handle = collection.autograd_anchor.register_post_accumulate_grad_hook(self)

    def detach(self) -> None:
        """The hook off the anchor (another scaler, or none, was set)."""
        self._handle.remove()

    def __call__(self, anchor: torch.Tensor) -> None:
        scaler = self.collection.grad_scaler
        if scaler is None or not scaler.is_enabled():
            return
        now = self.collection.skipped_updates
        # (1,) where the tables live: the world group's backend takes it there (gloo on the CPU, NCCL on GPUs)
        flag = torch.tensor([1 if now > self.seen else 0], dtype=torch.int32, device=anchor.device)
        self.seen = now
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.collection.pg.world)
        if int(flag) > 0:
            self.agreed += 1
            report_overflow(self, scaler, anchor.device)
