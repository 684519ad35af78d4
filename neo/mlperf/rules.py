"""The closed division's rules for DLRM-DCNv2, and the checks ``neo mlperf --division closed`` runs.

What the rules fix (MLPerf Training 6.0, ``mlperf_logging/compliance_checker/training_6.0.0/
closed_dlrm_dcnv2.yaml`` and the reference convergence points ``rcp_checker/training_6.0.0/
rcps_dlrm_dcnv2.json``):

* model: DCNv2, 26 tables of the Criteo 1TB sizes capped at 40M rows, D = 128, bottom MLP
  13-512-256-128, 3 low-rank cross layers of rank 512, top MLP 1024-1024-512-256-1;
* optimizer: Adagrad on every parameter (dense and embeddings), eps 1e-8, no weight decay, no
  lr decay, initial accumulator 0, no warmup, no lr decay schedule;
* (global batch, learning rate): one of the RCPs' pairs (65536 at 0.004, 32768 at 0.004, ...);
* evaluation: exact AUROC over the whole validation set (89,137,319 samples) every 0.05 epoch;
  target eval_accuracy 0.80275.

Every check raises :class:`neo.config.ConfigError` naming the field, the config's value and the
rules' value.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence, Tuple

from neo.config.embedding import ConfigError

__all__ = ["BENCHMARK", "TARGET_AUC", "EVAL_EVERY_EPOCHS", "EVAL_SAMPLES", "TRAIN_SAMPLES", "RESULT_RUNS", "RULESET",
           "rcp_batch_lrs", "check_closed_config", "check_closed_run", "check_closed_data"]

BENCHMARK = "dlrm_dcnv2"
TARGET_AUC = 0.80275
EVAL_EVERY_EPOCHS = 0.05
EVAL_SAMPLES = 89_137_319
TRAIN_SAMPLES = 4_195_197_692
RESULT_RUNS = 10
"""Runs of a submission (mlperf_logging.benchmark_meta); the score drops the fastest and slowest."""
RULESET = "6.0.0"
"""The last MLPerf Training ruleset that lists dlrm_dcnv2."""

_MODEL = {"interaction": "dcn", "dense_arch": [512, 256, 128], "over_arch": [1024, 1024, 512, 256, 1],
          "dcn_layers": 3, "dcn_rank": 512}
_DIM = 128
_OPTIM = {"type": "adagrad", "eps": 1e-8, "weight_decay": 0.0, "warmup_steps": 0, "decay_start": 0, "decay_steps": 0}


def _differs(field: str, got, want) -> ConfigError:
    return ConfigError(f"mlperf closed division: {field} is {got!r}, the rules require {want!r}")


def rcp_batch_lrs() -> List[Tuple[int, float]]:
    """(global batch size, base learning rate) of every DLRM-DCNv2 reference convergence point."""
    import mlperf_logging

    path = os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker", f"training_{RULESET}",
                        f"rcps_{BENCHMARK}.json")
    with open(path) as f:
        rcps: Dict[str, dict] = json.load(f)
    return sorted({(int(r["BS"]), float(r["Hyperparams"]["opt_base_learning_rate"])) for r in rcps.values()})


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))


def check_closed_config(cfg) -> None:
    """The parts of the rules a config fixes by itself (model, tables, optimizers, target, cadence)."""
    from data_pipeline.schema import MLPERF_TABLE_SIZES
    from neo.train.build import resolve_tables

    m = cfg.model
    for name, want in _MODEL.items():
        got = getattr(m, name)
        got = [int(x) for x in got] if isinstance(got, list) else got
        if got != want:
            raise _differs(f"model.{name}", got, want)
    if len(cfg.tables) != len(MLPERF_TABLE_SIZES):
        raise _differs("tables", f"{len(cfg.tables)} tables", f"{len(MLPERF_TABLE_SIZES)} tables")
    for k, (t, rows) in enumerate(zip(cfg.tables, MLPERF_TABLE_SIZES)):
        if t.dim != _DIM:
            raise _differs(f"tables[{k}].dim", t.dim, _DIM)
        if t.num_rows != rows:
            raise _differs(f"tables[{k}].num_rows", t.num_rows, rows)
    o = cfg.optim
    for name, want in _OPTIM.items():
        got = getattr(o, name)
        if got != want and not (isinstance(want, float) and _close(float(got), want)):
            raise _differs(f"optim.{name}", got, want)
    _check_sparse(resolve_tables(cfg), o.lr)
    mp = cfg.mlperf
    if mp.target_auc is None:
        raise ConfigError(f"mlperf.target_auc: the closed division needs the rules' target {TARGET_AUC}; "
                          "the config has no mlperf.target_auc")
    if not _close(mp.target_auc, TARGET_AUC):
        raise _differs("mlperf.target_auc", mp.target_auc, TARGET_AUC)
    if not _close(mp.eval_every_epochs, EVAL_EVERY_EPOCHS):
        raise _differs("mlperf.eval_every_epochs", mp.eval_every_epochs, EVAL_EVERY_EPOCHS)
    if cfg.train.eval_batches:
        raise _differs("train.eval_batches", cfg.train.eval_batches, "0 (the whole validation set)")


def _check_sparse(tables: Sequence, lr: float) -> None:
    """Every table's fused optimizer (its own, or optim.sparse) is the dense one: Adagrad at optim.lr."""
    for k, tc in enumerate(tables):
        opt, where = tc.optimizer, f"tables[{k}].optimizer ({tc.name}; or optim.sparse)"
        if opt.type.value != "adagrad":
            raise _differs(f"{where}.type", opt.type.value, "adagrad")
        for name, want in (("lr", lr), ("eps", 1e-8), ("weight_decay", 0.0), ("initial_accumulator_value", 0.0)):
            got = float(getattr(opt, name))
            if not _close(got, want):
                raise _differs(f"{where}.{name}", got, want)


def check_closed_run(cfg, world_size: int) -> None:
    """The rules that depend on the world size: the (global batch, lr) pair must be an RCP's."""
    gb = cfg.train.batch_size * world_size
    pairs = rcp_batch_lrs()
    if not any(b == gb and _close(cfg.optim.lr, lr) for b, lr in pairs):
        raise ConfigError(f"mlperf closed division: (global batch, optim.lr) is ({gb} = train.batch_size "
                          f"{cfg.train.batch_size} x {world_size} ranks, {cfg.optim.lr}), the rules require one of "
                          f"the reference convergence points {pairs}")


def check_closed_data(train_samples: int, eval_samples: int) -> None:
    """The data must be the benchmark's: Criteo 1TB days 0-22 to train, half of day 23 to evaluate
    (checked once the data is open)."""
    if train_samples != TRAIN_SAMPLES:
        raise _differs("the training set's sample count (data)", train_samples, TRAIN_SAMPLES)
    if eval_samples != EVAL_SAMPLES:
        raise _differs("the validation set's sample count (data)", eval_samples, EVAL_SAMPLES)
