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


def _cause_arrives_last(rank, world_size):
    from neo.distributed.comms import all_reduce

    if rank == 1:
        dist.destroy_process_group()    # the peers' collective breaks now: their errors come first
        time.sleep(3)
        raise ValueError("the cause, reported last")
    return all_reduce(torch.ones(1), dist.group.WORLD, name="broken_all_reduce").wait()


def test_the_cause_leads_the_report_whatever_order_errors_arrive_in():
    """A log cut to its first lines (as CI's is) must still show the failing rank's own error,
    not a peer's echo of it ("a peer rank has probably failed")."""
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_cause_arrives_last, 3, collective_timeout_s=20, grace_s=20, timeout_s=60)
    failures = info.value.failures
    assert sorted(failures) == [0, 1, 2]
    assert list(failures)[-1] == 1, list(failures)           # it did arrive last
    assert all("probably failed" in failures[r] for r in (0, 2))
    msg = str(info.value)
    assert msg.splitlines()[0] == "3 of 3 ranks failed: [0, 1, 2]; first cause: rank 1: ValueError: the cause, reported last"
    assert msg.index("rank 1 of 3 failed") < min(msg.index("rank 0 of 3 failed"), msg.index("rank 2 of 3 failed"))


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


def _where(rank, world_size):
    import os
    import sys

    from neo import _C

    return {"mark": os.environ.get("NEO_HELPER_MARK"), "cwd": os.getcwd(), "path": list(sys.path),
            "isa": _C.cpu_isa(), "pid": os.getpid()}


def test_ranks_see_the_callers_environment_and_directory_at_the_call(monkeypatch, tmp_path):
    """The ranks are forks of a server started earlier: the caller's state now must still reach them."""
    first = run_multiprocess(_where, 2)                      # the fork server runs from here on
    monkeypatch.setenv("NEO_HELPER_MARK", "set after the server started")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "extra"))
    out = run_multiprocess(_where, 2, env={"LOCAL_EXTRA": "1"})
    assert [o["mark"] for o in first] == [None, None]
    assert all(o["mark"] == "set after the server started" for o in out)
    assert all(o["cwd"] == str(tmp_path) and o["path"][0] == str(tmp_path / "extra") for o in out)
    assert len({o["pid"] for o in first + out}) == 4        # a new process per rank and call


def test_a_variable_read_at_import_gets_fresh_interpreters():
    """NEO_CPU_ISA is read when neo._C loads: the preloaded server cannot honour it, a spawn does."""
    from neo import _C

    assert run_multiprocess(_where, 1)[0]["isa"] == _C.cpu_isa()
    assert run_multiprocess(_where, 1, env={"NEO_CPU_ISA": "baseline"})[0]["isa"] == "baseline"


def _rank_zero_dies_first(rank, world_size):
    import os
    import signal

    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("rank0_pid", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    pid = int(store.get("rank0_pid"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:          # until rank 0 is gone (or a zombie: dead, not yet reaped)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("rank 0 did not die")
    store.set("after", "rank 1 alone")             # the store is the caller's, not rank 0's
    return store.get("after").decode()


def test_the_store_outlives_rank_zero():
    """The ranks' rendezvous store is served by the calling process, as torchrun's agent serves its
    workers': a test that kills rank 0 still has a store for the others (heartbeats, waits), and no
    port is picked and released before a rank binds it. Rank 0 hosted it until 2026-12-07."""
    assert run_multiprocess(_rank_zero_dies_first, 2, may_die=[0], collective_timeout_s=10, timeout_s=60) == \
        [None, "rank 1 alone"]
