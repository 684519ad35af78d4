"""The trainer end to end on the tiny config: one and two gloo processes, pipelined == plain,
config errors, and the ``neo train`` command's final JSON line.

Every case runs the real :class:`neo.train.trainer.Trainer` through ``tests.multiprocess`` (one
process included, so the test process never holds a process group).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

import neo._C
from neo.config import ConfigError, config_from_dict
from tests.multiprocess import run_multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "train_tiny.yaml")
MIXED = ["sharding.types.user=row_wise", "sharding.types.item=column_wise", "sharding.types.category=data_parallel",
         "sharding.types.country=table_wise"]
"""A plan with four sharding types for 2 ranks."""


def tiny_config(tmp: str, *overrides: str):
    """The tiny config with its data cache and run directory under ``tmp``."""
    with open(TINY) as f:
        data = yaml.safe_load(f)
    base = [f"data.synthetic.cache_dir={tmp}/cache", f"train.run_dir={tmp}/run", "train.progress=false",
            "train.batch_size=64", "train.log_every=4"]
    return config_from_dict(data, base + list(overrides))


def train_and_collect(rank: int, world_size: int, tmp: str, overrides, steps_before=None):
    """Run the trainer; return losses, final metrics, full tables, optimizer state and dense state."""
    from neo.train.trainer import Trainer

    cfg = tiny_config(tmp, *overrides)
    tr = Trainer(cfg, log=lambda *a, **k: None)
    final = tr.fit()
    weights = tr.sharded.full_weights()
    states = tr.sharded.full_optimizer_state()
    dense = {k: v.clone() for k, v in tr.model.state_dict().items() if not k.startswith("embedding.")}
    return {"losses": tr.losses, "final": final, "weights": weights, "states": states, "dense": dense,
            "plan_types": sorted({t["sharding_type"] for t in tr.plan["tables"].values()}), "plan": tr.plan}


def assert_same(a, b):
    assert a["losses"] == b["losses"]
    for name in a["weights"]:
        assert torch.equal(a["weights"][name], b["weights"][name]), name
        for s in a["states"][name]:
            assert torch.equal(a["states"][name][s], b["states"][name][s]), (name, s)
    for k in a["dense"]:
        assert torch.equal(a["dense"][k], b["dense"][k]), k


def test_single_process_trains_and_reports(tmp_data):
    (out,) = run_multiprocess(train_and_collect, 1, tmp_data, ["train.steps=40"])
    f = out["final"]
    assert f["steps"] == 40 and len(out["losses"]) == 40
    assert f["eval_samples"] == 2048                      # the whole validation set
    assert 0.55 < f["auc"] <= 1.0 and 0 < f["logloss"] < 0.7 and f["samples_per_s"] > 0
    assert f["best_auc"] is not None and f["auc"] <= f["best_auc"] + 0.02
    records = [json.loads(x) for x in open(os.path.join(tmp_data, "run", "metrics.jsonl")).read().splitlines()]
    assert {"train", "final"} <= {r["kind"] for r in records}
    (kernels,) = [r for r in records if r["kind"] == "cpu_kernels"]   # the CPU kernels' ISA, in the run log
    assert kernels["step"] == 0 and kernels["neo_cpu_isa"] == neo._C.cpu_isa()
    assert kernels["neo_cpu_isa"] in kernels["supported"] and set(kernels["supported"]) <= set(kernels["built"])


def _fit_with_slow_drain(rank: int, world_size: int, tmp: str, delay: float):
    """The trainer with every pipeline drain taking ``delay`` seconds more; its final figures."""
    import time

    from neo.train.pipeline import PlainLoop, TrainPipeline
    from neo.train.trainer import Trainer

    for cls in (TrainPipeline, PlainLoop):
        real = cls.drain

        def slow(self, _real=real):
            time.sleep(delay)
            return _real(self)

        cls.drain = slow
    tr = Trainer(tiny_config(tmp, "train.steps=8", "train.eval_every=2"), log=lambda *a, **k: None)
    return tr.fit()


def test_a_drain_before_an_evaluation_is_training_time(tmp_data):
    """The pipeline's drain before each evaluation finishes the next batch's input distribution:
    training work, so ``train_seconds`` (and samples/s) count it. Three evaluations in the run
    (steps 2, 4, 6) and a drain of 0.4 s more before each: at least 1.2 s of training time."""
    (final,) = run_multiprocess(_fit_with_slow_drain, 1, tmp_data, 0.4)
    assert final["steps"] == 8 and final["train_seconds"] >= 1.2, final


def test_two_processes_mixed_plan(tmp_data):
    outs = run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=30"] + MIXED)
    a, b = outs
    assert a["plan_types"] == ["column_wise", "data_parallel", "row_wise", "table_wise"]
    assert a["final"]["auc"] == b["final"]["auc"]         # exact AUC over both ranks' samples
    assert a["final"]["eval_samples"] == 2048
    for k in a["dense"]:                                  # DDP keeps the dense replicas equal
        assert torch.equal(a["dense"][k], b["dense"][k])


_GLOO_THREADS_AT_EXIT = """
import atexit, os, sys
def count():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print("gloo threads at exit:", sum("gloo" in n for n in names), file=sys.stderr, flush=True)
atexit.register(count)
from neo.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the process's threads from /proc (Linux)")
def test_neo_train_frees_its_process_groups_before_exit(tmp_data):
    """When ``neo train`` returns, no gloo thread is left to be torn down during interpreter exit,
    where it ended processes in std::terminate ("terminate called without an active exception"):
    its process groups were destroyed and freed while the interpreter was whole."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", _GLOO_THREADS_AT_EXIT, "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/exit", "train.steps=6", "train.eval_batches=1", "train.progress=false"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "gloo threads at exit: 0" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("world", [1, 2])
def test_pipelined_equals_plain(tmp_data, world):
    common = ["train.steps=20"] + (MIXED if world == 2 else [])
    pipe = run_multiprocess(train_and_collect, world, tmp_data, common + ["train.pipelined=true"])
    plain = run_multiprocess(train_and_collect, world, tmp_data, common + ["train.pipelined=false"])
    for a, b in zip(pipe, plain):
        assert_same(a, b)


CACHED_AHEAD = ["tables.0.num_rows=3000", "tables.0.placement=cached", "tables.0.cache_rows=1600",
                "tables.0.cache_policy=lookahead", "tables.0.cache_lookahead=3"]
"""A cached table with the lookahead policy: the pipeline distributes (and waits for) 4 batches ahead."""


@pytest.mark.parametrize("world,extra", [(1, []), (2, MIXED), (2, CACHED_AHEAD)], ids=["1", "2", "2, cached"])
def test_position_weights_train_and_pipelined_equals_plain(tmp_data, world, extra):
    """``model.position_weights``: the sharded collection reads each batch's weights when it looks
    the batch up, so the pipelined loop (batch i+1 distributed under step i, before step i updates
    the weights; with a cached table four batches ahead) trains bit for bit as the plain one, and
    the weights train (they start at 1)."""
    common = ["train.steps=12", "model.position_weights.user=3", "model.position_weights.country=2"] + extra
    pipe = run_multiprocess(train_and_collect, world, tmp_data, common + ["train.pipelined=true"])
    plain = run_multiprocess(train_and_collect, world, tmp_data, common + ["train.pipelined=false"])
    for a, b in zip(pipe, plain):
        assert_same(a, b)
    keys = [k for k in pipe[0]["dense"] if k.startswith("position_weights.")]
    assert sorted(keys) == ["position_weights.weights.country", "position_weights.weights.user"]
    for k in keys:
        assert not torch.equal(pipe[0]["dense"][k], torch.ones_like(pipe[0]["dense"][k])), k
        for r in range(world):
            assert torch.equal(pipe[r]["dense"][k], pipe[0]["dense"][k]), (k, r)     # DDP keeps them equal


def test_config_errors_name_field_and_choices(tmp_data):
    with pytest.raises(ConfigError, match=r"model\.interaction.*'dot'.*'dcn'"):
        tiny_config(tmp_data, "model.interaction=cross")
    with pytest.raises(ConfigError, match=r"optim\.type.*sgd.*adagrad.*adam"):
        tiny_config(tmp_data, "optim.type=lbfgs")
    with pytest.raises(ConfigError, match=r"train.*no_such_key|no_such_key"):
        tiny_config(tmp_data, "train.no_such_key=1")
    with pytest.raises(ConfigError, match=r"sharding\.types\.user.*row_wise"):
        tiny_config(tmp_data, "sharding.types.user=diagonal")
    from neo.train.build import validate_training_config

    with pytest.raises(ConfigError, match=r"model\.dense_arch.*dim 8"):
        validate_training_config(tiny_config(tmp_data, "model.dense_arch=[16,4]"))
    with pytest.raises(ConfigError, match=r"model\.position_weights\.usr: no table has that feature"):
        validate_training_config(tiny_config(tmp_data, "model.position_weights.usr=3"))
    with pytest.raises(ConfigError, match=r"model\.position_weights\.user: must be .* integer >= 1, got 0"):
        tiny_config(tmp_data, "model.position_weights.user=0")


def test_neo_train_command_prints_final_json(tmp_data):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/cmd", "train.steps=10", "model.dense_arch=[32,8]", "optim.lr=0.01",
           "train.progress=false"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    final = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("samples_per_s", "auc", "logloss", "steps"):
        assert key in final
    assert final["steps"] == 10
    assert "Sharding plan" in p.stdout


def test_parquet_source(tmp_data):
    """``data.source: parquet`` on files written by the data pipeline (here: the synthetic cache's)."""
    from neo.train.build import resolve_tables
    from neo.train.data import synthetic_dir

    (first,) = run_multiprocess(train_and_collect, 1, tmp_data, ["train.steps=4"])   # makes sure the cache exists
    cfg = tiny_config(tmp_data)
    files = sorted(os.listdir(os.path.join(synthetic_dir(cfg, resolve_tables(cfg)), "train")))
    root = os.path.join(synthetic_dir(cfg, resolve_tables(cfg)), "train")
    train = "[" + ",".join(os.path.join(root, f) for f in files[:-1]) + "]"
    (out,) = run_multiprocess(train_and_collect, 1, tmp_data, ["train.steps=4", "data.source=parquet",
                                                                f"data.train_paths={train}",
                                                                f"data.val_paths=[{os.path.join(root, files[-1])}]"])
    assert out["losses"] == first["losses"]               # the same samples in the same order
    assert out["final"]["eval_samples"] == 2048


def test_evaluation_covers_uneven_shards(tmp_data):
    """2047 validation samples on 2 ranks (1023 + 1024), batch 1023: rank 0 evaluates one real and
    one empty padded batch, rank 1 two real ones; every sample is counted once."""
    outs = run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=2", "train.batch_size=1023",
                                                             "data.synthetic.num_samples=4094",
                                                             "data.synthetic.val_samples=2047"] + MIXED)
    assert [o["final"]["eval_samples"] for o in outs] == [2047, 2047]
    assert outs[0]["final"]["auc"] == outs[1]["final"]["auc"]


