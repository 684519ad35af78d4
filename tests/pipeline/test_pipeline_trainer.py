"""``neo train`` with ``parallel.pipeline``: the Trainer's pipelined step equals its data-parallel one.

Two ranks train the tiny config with a deeper top MLP twice in one spawn: once data-parallel
(DDP), once with the dense layers pipelined over 2 stages (1F1B, 4 micro-batches); three ranks
the same with 3 stages, one of which holds the interaction alone and trains nothing. Same
loaders, same plan, same init: the global losses, the dense weights (every rank's whole model
after the final evaluation's ``sync_weights``), the tables and the AUC agree within 1e-5 (the
tables with row-wise Adagrad or SGD: element-wise Adagrad amplifies rounding, see the test).
"""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from neo.config import ConfigError, config_from_dict
from tests.multiprocess import run_multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "train_tiny.yaml")
DEEP = ["model.over_arch=[16,16,16,16,1]", "train.steps=6", "train.batch_size=32", "train.log_every=2",
        "data.synthetic.num_samples=2048", "data.synthetic.val_samples=512"]
PIPE = ["parallel.pipeline.stages=2", "parallel.pipeline.schedule=1f1b", "parallel.pipeline.micro_batches=4"]


def _config(tmp: str, *overrides: str):
    with open(TINY) as f:
        data = yaml.safe_load(f)
    base = [f"data.synthetic.cache_dir={tmp}/cache", f"train.run_dir={tmp}/run", "train.progress=false"]
    return config_from_dict(data, base + DEEP + list(overrides))


# 3 stages, the second of the dot interaction alone (layers: bottom.0-1, interaction, top.0-4): its
# rank trains no parameter of its own (an "auto" split can choose that too)
PIPE_EMPTY_STAGE = ["parallel.pipeline.stages=3", "parallel.pipeline.schedule=1f1b", "parallel.pipeline.micro_batches=3",
                    "parallel.pipeline.split=[[0,1],[2,2],[3,7]]"]


def _train_both(rank: int, world: int, tmp: str, common=(), pipe=tuple(PIPE)):
    from neo.train.trainer import Trainer

    out = {}
    for name, extra in (("ddp", []), ("pipeline", list(pipe))):
        tr = Trainer(_config(tmp, *common, *extra), log=lambda *a, **k: None)
        final = tr.fit()
        losses = torch.tensor(tr.losses, dtype=torch.float64)
        if name == "ddp":                                     # local means -> the global batch's mean
            torch.distributed.all_reduce(losses)
            losses /= world
        out[name] = {"losses": losses, "auc": final["auc"], "tables": tr.sharded.full_weights(),
                     "dense": {k: v.clone() for k, v in tr.model.state_dict().items() if not k.startswith("embedding.")},
                     "pipelined": tr.pipeline is not None, "predicted": "predicted_step_ms" in final}
    return out


# The tiny config's element-wise Adagrad tables (user, category) as row-wise Adagrad here: element-wise
# Adagrad divides a gradient by the root of its own squares, so for an element with a tiny gradient the
# rounding of another summation order (4 micro-batches against one batch) is amplified into its step
# (table user 1.2e-4 apart under --seed-shift 19, beyond the 1e-4 that stood here). Row-wise: at most
# 3.3e-7 apart over seed shifts 0, 7 and 19 (2026-12-06). Element-wise Adagrad itself is checked
# against torch.optim in tests/embedding.
ROWWISE_TABLES = ["tables.0.optimizer.type=rowwise_adagrad", "tables.2.optimizer.type=rowwise_adagrad"]

# The dense Adagrad's sums from 0.1, not 0, for the same reason (as tests/pipeline/test_pipeline_equivalence.py):
# from 0 an element whose gradient nearly cancels is divided by the root of its own tiny squares, and
# the other summation order's rounding is amplified into its step (top.4.weight 1.8e-5 apart under
# --seed-shift 601, beyond the 1e-5 below). From 0.1 a step moves at most lr / 0.32 times its gradient's difference.
DENSE_ADAGRAD = ["optim.initial_accumulator_value=0.1"]


