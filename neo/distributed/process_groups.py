"""The explicit process-group object of the sharded runtime (no module-level globals).

Ranks are node-major: ``rank = node * local_world_size + local_rank``. With W = 4 ranks on
2 nodes of L = 2::

    world  = [0, 1, 2, 3]
    intra  = [0, 1] on node 0, [2, 3] on node 1        (ranks of one node)
    cross  = [0, 2] for local rank 0, [1, 3] for local rank 1   (same local rank, every node)
    dense  = [0, 1, 2, 3]: a second world group, used only by DistributedDataParallel

``dense`` keeps DDP's gradient AllReduces off the group the embedding collectives use, so
their (separately ordered) issue sequences never interleave on one group.

Launch (one process per rank): ``torch.distributed.init_process_group("gloo", timeout=...)``
first (torchrun or :mod:`tests.multiprocess` do it), then ``ProcessGroups.build(L)``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, List, Optional

import torch.distributed as dist

__all__ = ["ProcessGroups"]


@dataclass
class ProcessGroups:
    """Process groups of one rank: world, its node (intra), its peers on other nodes (cross)."""

    rank: int
    """This process's global rank."""
    world_size: int
    """W, ranks in all."""
    local_world_size: int
    """L, ranks per node; W must be a multiple of it."""
    world: Any
    """All ranks: input distribution, flat sharding types."""
    intra: Any
    """The L ranks of this rank's node: first stage of hierarchical sharding."""
    cross: Any
    """The W / L ranks with this rank's local index: second stage of hierarchical sharding."""
    dense: Any
    """All ranks, a separate group for DistributedDataParallel of the dense modules."""
    timeout: Optional[datetime.timedelta] = None
    """Timeout of the sub-groups' collectives (the world group's is init_process_group's)."""

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_world_size

    def node_ranks(self, node: int) -> List[int]:
        L = self.local_world_size
        return list(range(node * L, (node + 1) * L))

    @classmethod
    def build(cls, local_world_size: Optional[int] = None, timeout: Optional[datetime.timedelta] = None,
              backend: Optional[str] = None) -> "ProcessGroups":
        """Create the sub-groups; every rank must call this, in the same order as its other groups.

        Args:
            local_world_size: ranks per node (default: W, one node).
            timeout: collective timeout of the new groups (default: the world group's).
            backend: backend of the new groups (default: the world group's).
        """
        if not dist.is_initialized():
            raise RuntimeError("ProcessGroups.build: call torch.distributed.init_process_group first")
        W, rank = dist.get_world_size(), dist.get_rank()
        L = W if local_world_size is None else int(local_world_size)
        if L <= 0 or W % L:
            raise ValueError(f"ProcessGroups: world_size {W} is not a multiple of local_world_size {L}")
        nodes = W // L
        kw = dict(timeout=timeout, backend=backend)
        intra = cross = None
        # new_group is collective over the whole world: every rank creates every group, in order.
        for n in range(nodes):
            g = dist.new_group(list(range(n * L, (n + 1) * L)), **kw)
            if rank // L == n:
                intra = g
        for j in range(L):
            g = dist.new_group(list(range(j, W, L)), **kw)
            if rank % L == j:
                cross = g
        dense = dist.new_group(list(range(W)), **kw)
        return cls(rank=rank, world_size=W, local_world_size=L, world=dist.group.WORLD,
                   intra=intra, cross=cross, dense=dense, timeout=timeout)
