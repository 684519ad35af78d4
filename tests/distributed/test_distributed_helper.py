"""The shared multi-process helper: results in rank order, failures named, no hang on a dead peer."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from tests.multiprocess import MultiProcessError, run_multiprocess


def _sum_ranks(rank, world_size, scale):
    t = torch.ones(1) * rank * scale
    dist.all_reduce(t)
    return {"rank": rank, "sum": float(t), "env": __import__("os").environ["LOCAL_RANK"]}


def _one_rank_fails(rank, world_size):
    if rank == 1:
        raise RuntimeError("boom on purpose")
    t = torch.ones(1)
    dist.all_reduce(t)          # rank 1 never joins: must time out, not hang
    return float(t)


def test_results_in_rank_order():
    out = run_multiprocess(_sum_ranks, 4, 10.0, local_world_size=2)
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert all(o["sum"] == 60.0 for o in out)
    assert [o["env"] for o in out] == ["0", "1", "0", "1"]


def test_failing_rank_is_named_and_peers_time_out():
    t0 = time.monotonic()
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_one_rank_fails, 2, collective_timeout_s=5, grace_s=20, timeout_s=60)
    assert time.monotonic() - t0 < 45
    assert 1 in info.value.failures and "boom on purpose" in info.value.failures[1]
    assert "rank 1 of 2 failed" in str(info.value)


def _one_rank_stalls(rank, world_size):
    from neo.distributed.comms import all_reduce

    if rank == 1:
        time.sleep(8)                # alive but absent: rank 0's collective must time out
        return "slept"
    return all_reduce(torch.ones(1), dist.group.WORLD, name="stalled_all_reduce").wait()


def test_stalled_peer_times_out_with_named_collective():
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_one_rank_stalls, 2, collective_timeout_s=3, grace_s=20, timeout_s=60)
    assert list(info.value.failures) == [0]
    msg = info.value.failures[0]
    assert "CollectiveError" in msg and "rank 0: collective 'stalled_all_reduce' failed or timed out" in msg, msg
