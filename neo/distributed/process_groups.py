"""The explicit process-group object of the sharded runtime (no module-level globals).

Ranks are node-major: ``rank = node * local_world_size + local_rank``. With W = 4 ranks on
2 nodes of L = 2::

    world  = [0, 1, 2, 3]
    intra  = [0, 1] on node 0, [2, 3] on node 1        (ranks of one node)
    cross  = [0, 2] for local rank 0, [1, 3] for local rank 1   (same local rank, every node)
    dense  = [0, 1, 2, 3]: a second world group, used only by DistributedDataParallel
    checkpoint = [0, 1, 2, 3]: a gloo world group for checkpoints written in the background

``dense`` keeps DDP's gradient AllReduces off the group the embedding collectives use, so
their (separately ordered) issue sequences never interleave on one group; ``checkpoint`` does
the same for the collectives of a checkpoint saved by a background thread
(``torch.distributed.checkpoint.async_save``) while training goes on.

The embedding collectives take :class:`CommGroup` handles (``world_comm``, ``intra_comm``,
``cross_comm``): the torch group plus, where all of its ranks share one host, a
:class:`~neo.distributed.shm.ShmExchange` that carries its AlltoAlls and AllGathers through
shared memory instead of gloo's sockets (``build(shm=False)`` turns it off).

Launch (one process per rank): ``torch.distributed.init_process_group("gloo", timeout=...)``
first (torchrun or :mod:`tests.multiprocess` do it), then ``ProcessGroups.build(L)``.
"""

from __future__ import annotations

import datetime
import gc
import pickle
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch.distributed as dist

from neo.distributed.shm import ShmExchange

__all__ = ["ProcessGroups", "CommGroup", "end_process_groups", "on_rank0"]


@dataclass(eq=False)
class CommGroup:
    """A torch process group and, if its ranks share one host, its shared-memory exchange."""

    group: Any
    """The torch.distributed group (control, and every collective the exchange does not carry)."""
    shm: Optional[ShmExchange] = None
    """Carries the group's AlltoAll and AllGather payloads when set (CPU tensors only)."""

    @classmethod
    def build(cls, group: Any, shm: bool, timeout: Optional[datetime.timedelta]) -> "CommGroup":
        """Collective over ``group``: with ``shm``, try a shared-memory exchange (None across hosts)."""
        use = shm and dist.get_world_size(group) > 1 and dist.get_backend(group) == "gloo"
        ex = ShmExchange.create(group, timeout) if use else None
        if use and ex is None and dist.get_rank(group) == 0:
            warnings.warn("neo: the ranks of a process group cannot share /dev/shm (other hosts, another "
                          "namespace, or under 256 MiB free there): its AlltoAlls go through gloo", RuntimeWarning)
        return cls(group, ex)


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
    checkpoint: Any = None
    """All ranks, gloo: the collectives of background checkpoint saves (default: ``world``)."""
    timeout: Optional[datetime.timedelta] = None
    """Timeout of the sub-groups' collectives (the world group's is init_process_group's)."""
    world_comm: Optional[CommGroup] = None
    """``world`` for the embedding collectives (default: without shared memory)."""
    intra_comm: Optional[CommGroup] = None
    """``intra`` for the embedding collectives."""
    cross_comm: Optional[CommGroup] = None
    """``cross`` for the embedding collectives."""
    dense_comm: Optional[CommGroup] = None
    """``dense`` with its shared-memory exchange: DDP's gradient AllReduce (:mod:`.ddp_hook`)."""

    def __post_init__(self) -> None:
        self.checkpoint = self.checkpoint if self.checkpoint is not None else self.world
        self.world_comm = self.world_comm or CommGroup(self.world)
        self.intra_comm = self.intra_comm or CommGroup(self.intra)
        self.cross_comm = self.cross_comm or CommGroup(self.cross)
        self.dense_comm = self.dense_comm or CommGroup(self.dense)

    @property
    def uses_shm(self) -> bool:
        """Whether the world group's AlltoAlls travel through shared memory."""
        return self.world_comm.shm is not None

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
              backend: Optional[str] = None, shm: bool = True) -> "ProcessGroups":
        """Create the sub-groups; every rank must call this, in the same order as its other groups.

        Args:
            local_world_size: ranks per node (default: W, one node).
            timeout: collective timeout of the new groups (default: the world group's, i.e.
                ``init_process_group(timeout=...)``; ``train.collective_timeout_s`` in training).
            backend: backend of the new groups (default: the world group's).
            shm: carry the AlltoAlls and AllGathers of every gloo group whose ranks share a
                host through shared memory (:mod:`neo.distributed.shm`).
        """
        if not dist.is_initialized():
            raise RuntimeError("ProcessGroups.build: call torch.distributed.init_process_group first")
        W, rank = dist.get_world_size(), dist.get_rank()
        L = W if local_world_size is None else int(local_world_size)
        if L <= 0 or W % L:
            raise ValueError(f"ProcessGroups: world_size {W} is not a multiple of local_world_size {L}")
        nodes = W // L
        timeout = timeout or _default_timeout()      # new_group's own default would be gloo's 30 minutes
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
        checkpoint = dist.new_group(list(range(W)), timeout=timeout, backend="gloo")
        world = dist.group.WORLD
        return cls(rank=rank, world_size=W, local_world_size=L, world=world, intra=intra, cross=cross, dense=dense,
                   checkpoint=checkpoint, timeout=timeout, world_comm=CommGroup.build(world, shm, timeout),
                   intra_comm=CommGroup.build(intra, shm, timeout), cross_comm=CommGroup.build(cross, shm, timeout),
                   dense_comm=CommGroup.build(dense, shm, timeout))


def on_rank0(fn: Callable[[], Any], pg) -> Any:
    """``fn()`` run on rank 0 alone; its result on every rank, or its exception raised on every
    rank (the others would otherwise wait for a result in the broadcast, or in the next
    collective, that never comes)."""
    payload: List[Any] = [None]
    if pg.rank == 0:
        try:
            payload = [(True, fn())]
        except Exception as e:
            if pg.world_size > 1:
                dist.broadcast_object_list([(False, _picklable_error(e))], src=0, group=pg.world)
            raise
    if pg.world_size > 1:
        dist.broadcast_object_list(payload, src=0, group=pg.world)
    ok, value = payload[0]
    if not ok:
        raise value
    return value


def _picklable_error(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (broadcast_object_list), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(e).__name__} on rank 0: {e}")


def _default_timeout() -> datetime.timedelta:
    """The world group's collective timeout (init_process_group's ``timeout``), else gloo's default."""
    try:
        import torch

        return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # noqa: BLE001 - private attribute of the gloo backend
        return datetime.timedelta(minutes=30)


def end_process_groups() -> None:
    """Destroy every process group and free them now, while the interpreter is whole.

    ``destroy_process_group`` unregisters the groups, but their C++ objects (and gloo's worker
    and transport threads, 10 and 5 of them in ``neo train`` at 2 ranks) live as long as Python
    holds them: a trainer holds its groups in reference cycles (modules, DDP, closures), so they
    used to die during interpreter finalization, where gloo's threads still running and work
    objects holding tensors can end the process in ``std::terminate`` ("terminate called without
    an active exception", SIGABRT: about 1 run in 20 of this repository's benchmarks on 2 cores).
    Callers drop their own references first (``del trainer``); the collection here frees the
    cycles, and the groups' destructors join their threads."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
