"""A rank that stops responding makes the others fail within the collective timeout, with an
error naming the step, the operation and the rank at fault; never an endless wait.

Rank 1 stops itself with SIGSTOP (alive, silent: what a swapped-out or wedged process looks
like) just before a step; rank 0 must raise ``CollectiveError`` within the timeout, through
the shared-memory transport and through gloo's sockets alike. Rank 0 then kills rank 1.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch.distributed as dist

from tests.multiprocess import run_multiprocess
from tests.train.test_trainer import MIXED, tiny_config

TIMEOUT_S = 6.0


def _stopped_at(tr, step_method: str, stop_at: int) -> str:
    """Rank 1's part: train ``tr``, stopping this process (SIGSTOP) as its step ``stop_at`` starts
    (rank 0 kills it when it notices); returns only if it was never stopped."""
    step_fn = getattr(tr, step_method)

    def stopping_step(*args):
        if tr.step == stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)
        return step_fn(*args)

    setattr(tr, step_method, stopping_step)
    tr.fit()
    return "rank 1 was not stopped"


def _stop_rank_one(rank, world_size, tmp, stop_at, shm):
    from neo.distributed.comms import CollectiveError
    from neo.train.trainer import Trainer

    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    cfg = tiny_config(tmp, "train.steps=30", f"train.shm_collectives={shm}",
                      f"train.collective_timeout_s={TIMEOUT_S}", *MIXED)
    tr = Trainer(cfg, log=lambda *a, **k: None)
    if rank == 1:
        return _stopped_at(tr, "_train_step", stop_at)
    entered = {}
    step_fn = tr._train_step

    def timed_step(sb, dist_batch):
        entered[tr.step] = time.monotonic()
        return step_fn(sb, dist_batch)

    tr._train_step = timed_step
    try:
        tr.fit()
        error = None
    except CollectiveError as e:
        error = str(e)
    failed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    # from entering the step rank 1 never ran to the error (None: it never got there)
    waited = failed_at - entered[stop_at] if stop_at in entered else None
    return {"error": error, "waited": waited, "step": tr.step}


@pytest.mark.parametrize("shm", [True, False])
def test_a_stopped_rank_is_named_within_the_timeout(tmp_data, shm):
    stop_at = 7
    out, dead = run_multiprocess(_stop_rank_one, 2, tmp_data, stop_at, shm, collective_timeout_s=TIMEOUT_S,
                                 may_die=[1], timeout_s=120)
    assert dead is None
    assert out["error"] is not None, "rank 0 finished although rank 1 had stopped"
    assert out["step"] == stop_at                             # it failed in the step rank 1 never ran
    msg = out["error"]
    assert f"rank 0: step {stop_at + 1}:" in msg, msg
    assert "rank 1 has sent no heartbeat" in msg, msg           # the rank at fault, by its heartbeat
    assert "did not complete within train.collective_timeout_s = 6 s" in msg, msg
    assert any(op in msg for op in ("AlltoAll", "AllReduce")), msg   # the operation
    # the first collective of that step that needs rank 1 waits out the timeout, then fails
    assert TIMEOUT_S - 0.5 < out["waited"] < TIMEOUT_S + 4, out["waited"]


def _stop_rank_one_wsp(rank, world_size, tmp, stop_at):
    """As _stop_rank_one, under async_train.mode: wsp (staleness 1): rank 0 waits for a version
    rank 1 never pushes."""
    from neo.async_train import WSPTrainer
    from neo.distributed.comms import CollectiveError

    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    cfg = tiny_config(tmp, "train.steps=40", "async_train.mode=wsp", "async_train.staleness=1",
                      f"train.collective_timeout_s={TIMEOUT_S}", "train.eval_every=0")
    tr = WSPTrainer(cfg, log=lambda *a, **k: None)
    if rank == 1:
        return _stopped_at(tr, "_local_step", stop_at)
    try:
        tr.fit()
        error = None
    except CollectiveError as e:
        error = str(e)
    os.kill(pids[1], signal.SIGKILL)
    return {"error": error}


def test_a_stopped_wsp_worker_is_named_within_the_timeout(tmp_data):
    """WSP waits on the store for versions, not in a collective: that wait's timeout names the
    worker at fault from the heartbeats too (it was a bare DistStoreError naming a store key;
    audit of 2026-11-29)."""
    out, dead = run_multiprocess(_stop_rank_one_wsp, 2, tmp_data, 6, collective_timeout_s=TIMEOUT_S,
                                 may_die=[1], timeout_s=120)
    assert dead is None and out["error"] is not None, "rank 0 finished although rank 1 had stopped"
    msg = out["error"]
    assert msg.startswith("rank 0: step ") and "a worker did not answer within train.collective_timeout_s = 6 s" in msg
    assert "rank 1 has sent no heartbeat" in msg, msg
