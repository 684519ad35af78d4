"""Asynchronous pipeline schedules (neo/pipeline/async_schedules.py): pipedream_async, pipedream_2bw.

(a) One micro-batch per step: pipedream_async equals synchronous 1F1B and single-process
    training (losses, dense weights, tables within 1e-5), at 2 ranks.
(b) Weight stashing, with several micro-batches in flight (M 4, and M 8 with max_versions 2): every stage's backward of
    every micro-batch ran on the version its forward used (from the version counters), two
    versions were stashed at once on the first stage, the staleness reached and never passed
    ``max_versions - 1``, and one update was applied per micro-batch; ``max_versions: 1``: none.
(c) 2BW: the micro-batches of mini-batch k ran forward and backward on version max(k - 1, 0)
    (the paper's W(t+1) = W(t) - lr grad f(W(t-1)), W(-1) = W(0)); staleness 1 from step 1.
(d) Bad config: ``max_versions < 1``, an asynchronous schedule with 1 stage or 2 virtual stages:
    ConfigError naming the field.
Plus the op orders replayed for deadlock over stages, bounds and micro-batch counts.
One spawn of 2 ranks runs every multi-process case.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

from neo.config.embedding import ConfigError
from neo.config.parallel import PipelineConfig
from neo.pipeline.async_schedules import async_1f1b_order
from tests.multiprocess import run_multiprocess
from tests.pipeline.test_pipeline_equivalence import (B, NUM_DENSE, STEPS, TOL, TYPES, _batches, _local, _model,
                                                      _optimizer, _reference, _tables)

D = 4


# ---------------------------------------------------------------------------------- op orders
def _replay(S: int, M: int, cap: int) -> None:
    """Run every stage's order with blocking receives: each op needs its peer's op done first."""
    orders = [async_1f1b_order(s, S, M, cap) for s in range(S)]
    done, pos = set(), [0] * S
    while any(pos[s] < len(orders[s]) for s in range(S)):
        moved = False
        for s in range(S):
            if pos[s] == len(orders[s]):
                continue
            kind, m = orders[s][pos[s]]
            need = ("F", m, s - 1) if kind == "F" and s > 0 else ("B", m, s + 1) if kind == "B" and s < S - 1 else None
            if need is None or need in done:
                done.add((kind, m, s))
                pos[s] += 1
                moved = True
        assert moved, f"deadlock: S={S} M={M} max_versions={cap} at {pos}"
    for s in range(S):                                    # in flight never above the bound
        f = b = 0
        for kind, _ in orders[s]:
            f, b = f + (kind == "F"), b + (kind == "B")
            assert f - b <= max(1, min(cap, S - s))


@pytest.mark.parametrize("S", [2, 3, 4, 5])
def test_orders_deadlock_free(S):
    for M in range(1, 9):
        for cap in range(1, S + 2):
            _replay(S, M, cap)
    assert async_1f1b_order(0, 2, 3, 2) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]


# ---------------------------------------------------------------------------------- (d) config
@pytest.mark.parametrize("fields,field", [
    ({"stages": 2, "schedule": "pipedream_async", "max_versions": 0}, "parallel.pipeline.max_versions"),
    ({"stages": 2, "schedule": "pipedream_2bw", "max_versions": -1}, "parallel.pipeline.max_versions"),
    ({"stages": 1, "schedule": "pipedream_async"}, "parallel.pipeline.stages"),
    ({"stages": 1, "schedule": "pipedream_2bw"}, "parallel.pipeline.stages"),
    ({"stages": 2, "schedule": "pipedream_async", "virtual_stages": 2}, "parallel.pipeline.virtual_stages"),
])
def test_bad_config_names_field(fields, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        PipelineConfig(**fields).validate()


def test_good_config():
    cfg = PipelineConfig(stages=2, schedule="PipeDream_2BW", max_versions=None)
    cfg.validate()
    assert cfg.schedule == "pipedream_2bw"
    PipelineConfig(stages=4, schedule="pipedream_async", max_versions=2).validate()


# ---------------------------------------------------------------------------------- multi-process
def _train(rank: int, world: int, pg, schedule: str, M: int, max_versions=None) -> Dict[str, Any]:
    from neo.distributed import ShardedEmbeddingCollection, even_plan
    from neo.pipeline.trainer import PipelinedDense

    ref_init = _reference("mlp", world)["init"]
    sec = ShardedEmbeddingCollection(_tables(), even_plan(_tables(), TYPES, world), pg, backend="auto", seed=3)
    sec.load_full_weights(ref_init)
    model = _model("mlp", sec)
    cfg = PipelineConfig(stages=2, schedule=schedule, micro_batches=M, split=[[0, 2], [3, 9]],
                         max_versions=max_versions)
    cfg.validate()
    pipe = PipelinedDense(cfg, model, pg, B, NUM_DENSE, 4 * D)
    opt = _optimizer(pipe.parameters())
    losses = []
    for dense, sparse, y in _batches(world):
        lo, hi = rank * B, (rank + 1) * B
        pooled = sec(_local(sparse, rank))
        losses.append(float(pipe.step(dense[lo:hi], pooled, y[lo:hi], optimizer=opt)))
        if not pipe.updates_inside:
            opt.step()
    return {"losses": losses, "dense": {n: p.detach().clone() for n, p in pipe.named_parameters().items()},
            "tables": sec.full_weights(), "log": pipe.version_log,
            "max_stashed": getattr(pipe.runner, "max_stashed", 0), "version": getattr(pipe.runner, "version", 0)}


def _cases(rank: int, world: int) -> Dict[str, Any]:
    from neo.distributed import ProcessGroups

    pg = ProcessGroups.build(world, shm=False)
    out = {"ref": _reference("mlp", world) if STEPS else None}
    for name, schedule, M, mv in [("sync_m1", "gpipe", 1, None), ("async_m1", "pipedream_async", 1, None),
                                  ("async_m4", "pipedream_async", 4, None), ("async_m8", "pipedream_async", 8, 2),
                                  ("async_mv1", "pipedream_async", 4, 1), ("2bw", "pipedream_2bw", 4, None)]:
        out[name] = _train(rank, world, pg, schedule, M, mv)
    return out


@pytest.fixture(scope="module")
def results() -> List[Dict[str, Any]]:
    return run_multiprocess(_cases, 2, timeout_s=240)


def test_one_micro_batch_equals_1f1b(results):
    for r in results:
        sync, asy, ref = r["sync_m1"], r["async_m1"], r["ref"]
        torch.testing.assert_close(torch.tensor(asy["losses"]), torch.tensor(sync["losses"]), rtol=TOL, atol=TOL)
        torch.testing.assert_close(torch.tensor(asy["losses"]), torch.tensor(ref["losses"]), rtol=TOL, atol=TOL)
        assert asy["dense"].keys() == sync["dense"].keys() and asy["dense"]
        for n, p in asy["dense"].items():
            torch.testing.assert_close(p, sync["dense"][n], rtol=TOL, atol=TOL, msg=lambda m: f"{n}: {m}")
            torch.testing.assert_close(p, ref["dense"][n], rtol=TOL, atol=TOL, msg=lambda m: f"{n}: {m}")
        for t, w in ref["tables"].items():
            torch.testing.assert_close(asy["tables"][t], w, rtol=TOL, atol=TOL, msg=lambda m: f"table {t}: {m}")
        assert all(rec["staleness"] == 0 for rec in asy["log"])


def test_weight_stashing_backward_uses_forward_version(results):
    for stage, r in enumerate(results):                   # rank = stage at 2 ranks
        for name, M, bound in (("async_m4", 4, 1), ("async_m8", 8, 1)):
            log = r[name]["log"]
            assert len(log) == STEPS * M and {rec["stage"] for rec in log} == {stage}
            for rec in log:
                assert rec["forward_version"] == rec["backward_version"], (name, rec)
                assert 0 <= rec["staleness"] <= bound, (name, rec)
            assert r[name]["version"] == STEPS * M                 # one update per micro-batch
            if stage == 0:                                          # 2 in flight on the first stage
                assert max(rec["staleness"] for rec in log) == 1
                assert r[name]["max_stashed"] == 2
                assert len({rec["forward_version"] for rec in log}) < len(log)   # versions shared in flight
            else:                                                   # the last stage: never stale
                assert max(rec["staleness"] for rec in log) == 0
        mv1 = r["async_mv1"]["log"]
        assert all(rec["staleness"] == 0 and rec["forward_version"] == rec["backward_version"] for rec in mv1)
        assert r["async_mv1"]["max_stashed"] == 1


def test_2bw_versions(results):
    for stage, r in enumerate(results):
        log = r["2bw"]["log"]
        assert len(log) == STEPS * 4
        for rec in log:
            k = rec["step"]
            assert rec["forward_version"] == rec["backward_version"] == max(k - 1, 0), rec
            assert rec["staleness"] == (1 if k >= 1 else 0), rec
        assert r["2bw"]["version"] == STEPS
        for n, p in r["2bw"]["dense"].items():                     # trained, not the 1F1B result
            assert torch.isfinite(p).all()