@pytest.mark.parametrize("world,layout", [(2, PIPE), (3, PIPE_EMPTY_STAGE)], ids=["2stages", "stage_without_parameters"])
def test_trainer_pipeline_equals_data_parallel(tmp_path, world, layout):
    for per_rank in run_multiprocess(_train_both, world, str(tmp_path), ROWWISE_TABLES + DENSE_ADAGRAD, layout,
                                     timeout_s=240):
        ddp, pipe = per_rank["ddp"], per_rank["pipeline"]
        assert pipe["pipelined"] and not ddp["pipelined"]
        # the planner's step model (data-parallel dense) predicts the DDP run only
        assert ddp["predicted"] and not pipe["predicted"]
        torch.testing.assert_close(pipe["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
        for k, v in ddp["dense"].items():
            torch.testing.assert_close(pipe["dense"][k], v, rtol=1e-5, atol=1e-5, msg=lambda m: f"{k}: {m}")
        for t, w in ddp["tables"].items():
            torch.testing.assert_close(pipe["tables"][t], w, rtol=1e-5, atol=1e-5, msg=lambda m: f"table {t}: {m}")
        assert abs(pipe["auc"] - ddp["auc"]) < 1e-4


def test_position_weights_train_in_the_pipeline_as_under_ddp(tmp_path):
    """``model.position_weights`` with pipelined dense towers: every rank trains the weights (its
    lookups read them), their gradient averaged over all ranks; the run equals the DDP one."""
    # SGD for the dense part: element-wise Adagrad amplifies the rounding of another summation order
    # into an element with a tiny gradient (2.4e-5 on one weight of 256 here; the tables: above)
    weights = ["model.position_weights.user=2", "model.position_weights.category=3", "optim.type=sgd", *ROWWISE_TABLES]
    for per_rank in run_multiprocess(_train_both, 2, str(tmp_path), weights, timeout_s=240):
        ddp, pipe = per_rank["ddp"], per_rank["pipeline"]
        assert pipe["pipelined"] and not ddp["pipelined"]
        torch.testing.assert_close(pipe["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
        keys = sorted(k for k in ddp["dense"] if k.startswith("position_weights."))
        assert keys == ["position_weights.weights.category", "position_weights.weights.user"]
        for k in keys:                           # trained (moved from their start at 1), by the same steps
            # SGD's steps on a weight can be tiny (the largest move 8.9e-7 under --seed-shift 43, positions
            # no bag reached not moving at all); untrained, every position stays exactly at 1
            moved = ddp["dense"][k] - 1.0
            assert bool((moved != 0).any()), k
            torch.testing.assert_close(pipe["dense"][k] - 1.0, ddp["dense"][k] - 1.0, rtol=1e-3, atol=1e-9,
                                       msg=lambda m: f"{k}'s steps: {m}")
        for k, v in ddp["dense"].items():
            torch.testing.assert_close(pipe["dense"][k], v, rtol=1e-5, atol=1e-5, msg=lambda m: f"{k}: {m}")
        for t, w in ddp["tables"].items():
            torch.testing.assert_close(pipe["tables"][t], w, rtol=1e-5, atol=1e-5, msg=lambda m: f"table {t}: {m}")


def test_position_weights_refuse_pipedream_async(tmp_path):
    from neo.train.build import validate_training_config

    cfg = _config(str(tmp_path), "parallel.pipeline.stages=2", "parallel.pipeline.schedule=pipedream_async",
                  "parallel.pipeline.micro_batches=4", "model.position_weights.user=2")
    with pytest.raises(ConfigError, match=r"model\.position_weights: not with parallel\.pipeline\.schedule: "
                                          r"pipedream_async"):
        validate_training_config(cfg)
    validate_training_config(_config(str(tmp_path), *PIPE, "model.position_weights.user=2"))


def test_trainer_rejects_pipeline_checkpoints_and_bf16(tmp_path):
    from neo.pipeline.trainer import pipelined_dense

    for bad, field in (("train.checkpoint_dir=/tmp/x", "train.checkpoint_dir"), ("train.dense_dtype=bf16", "train.dense_dtype")):
        cfg = _config(str(tmp_path), *PIPE, bad)
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            pipelined_dense(cfg, None, None, 4)