def test_a_plan_from_a_file_is_predicted_like_a_planned_one(tmp_data):
    import json

    (planned,) = run_multiprocess(train_and_collect, 1, tmp_data, ["train.steps=3"])
    path = f"{tmp_data}/plan_no_summary.json"
    with open(path, "w") as f:
        json.dump(dict(planned["plan"], summary={}), f)               # as a hand-written plan would be
    (loaded,) = run_multiprocess(train_and_collect, 1, tmp_data, ["train.steps=3", f"sharding.plan_file={path}"])
    assert loaded["final"]["predicted_step_ms"] == planned["final"]["predicted_step_ms"] > 0
    assert loaded["final"]["predicted_components_ms"] == planned["final"]["predicted_components_ms"]


def test_inline_loading_is_predicted_as_the_steps_data(tmp_data):
    """With the loader inline (``data.prefetch_batches: 0``) every step pays its work: the plan's
    prediction carries it as ``data`` (the loader's constants x the batch's samples and ids)."""
    import json
    from dataclasses import replace

    from neo.planner.constants import builtin_constants
    from neo.planner.step_model import data_seconds

    c = replace(builtin_constants("cpu"), data_batch_s=2e-4, data_bag_s=3e-7, data_id_s=4e-9)
    path = f"{tmp_data}/constants.json"
    with open(path, "w") as f:
        json.dump(c.to_dict(), f)
    ov = ["train.steps=6", f"sharding.cost_constants={path}"]
    (inline,) = run_multiprocess(train_and_collect, 1, tmp_data, ov + ["data.prefetch_batches=0"])
    cfg = tiny_config(tmp_data)
    want = data_seconds(cfg.table_specs(), cfg.train.batch_size, c) * 1e3
    assert want > 0
    assert inline["final"]["predicted_components_ms"]["data"] == pytest.approx(want, abs=1e-4)
    assert inline["final"]["measured_components_ms"]["data"] > 0
