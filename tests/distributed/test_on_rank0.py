"""``on_rank0``: a function run on rank 0 alone gives its result to every rank, and its error is
raised on every rank instead of leaving the others waiting (the plan, the checkpoint lease and the
pipeline's plan are made so)."""

from __future__ import annotations

import pytest

from tests.multiprocess import run_multiprocess

pytestmark = pytest.mark.multiprocess


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


def _call(rank, world_size, what):
    from neo.config import ConfigError
    from neo.distributed import ProcessGroups
    from neo.distributed.process_groups import on_rank0

    pg = ProcessGroups.build(shm=False)
    calls = []

    def fn():
        calls.append(rank)
        if what == "error":
            raise ConfigError("parallel.pipeline.split: bad on rank 0")
        if what == "unpicklable":
            raise _Unpicklable("rank 0's own")
        return {"plan": [1, 2], "by": rank}

    try:
        return {"value": on_rank0(fn, pg), "calls": calls}
    except Exception as e:  # noqa: BLE001 - what each rank raised is the result
        return {"error": (type(e).__name__, str(e)), "calls": calls}


def test_the_result_reaches_every_rank_and_fn_runs_once():
    outs = run_multiprocess(_call, 2, "value")
    assert [o["value"] for o in outs] == [{"plan": [1, 2], "by": 0}] * 2
    assert [o["calls"] for o in outs] == [[0], []]


def test_an_error_on_rank_0_is_raised_on_every_rank():
    outs = run_multiprocess(_call, 2, "error")
    assert [o["error"] for o in outs] == [("ConfigError", "parallel.pipeline.split: bad on rank 0")] * 2
    outs = run_multiprocess(_call, 2, "unpicklable")
    assert outs[0]["error"] == ("_Unpicklable", "rank 0's own")
    assert outs[1]["error"] == ("RuntimeError", "_Unpicklable on rank 0: rank 0's own")
