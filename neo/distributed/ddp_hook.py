"""DistributedDataParallel's gradient AllReduce through shared memory (ranks of one host).

DDP hands each gradient bucket to gloo's AllReduce by default: on one host that is a ring over
loopback TCP, about 0.4 ms for a 60 KB bucket at 2 ranks (sockets, gloo's threads) where the
data is a few microseconds of copying. When the dense group's ranks share a host,
:func:`register_shm_allreduce` replaces that with the group's shared-memory exchange
(:class:`neo.distributed.shm.ShmExchange`): every rank publishes its bucket, gathers the others'
and sums the W copies itself, in rank order, so every rank computes the same sum. As DDP's own
hook does, each bucket is divided by W before the sum (the mean gradient). At 2 ranks the
result is bit for bit gloo's (one addition, commutative); at more ranks it is the same sum in
another order (rounding).

The exchange completes inside the hook (it progresses only while a rank waits on it), so a
bucket's reduction no longer overlaps the rest of the backward; on a CPU host whose ranks each
have one core that overlap only moved gloo's threads onto the same cores.
"""

import torch
import torch.distributed as dist

from neo.distributed.shm import ShmExchange

__all__ = ["shm_allreduce_hook", "register_shm_allreduce"]


def shm_allreduce_hook(exchange: ShmExchange, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over the exchange's ranks, in place. (No postponed
    annotations in this module: DDP checks this signature's annotations as objects.)"""
    grads = bucket.buffer()                                   # (n,) flat, this rank's gradients
    grads.div_(exchange.size)
    every = torch.empty(exchange.size * grads.numel(), dtype=grads.dtype)   # (W n,)
    exchange.all_gather_single(every, grads).wait()
    torch.sum(every.view(exchange.size, -1), dim=0, out=grads)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(grads)
    return fut


def register_shm_allreduce(ddp: torch.nn.parallel.DistributedDataParallel, exchange) -> bool:
    """Make ``ddp`` reduce through ``exchange`` (a ShmExchange over its process group); False
    (DDP keeps gloo's AllReduce) when there is none."""
    if exchange is None:
        return False
    ddp.register_comm_hook(exchange, shm_allreduce_hook)
    return True
