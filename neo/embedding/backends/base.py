"""The interface every embedding backend implements.

A backend computes, for one :class:`~neo.embedding.layout.GroupLayout`:

- ``forward``: the pooled embeddings ``(B, total_dim)`` (fp32) of all the group's features
  in one pass over the flat ids;
- ``backward_update``: given the gradient of those pooled embeddings, the fused backward
  and sparse optimizer step: every id's gradient is gathered, duplicates of a row are
  summed exactly (sorted or hashed by global row), and the optimizer is applied to each
  touched row in place. No dense gradient of the weights is ever formed;
- optionally ``per_sample_weights_grad`` (same arguments as the function it replaces): the
  gradient of the per-id weights, (N,) fp32 (the cpu backend's kernel); without it the
  module uses :func:`neo.embedding.backends.reference.per_sample_weights_grad`.
- optionally, counting the invalid ids it skips, one of: ``counts_invalid_ids = True`` and
  ``last_invalid_count``, the number the last ``forward`` met (cpu); or
  ``counts_invalid_per_feature = True`` and a ``forward(..., invalid_counts=)`` keyword, an
  (F,) int32 device tensor it adds each feature's count into, read by the module without a
  host synchronisation per call (triton; :class:`neo.embedding.invalid_ids.InvalidIds`). The
  module then skips its own pass of torch operations over the ids on good input.

Inputs shared by both (F features of the group, B samples, N ids):

- ``indices``: (N,) int64, ids local to each feature's table, feature-major;
- ``offsets``: (F * B + 1,) int64, bag boundaries (see :mod:`neo.sparse`);
- ``per_sample_weights``: optional (N,) fp32, multiplies each id's row.

Ids outside ``[0, rows)`` have normally been rejected by the module before the call
(naming feature and table). When the module runs unchecked, a backend must still never
read or write out of bounds: an invalid id contributes zero and receives no update.

Stochastic rounding of fp16/bf16 weights draws its uniform number from
:func:`neo.embedding.backends.reference.sr_uniform` keyed by (seed, step, flat element
index), so every backend rounds the same element the same way: results match bit for bit.
"""

from __future__ import annotations

from typing import List, Optional, Protocol

import torch

from neo.embedding.layout import GroupLayout


class EmbeddingBackend(Protocol):
    name: str

    def forward(
        self,
        layout: GroupLayout,
        weights: torch.Tensor,                       # (sum rows * D,) fp32/fp16/bf16
        indices: torch.Tensor,                       # (N,) int64
        offsets: torch.Tensor,                       # (F * B + 1,) int64
        per_sample_weights: Optional[torch.Tensor],  # (N,) fp32 or None
        batch_size: int,
    ) -> torch.Tensor:                               # (B, total_dim) fp32
        ...

    def backward_update(
        self,
        layout: GroupLayout,
        weights: torch.Tensor,                       # updated in place
        states: List[torch.Tensor],                  # optimizer state, fp32, updated in place
        grad_output: torch.Tensor,                   # (B, total_dim) fp32
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor],
        batch_size: int,
        lr: float,
        step: int,                                   # 1-based count of updates of this group
        seed: int,
    ) -> None:
        ...
