"""DDP's gradient AllReduce through shared memory (neo.distributed.ddp_hook) against DDP's own
gloo AllReduce as the oracle: the same model, the same per-rank batches, several steps."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neo.distributed import ProcessGroups
from neo.distributed.ddp_hook import register_shm_allreduce
from neo.distributed.shm import ShmExchange
from tests.multiprocess import run_multiprocess


def _model() -> nn.Module:
    torch.manual_seed(0)
    # several buckets (bucket_cap_mb below), an unused-free graph, uneven parameter sizes
    return nn.Sequential(nn.Linear(13, 300), nn.ReLU(), nn.Linear(300, 200), nn.ReLU(), nn.Linear(200, 1))


def _train(rank: int, hook: bool, update: bool, steps: int = 4):
    """Per step, the gradients DDP leaves; with ``update``, Adagrad steps between them."""
    model = _model()
    group = dist.new_group(list(range(dist.get_world_size())))
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.1, gradient_as_bucket_view=True)
    if hook:
        ex = ShmExchange.create(group)
        assert ex is not None
        assert register_shm_allreduce(ddp, ex) is ddp.neo_grad_sync
    opt = torch.optim.Adagrad(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)          # every rank its own batches
    grads = []
    for _ in range(steps):
        x, y = torch.randn(64, 13, generator=gen), torch.rand(64, generator=gen)
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(ddp(x).squeeze(1), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        if update:
            opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]


def _body(rank: int, W: int):
    ref = _train(rank, hook=False, update=W == 2)
    got = _train(rank, hook=True, update=W == 2)
    trained = _train(rank, hook=True, update=True)[1]
    return ref, got, trained


@pytest.mark.parametrize("W", [2, 3, 4])
def test_shm_hook_reduces_like_ddps_gloo_allreduce(W):
    """W = 2 (gather and add): four training steps bit for bit gloo's. W = 3, 4 (the two
    AlltoAlls): each of four batches' gradients at the same weights within float rounding of
    gloo's (the W terms summed in another order)."""
    out = run_multiprocess(_body, W)
    for rank, ((ref_grads, ref_params), (got_grads, got_params), _) in enumerate(out):
        for step, (r, g) in enumerate(zip(ref_grads, got_grads)):
            for a, b in zip(r, g):
                if W == 2:
                    assert torch.equal(a, b), (rank, step)
                else:
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
        if W == 2:
            assert all(torch.equal(a, b) for a, b in zip(ref_params, got_params)), rank
    # training through the hook leaves every rank with the same parameters
    for rank in range(1, W):
        for a, b in zip(out[0][2], out[rank][2]):
            assert torch.equal(a, b)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Module()             # what wrap_ddp leaves out of DDP (none here)
        self.top = nn.Linear(4, 1)


class _Step(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Model()

    def forward(self, x):
        return self.model.top(x)


def _wrap_body(rank: int, W: int, shm: bool):
    from neo.distributed.ddp_hook import shm_allreduce_hook
    from neo.train.step import wrap_ddp

    pg = ProcessGroups.build(shm=shm)
    ddp = wrap_ddp(_Step(), pg)
    hooks = [h for h, _ in getattr(ddp, "_comm_hooks", [])]
    return (pg.dense_comm.shm is not None, hooks == [shm_allreduce_hook])


def test_wrap_ddp_reduces_through_shared_memory_on_one_host():
    assert run_multiprocess(_wrap_body, 2, True) == [(True, True)] * 2
    assert run_multiprocess(_wrap_body, 2, False) == [(False, False)] * 2


def test_no_exchange_keeps_ddps_allreduce():
    assert register_shm_allreduce(object(), None) is None


def _calibrated_allreduce(rank: int, W: int, shm: bool):
    """``neo calibrate``'s AllReduce records' transport, and the hook's reduction of one bucket
    (``mean_over_ranks_``) beside gloo's AllReduce of the same bucket divided by W."""
    from neo.calibrate.measure import collectives
    from neo.distributed.ddp_hook import mean_over_ranks_

    pg = ProcessGroups.build(shm=shm)
    transports = {r["transport"] for r in collectives(pg, quick=True) if r["op"] == "allreduce"}
    same = None
    if pg.dense_comm.shm is not None:
        g = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
        ref = g.clone()
        dist.all_reduce(ref, group=pg.dense)
        same = torch.equal(mean_over_ranks_(pg.dense_comm.shm, g), ref / W)
    return transports, same


def test_calibrate_times_the_allreduce_the_trainer_runs():
    """Before, calibrate timed gloo's AllReduce on every host: 1.4-2.5 ms a 4-512 KB bucket on a
    2-vCPU VM against the shared-memory hook's 18-48 us, the step model's 1.2 ms latency a step."""
    assert run_multiprocess(_calibrated_allreduce, 2, True) == [({"shm"}, True)] * 2
    assert run_multiprocess(_calibrated_allreduce, 2, False) == [({"group"}, None)] * 2
