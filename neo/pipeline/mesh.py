"""Which rank holds which pipeline stage, where a rank's samples enter and leave, and the groups.

W ranks, S stages per pipeline, R = W / S data-parallel replicas of the pipeline, v model
chunks per rank (``virtual_stages``). Ranks are replica-major, so that the S ranks of one
pipeline are neighbours (on one node where S divides the ranks per node)::

    rank = replica * S + position              position: the rank's place in its pipeline

Worked example, W = 4, S = 2, v = 1 (2 replicas)::

    replica group 0 = [0, 1]    replica group 1 = [2, 3]     (PipelineStage p2p, sample routing)
    chunk 0 (first layers) on ranks 0, 2; chunk 1 (last layers) on ranks 1, 3
    gradient sync: chunk 0 over [0, 2], chunk 1 over [1, 3]

Chunks: ``C = S v``; chunk k runs on position ``k mod S`` (torch's loop placement, which
``ScheduleInterleaved1F1B`` expects). Chimera (v = 1, S even) holds two chunks per position:
chunk p of the *down* pipeline and chunk S-1-p of the *up* pipeline, whose stage s lives on
position S-1-s; the gradient of chunk s is summed over its 2R holders (positions s and S-1-s
of every replica), one group per mirrored pair.

Routing (the hybrid data flow, docs/pipeline.md "Execution"): every rank looks up the
embeddings of its own B samples; its pooled rows and dense features go to the position that
runs the first chunk of their direction (the *entry*), its labels to the one that runs the
last chunk (the *exit*). One pipeline direction: entry 0, exit S-1 for every position.
Chimera: positions 0 .. S/2-1 feed the down pipeline (entry 0, exit S-1), positions
S/2 .. S-1 the up one (entry S-1, exit 0).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist

__all__ = ["PipelineMesh", "PipelineGroups", "DOWN", "UP"]

DOWN, UP = 0, 1
"""Pipeline directions (UP only in Chimera)."""


@dataclass(frozen=True)
class PipelineMesh:
    """Pure data: the placement of stages and samples (module docstring). No process group."""

    world_size: int
    stages: int
    """S, ranks per pipeline replica."""
    virtual_stages: int = 1
    """v, model chunks per rank and direction."""
    bidirectional: bool = False
    """Chimera: a down and an up pipeline over the same S ranks."""

    def __post_init__(self) -> None:
        if self.stages < 1 or self.world_size % self.stages:
            raise ValueError(f"world size {self.world_size} is not a multiple of {self.stages} stages")
        if self.bidirectional and (self.stages % 2 or self.virtual_stages != 1):
            raise ValueError("a bidirectional (Chimera) pipeline needs an even number of stages and one chunk each")

    @property
    def replicas(self) -> int:
        return self.world_size // self.stages

    @property
    def chunks(self) -> int:
        """C, model chunks of one pipeline direction."""
        return self.stages * self.virtual_stages

    def replica(self, rank: int) -> int:
        return rank // self.stages

    def position(self, rank: int) -> int:
        return rank % self.stages

    def replica_ranks(self, replica: int) -> List[int]:
        return [replica * self.stages + p for p in range(self.stages)]

    def chunks_on(self, position: int) -> List[Tuple[int, int]]:
        """``(direction, chunk)`` of every chunk a position runs, in forward order of its direction."""
        S = self.stages
        if self.bidirectional:
            return [(DOWN, position), (UP, S - 1 - position)]
        return [(DOWN, k) for k in range(self.chunks) if k % S == position]

    def chunk_position(self, direction: int, chunk: int) -> int:
        """The position that runs ``chunk`` of ``direction``."""
        return (self.stages - 1 - chunk) if direction == UP else chunk % self.stages

    def direction_of(self, position: int) -> int:
        """The pipeline direction a position's own samples take."""
        return UP if self.bidirectional and position >= self.stages // 2 else DOWN

    def entry(self, position: int) -> int:
        """The position that receives this position's pooled rows and dense features."""
        return self.chunk_position(self.direction_of(position), 0)

    def exit(self, position: int) -> int:
        """The position that receives this position's labels (it computes their loss)."""
        return self.chunk_position(self.direction_of(position), self.chunks - 1)

    def sources(self, position: int, direction: int) -> List[int]:
        """Positions whose samples ``direction``'s first chunk on ``position`` receives, in order."""
        return [p for p in range(self.stages) if self.direction_of(p) == direction and self.entry(p) == position]

    def label_sources(self, position: int, direction: int) -> List[int]:
        """Positions whose labels ``direction``'s last chunk on ``position`` receives, in order."""
        return [p for p in range(self.stages) if self.direction_of(p) == direction and self.exit(p) == position]

    def sync_groups(self) -> List[List[int]]:
        """Ranks that hold copies of the same chunks and sum their gradients, one list per group."""
        S, R = self.stages, self.replicas
        if self.bidirectional:
            return [sorted(r * S + p for r in range(R) for p in (q, S - 1 - q)) for q in range(S // 2)]
        return [[r * S + p for r in range(R)] for p in range(S)]

    def sync_group_index(self, rank: int) -> int:
        p = self.position(rank)
        return min(p, self.stages - 1 - p) if self.bidirectional else p


@dataclass
class PipelineGroups:
    """This rank's process groups of a :class:`PipelineMesh` (every rank builds all, in order)."""

    mesh: PipelineMesh
    rank: int
    replica: Any
    """The S ranks of this rank's pipeline: stage-to-stage activations and gradients."""
    route: Any
    """The same S ranks, a second group: pooled rows, dense features, labels and their gradients."""
    sync: Any
    """The ranks holding copies of this rank's chunks: their gradient AllReduce (None if alone)."""

    @property
    def position(self) -> int:
        return self.mesh.position(self.rank)

    def global_rank(self, position: int) -> int:
        """Global rank of ``position`` in this rank's pipeline replica."""
        return self.mesh.replica(self.rank) * self.mesh.stages + position

    @classmethod
    def build(cls, mesh: PipelineMesh, timeout: Optional[datetime.timedelta] = None) -> "PipelineGroups":
        """Create the groups (collective over the world: every rank calls it at the same point)."""
        rank = dist.get_rank()
        if dist.get_world_size() != mesh.world_size:
            raise ValueError(f"PipelineGroups: mesh for {mesh.world_size} ranks, world has {dist.get_world_size()}")
        kw: Dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        mine = mesh.replica(rank)
        replica = route = sync = None
        for r in range(mesh.replicas):
            g = dist.new_group(mesh.replica_ranks(r), **kw)
            h = dist.new_group(mesh.replica_ranks(r), **kw)
            if r == mine:
                replica, route = g, h
        for k, ranks in enumerate(mesh.sync_groups()):
            g = dist.new_group(ranks, **kw) if len(ranks) > 1 else None
            if k == mesh.sync_group_index(rank):
                sync = g
        return cls(mesh, rank, replica, route, sync)
