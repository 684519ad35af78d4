"""Samples to the pipeline and gradients back: the hybrid data flow's point-to-point part.

Every rank looks up the embeddings of its own B samples through the sharded collection (the
embedding collectives run over all W ranks, as without a pipeline). Within one pipeline
replica, :meth:`SampleRouter.send` then moves each position's rows to where the pipeline needs
them (:class:`~neo.pipeline.mesh.PipelineMesh` says where)::

    position j:  [dense_j | pooled_j]  (B, num_dense + F D)  --p2p-->  entry(j)  (first chunk)
                 labels_j              (B,)                  --p2p-->  exit(j)   (last chunk: the loss)

The entry concatenates its sources in position order into the replica's batch (S B samples,
or S B / 2 per direction in Chimera) and makes the pooled part a leaf that requires grad:
the schedule splits it into micro-batches, and autograd accumulates the first chunk's input
gradient into it. :meth:`SampleRouter.grads` sends each source its rows of that gradient
back; the rank then runs the sharded collection's backward (its gradient AlltoAlls and fused
optimizer updates) exactly as without a pipeline.

The dense features travel with the pooled rows (one message per source) because the bottom
MLP is in the first chunk. Messages go over the ``route`` group of
:class:`~neo.pipeline.mesh.PipelineGroups`, not the group the stages use, so that they never
interleave with the schedule's own point-to-point traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from neo.pipeline.mesh import DOWN, UP, PipelineGroups

__all__ = ["Routed", "SampleRouter"]

_TAG_INPUTS, _TAG_LABELS, _TAG_GRADS = 11, 12, 13


@dataclass
class Routed:
    """What one rank holds of its pipeline replica's batch after :meth:`SampleRouter.send`."""

    inputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """direction -> (dense (n, num_dense), pooled leaf (n, F D) requiring grad): on the entry."""
    labels: Dict[int, torch.Tensor] = field(default_factory=dict)
    """direction -> labels (n,): on the exit."""
    sources: Dict[int, List[int]] = field(default_factory=dict)
    """direction -> the positions the entry's rows came from, in order (B rows each)."""


class SampleRouter:
    """Moves pooled rows, dense features and labels within a pipeline replica (module docstring)."""

    def __init__(self, groups: PipelineGroups):
        self.groups = groups
        self.mesh = groups.mesh
        self.position = groups.position
        self._directions = (DOWN, UP) if self.mesh.bidirectional else (DOWN,)

    def _peer(self, position: int) -> int:
        return self.groups.global_rank(position)

    def send(self, dense: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor) -> Routed:
        """Route this rank's ``dense (B, n)``, ``pooled (B, F D)`` (detached here) and ``labels (B,)``."""
        m, p, g = self.mesh, self.position, self.groups.route
        B = pooled.shape[0]
        rows = torch.cat([dense.to(pooled.dtype), pooled.detach()], dim=1)              # (B, n + F D)
        works, recv_rows, recv_labels = [], {}, {}
        for d in self._directions:
            for j in m.sources(p, d):
                if j != p:
                    recv_rows[j] = rows.new_empty(rows.shape)
                    works.append(dist.irecv(recv_rows[j], src=self._peer(j), group=g, tag=_TAG_INPUTS))
            for j in m.label_sources(p, d):
                if j != p:
                    recv_labels[j] = labels.new_empty(labels.shape)
                    works.append(dist.irecv(recv_labels[j], src=self._peer(j), group=g, tag=_TAG_LABELS))
        if m.entry(p) != p:
            works.append(dist.isend(rows, dst=self._peer(m.entry(p)), group=g, tag=_TAG_INPUTS))
        if m.exit(p) != p:
            labels = labels.contiguous()
            works.append(dist.isend(labels, dst=self._peer(m.exit(p)), group=g, tag=_TAG_LABELS))
        for w in works:
            w.wait()
        recv_rows[p], recv_labels[p] = rows, labels
        out = Routed()
        n_dense = dense.shape[1]
        for d in self._directions:
            src = m.sources(p, d)
            if src:
                cat = torch.cat([recv_rows[j] for j in src])                              # (len(src) B, n + F D)
                out.inputs[d] = (cat[:, :n_dense].contiguous(), cat[:, n_dense:].contiguous().requires_grad_())
                out.sources[d] = src
            lsrc = m.label_sources(p, d)
            if lsrc:
                out.labels[d] = torch.cat([recv_labels[j] for j in lsrc])                 # (len(lsrc) B,)
        assert all(t.shape[0] == B * len(out.sources[d]) for d, (_, t) in out.inputs.items())
        return out

    def grads(self, routed: Routed, like: torch.Tensor) -> torch.Tensor:
        """The gradient of this rank's pooled rows (shape of ``like``, (B, F D)), from its entry."""
        m, p, g = self.mesh, self.position, self.groups.route
        B = like.shape[0]
        works, mine = [], None
        sends = []
        for d, (_, leaf) in routed.inputs.items():
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            for k, j in enumerate(routed.sources[d]):
                piece = grad[k * B:(k + 1) * B]
                if j == p:
                    mine = piece
                else:
                    sends.append((piece.contiguous(), j))
        if m.entry(p) != p:
            mine = like.new_empty(like.shape)
            works.append(dist.irecv(mine, src=self._peer(m.entry(p)), group=g, tag=_TAG_GRADS))
        for piece, j in sends:
            works.append(dist.isend(piece, dst=self._peer(j), group=g, tag=_TAG_GRADS))
        for w in works:
            w.wait()
        assert mine is not None
        return mine
