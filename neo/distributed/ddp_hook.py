"""DistributedDataParallel's gradient AllReduce through shared memory (ranks of one host).

DDP hands each gradient bucket to gloo's AllReduce by default: on one host that is a ring over
loopback TCP, about 0.4 ms for a 60 KB bucket at 2 ranks (sockets, gloo's threads) where the
data is a few microseconds of copying. When the dense group's ranks share a host,
:func:`register_shm_allreduce` replaces that with the group's shared-memory exchange
(:class:`neo.distributed.shm.ShmExchange`). At 2 ranks each rank adds the other's bucket to its
own, reading it in the other's shared segment; at more, rank r sums chunk r of every rank's
bucket, in rank order, and every rank gathers the W summed chunks (two AlltoAlls: a ring's
traffic, not W buckets a rank). Either way every rank holds the same sum. As DDP's own hook
does, each bucket is scaled by 1 / W first (the mean gradient). At 2 ranks the result is bit for
bit gloo's (one addition, commutative); at more ranks it is the same sum in another order
(rounding).

The exchange completes inside the hook (it progresses only while a rank waits on it), so a
bucket's reduction no longer overlaps the rest of the backward; on a CPU host whose ranks each
have one core that overlap only moved gloo's threads onto the same cores.
"""

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from neo.distributed.comms import sum_in_rank_order
from neo.distributed.shm import ShmExchange

__all__ = ["ShmAllReduce", "shm_allreduce_hook", "register_shm_allreduce", "mean_over_ranks_", "all_reduce_sum_"]


@dataclass
class ShmAllReduce:
    """The hook's state: the exchange, and a trace recorder once ``train.trace`` attaches one
    (:func:`neo.train.trace.trace_ddp`: each bucket's reduction a ``grad_sync`` span)."""

    exchange: ShmExchange
    recorder: Optional[Any] = None


def shm_allreduce_hook(state: ShmAllReduce, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over the exchange's ranks, in place. (No postponed
    annotations in this module: DDP checks this signature's annotations as objects.)"""
    ex = state.exchange
    grads = bucket.buffer()                                   # (n,) flat, this rank's gradients
    token = None
    if state.recorder is not None:
        token = state.recorder.begin("grad_sync", "grad_sync", bytes=grads.numel() * grads.element_size())
    mean_over_ranks_(ex, grads)
    if token is not None:
        state.recorder.end(token)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(grads)
    return fut


def mean_over_ranks_(ex: ShmExchange, grads: torch.Tensor) -> torch.Tensor:
    """What the hook does to a bucket (``grads``, flat, contiguous): scaled by 1 / W, as DDP's
    built-in hook scales, then summed over the exchange's ranks, in place (``neo calibrate`` times
    this as the dense gradients' AllReduce). Returns ``grads``."""
    grads.mul_(1.0 / ex.size)
    return all_reduce_sum_(ex, grads)


def all_reduce_sum_(ex: ShmExchange, grads: torch.Tensor) -> torch.Tensor:
    """The sum of ``grads`` (a flat contiguous tensor, the same size on every rank) over the
    exchange's ranks, in place, as the hook reduces a bucket (tools/bench_collectives.py times
    it against gloo's AllReduce). Returns ``grads``."""
    if ex.size == 2:
        _add_peer_bucket(ex, grads)
    elif ex.size > 2:
        _reduce_scatter_gather(ex, grads)
    return grads


def _add_peer_bucket(ex: ShmExchange, grads: torch.Tensor) -> None:
    """W = 2: each rank's bucket to the other, which adds it to its own in place, reading it in
    the sender's segment (no copy out, no gathered buffer): g0 + g1 on rank 0, g1 + g0 on rank 1,
    the same bits (one addition commutes), gloo's."""
    ex.all_gather_apply(grads, lambda _, peer: grads.add_(peer)).wait()


def _reduce_scatter_gather(ex: ShmExchange, grads: torch.Tensor) -> None:
    """Rank r sums chunk r of every rank's bucket (in rank order), then every rank gathers the W
    summed chunks: 2 (W-1)/W n floats moved a rank whatever W, as a ring would."""
    W, me = ex.size, ex.rank
    base, extra = divmod(grads.numel(), W)
    sizes = [base + (r < extra) for r in range(W)]                        # chunk r: rank r sums it
    mine = torch.empty(W * sizes[me], dtype=grads.dtype)                  # (W, chunk me) from every rank
    ex.all_to_all_single(mine, grads, [sizes[me]] * W, sizes).wait()
    summed = sum_in_rank_order(mine.view(W, sizes[me]))                   # (chunk me,)
    ex.all_to_all_single(grads, summed.repeat(W), sizes, [sizes[me]] * W).wait()


def register_shm_allreduce(ddp: torch.nn.parallel.DistributedDataParallel, exchange) -> Optional[ShmAllReduce]:
    """Make ``ddp`` reduce through ``exchange`` (a ShmExchange over its process group); its state
    (also ``ddp.neo_grad_sync``), or None (DDP keeps gloo's AllReduce) when there is no exchange."""
    if exchange is None:
        return None
    state = ShmAllReduce(exchange)
    ddp.register_comm_hook(state, shm_allreduce_hook)
    ddp.neo_grad_sync = state
    return state
