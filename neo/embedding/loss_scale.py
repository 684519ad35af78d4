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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from neo.embedding.module import TableBatchedEmbedding

__all__ = ["unscaled_gradient"]


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
