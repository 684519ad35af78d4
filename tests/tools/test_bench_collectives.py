"""tools/bench_collectives.py times shared memory and gloo interleaved: every iteration runs each
(collective, transport) once, in the order bench_common.call_orders gives the iteration index,
the same on every rank (a back-to-back loop, all of one transport's calls then the other's, lets
load from other jobs on a shared machine favour one of them)."""

from __future__ import annotations

import argparse

from tests.multiprocess import run_multiprocess
from tests.tools import load_tool

KEYS = [("all_to_all", "shm"), ("all_to_all", "gloo"), ("all_gather", "shm"), ("all_gather", "gloo"),
        ("all_reduce", "shm"), ("all_reduce", "gloo")]


def _check_interleaved(seq, keys, iters):
    """``seq``: the keys in call order; each block of len(keys) holds every key once, and the
    blocks' orders change from one iteration to the next (each key after each other one)."""
    n = len(keys)
    assert len(seq) == n * iters
    blocks = [seq[i * n:(i + 1) * n] for i in range(iters)]
    for b in blocks:
        assert sorted(b) == sorted(keys)
    assert len({tuple(b) for b in blocks}) == min(iters, n)
    pairs = {(a, b) for a, b in zip(seq, seq[1:]) if a != b}
    assert pairs == {(a, b) for a in keys for b in keys if a != b}    # each right after each other one


def _rank_call_order(rank: int, world_size: int, args):
    """One rank of the tool, its timed calls recorded in order."""
    bench = load_tool("bench_collectives.py")
    inner, seq = bench.time_interleaved, []

    def recording(calls, warmup, iters, before):
        def wrap(k, fn):
            return lambda: (seq.append(k), fn())
        return inner({k: wrap(k, fn) for k, fn in calls.items()}, warmup, iters, before=before)

    bench.time_interleaved = recording
    records = bench._rank_main(rank, world_size, args)
    return seq, [(r["collective"], r["transport"]) for r in records], [r["chain_us"] for r in records]


def test_ranks_time_the_transports_interleaved_in_the_same_order():
    args = argparse.Namespace(sizes=[0.001], warmup=1, iters=5, chain=4)
    results = run_multiprocess(_rank_call_order, 2, args, timeout_s=120, threads=1, env={"OMP_NUM_THREADS": "1"})
    (seq0, recs0, chain0), (seq1, recs1, chain1) = results
    assert seq0 == seq1                                               # every rank: the same collectives in order
    _check_interleaved([tuple(k) for k in seq0], KEYS, 6)
    assert chain0 == chain1 and all(c > 0 for c in chain0)            # the slowest rank's time, on every rank
    assert recs0 == recs1 == KEYS                                     # the records, as before
