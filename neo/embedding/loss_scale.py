"""The fused update under a loss scaler (``torch.amp.GradScaler``: fp16 mixed precision).

``scaler.scale(loss).backward()`` makes every gradient ``S`` times too large; ``scaler.step(opt)``
divides the dense optimizers' gradients by ``S`` and skips their step when one is not finite. Neo's
tables are updated inside the backward, before the scaler is asked, so without this module the
updates were ``S`` times too large (1024x in the probe of 2026-12-04), and a step whose gradient
overflowed wrote inf or NaN into the rows. With ``emb.grad_scaler = scaler`` (a
:class:`~neo.embedding.TableBatchedEmbedding`, or a ``ShardedEmbeddingCollection``, which passes
it to its shards), each fused update first divides its gradient by the scaler's current scale
(exact for the power-of-two scales GradScaler uses, so the tables train to the bit as without the
scaler) and is skipped when the result holds inf or NaN, as the scaler skips the dense step; the
skip is counted (``skipped_updates``) and the group's step count stays. The decision is per fused
update (one group of tables in a pooled lookup, one ``sequence`` lookup).

A skip is also reported to the scaler (:func:`report_overflow`), so that its next ``update()``
lowers the scale as it does for an overflowed dense gradient. Before, an overflow that only the
tables' gradients reached left the scale where it was, and every later step skipped the tables
again while the dense parameters trained (2026-12-05: five steps at ``2**24``, five skips, the
scale unchanged). On a ``ShardedEmbeddingCollection`` of several ranks a rank does not report
alone (``reports_overflow`` False on its local module): only the ranks holding an overflowed
shard see the overflow, and a scale lowered on those alone would part the ranks' scales, so
that DDP's average of the dense gradients, each scaled by its own rank's scale, came out wrong.
There the collection's :class:`~neo.distributed.overflow.OverflowConsensus` takes, once per
backward, the MAX of the ranks' skips (one AllReduce of one number) and every rank reports
where any skipped: the scales go down together, as for an overflowed dense gradient. A rank's
overflow still skips only that rank's updates (as on one process, where the decision is per
fused update).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["record_overflow", "report_overflow", "unscaled_gradient"]


def unscaled_gradient(owner: "TableBatchedEmbedding", grad: torch.Tensor) -> Optional[torch.Tensor]:
    """``grad`` as the fused update takes it (contiguous fp32), divided by the loss scale of
    ``owner.grad_scaler`` where one is set and enabled; None where that leaves a non-finite value
    (the update is to be skipped, and counted in ``owner.skipped_updates`` by the caller)."""
    g = grad.contiguous().to(torch.float32)
    scaler = owner.grad_scaler
    if scaler is None or not scaler.is_enabled():
        return g
    g = g * (1.0 / scaler.get_scale())
    return g if bool(torch.isfinite(g).all()) else None


def record_overflow(owner: "TableBatchedEmbedding", device: torch.device) -> None:
    """Count a fused update skipped for an overflow in ``owner.skipped_updates`` and, where
    ``owner.reports_overflow``, report the overflow to ``owner.grad_scaler``
    (:func:`report_overflow`): its next ``update()`` then backs the scale off, as for a dense
    gradient's inf."""
    owner.skipped_updates += 1
    if owner.reports_overflow:
        report_overflow(owner, owner.grad_scaler, device)


def report_overflow(holder: object, scaler: Optional[torch.amp.GradScaler], device: torch.device) -> None:
    """Tell ``scaler`` (if set and enabled) that this step's gradients overflowed: its next
    ``update()`` lowers the scale. Reported through the scaler's public ``unscale_`` on an
    optimizer of one parameter whose gradient is inf, kept on ``holder`` (once per ``update()``:
    the scaler refuses a second ``unscale_`` of the same optimizer before it, which means the
    overflow is already recorded)."""
    if scaler is None or not scaler.is_enabled():
        return
    probe = getattr(holder, "_overflow_probe", None)
    if probe is None or probe.param_groups[0]["params"][0].device != device:
        probe = torch.optim.SGD([torch.zeros(1, device=device, requires_grad=True)], lr=0.0)
        holder._overflow_probe = probe          # an optimizer, not a module attribute that state_dict sees
    param = probe.param_groups[0]["params"][0]
    param.grad = torch.full_like(param, float("inf"))
    try:
        scaler.unscale_(probe)
    except RuntimeError as e:
        if "already been called" not in str(e):
            raise
