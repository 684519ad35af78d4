"""The pieces of ``neo mlperf``: olympic mean, cadence, the hook's log lines, the closed division's
refusals and the command's errors (no training here; end to end: test_mlperf_harness.py)."""

from __future__ import annotations

import math
import os

import pytest

from neo.config import ConfigError, load_config
from neo.mlperf.hook import Cadence, MLPerfHook
from neo.mlperf.summary import olympic_mean

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "mlperf_dcnv2_tiny.yaml")
GPU = os.path.join(ROOT, "configs", "mlperf_dcnv2_gpu.yaml")


def test_olympic_mean_drops_fastest_and_slowest():
    s = olympic_mean([60, 50, 70, 55, 65])
    assert s.olympic and s.value_s == pytest.approx(60.0) and "dropping the fastest and the slowest" in s.method
    one_aborted = olympic_mean([60, math.inf, 50, 55])                  # the aborted run is the one dropped
    assert one_aborted.value_s == pytest.approx(57.5)
    assert olympic_mean([60, math.inf, math.inf, 50]).value_s is None
    few = olympic_mean([10, 20])
    assert not few.olympic and few.value_s == pytest.approx(15.0) and "plain mean" in few.method
    assert olympic_mean([10, math.inf]).value_s is None


def test_cadence():
    c = Cadence.of(0.05, 1.0, steps_per_epoch=128, global_batch=512, train_samples=65536)
    assert (c.eval_every_steps, c.max_steps) == (6, 128)
    assert c.epoch_num(6) == 6 * 512 / 65536
    full = Cadence.of(0.05, 1.0, steps_per_epoch=4_195_197_692 // 8 // 8192, global_batch=65536,
                      train_samples=4_195_197_692)
    assert full.eval_every_steps == 3200                               # the reference's cadence
    assert Cadence.of(0.05, 0.1, 128, 512, 65536).max_steps == 13
    assert Cadence.of(0.05, 1.0, 10, 512, 5120).eval_every_steps == 1  # at least every step


class _FakeLog:
    def __init__(self):
        from mlperf_logging.mllog import constants

        self.constants, self.lines, self.times_ms, self.now = constants, [], {}, 0

    def _put(self, kind, key, value=None, metadata=None):
        self.now += 1000
        self.times_ms[key] = self.now
        self.lines.append((kind, key, value, dict(metadata or {})))
        return self.now

    def start(self, key, value=None, metadata=None):
        return self._put("start", key, value, metadata)

    def end(self, key, value=None, metadata=None):
        return self._put("end", key, value, metadata)

    def event(self, key, value=None, metadata=None):
        return self._put("event", key, value, metadata)


def _drive(hook, aucs):
    """Steps until the hook stops, evaluating with the given AUCs in turn."""
    aucs, step = list(aucs), 0
    while hook.status is None:
        step += 1
        if hook.after_step(step):
            _, stop = hook.evaluate(step, lambda: {"auc": aucs.pop(0)})
            if stop:
                break
    return step


def test_hook_epochs_evaluations_and_stop():
    log = _FakeLog()
    hook = MLPerfHook(log, Cadence.of(0.5, 3.0, steps_per_epoch=4, global_batch=10, train_samples=40), 0.8)
    hook.run_start()
    assert _drive(hook, [0.6, 0.7, 0.75, 0.81]) == 8                    # evaluations at steps 2, 4, 6, 8
    assert hook.status == "success" and hook.time_to_train_s > 0
    seq = [(k, m.get("epoch_num")) for kind, k, v, m in log.lines if k != "eval_accuracy"]
    assert seq[:2] == [("run_start", None), ("epoch_start", 0.0)]
    # epoch 1 ends at step 4, after its evaluation; the run stops at step 8 (epoch_num 2.0)
    assert seq[2:] == [("eval_start", 0.5), ("eval_stop", 0.5), ("eval_start", 1.0), ("eval_stop", 1.0),
                       ("epoch_stop", 1.0), ("epoch_start", 1.0), ("eval_start", 1.5), ("eval_stop", 1.5),
                       ("eval_start", 2.0), ("eval_stop", 2.0), ("epoch_stop", 2.0), ("run_stop", 2.0)]
    assert log.lines[-1][3]["status"] == "success"
    assert [p.auc for p in hook.curve] == [0.6, 0.7, 0.75, 0.81] and hook.curve[-1].samples == 80

    log = _FakeLog()
    hook = MLPerfHook(log, Cadence.of(0.5, 1.25, steps_per_epoch=4, global_batch=10, train_samples=40), 0.9)
    hook.run_start()
    assert _drive(hook, [0.6, 0.7, 0.75]) == 5                          # ceil(1.25 x 4): evaluated, aborted
    assert hook.status == "aborted" and log.lines[-1][3] == {"status": "aborted", "epoch_num": 1.25}


@pytest.mark.parametrize("override, field, got, want", [
    ("model.dcn_rank=256", "model.dcn_rank", "256", "512"),
    ("model.over_arch=[1024,512,256,1]", "model.over_arch", "[1024, 512, 256, 1]", "[1024, 1024, 512, 256, 1]"),
    ("tables[3].dim=64", "tables[3].dim", "64", "128"),
    ("optim.type=sgd", "optim.type", "'sgd'", "'adagrad'"),
    ("optim.warmup_steps=100", "optim.warmup_steps", "100", "0"),
    ("optim.sparse.type=rowwise_adagrad", "tables[0].optimizer (t0; or optim.sparse).type", "'rowwise_adagrad'",
     "'adagrad'"),
    ("optim.lr=0.005", "tables[0].optimizer (t0; or optim.sparse).lr", "0.004", "0.005"),
    ("mlperf.target_auc=0.8", "mlperf.target_auc", "0.8", "0.80275"),
    ("mlperf.eval_every_epochs=0.1", "mlperf.eval_every_epochs", "0.1", "0.05"),
])
def test_closed_division_refuses_what_the_rules_do_not_allow(override, field, got, want):
    from neo.mlperf.rules import check_closed_config

    check_closed_config(load_config(GPU))                              # the reference config passes
    with pytest.raises(ConfigError) as e:
        check_closed_config(load_config(GPU, [override]))
    assert f"{field} is {got}, the rules require {want}" in str(e.value)


def test_closed_division_batch_lr_pair_and_target():
    from neo.mlperf.rules import check_closed_config, check_closed_run, rcp_batch_lrs

    assert (65536, 0.004) in rcp_batch_lrs()
    cfg = load_config(GPU)
    check_closed_run(cfg, 8)                                           # 8 x 8192 at 0.004
    with pytest.raises(ConfigError, match=r"\(global batch, optim.lr\) is \(49152 = train.batch_size 8192 x 6 "
                                          r"ranks, 0.004\).*\(65536, 0.004\)"):
        check_closed_run(cfg, 6)
    with pytest.raises(ConfigError, match="mlperf.target_auc: the closed division needs the rules' target 0.80275"):
        check_closed_config(load_config(GPU, ["mlperf.target_auc=null"]))


def test_command_errors(tmp_path, capsys):
    from neo.cli import main

    def err(*argv):
        assert main(["mlperf", *argv]) == 2
        return capsys.readouterr().err

    d = str(tmp_path / "results")
    assert "--seeds: must be >= 1" in err(TINY, "--results-dir", d, "--seeds", "0")
    f = tmp_path / "a_file"
    f.write_text("x")
    assert f"--results-dir {str(f)!r}: is a file" in err(TINY, "--results-dir", str(f))
    assert "model.dense_arch is [32, 16], the rules require [512, 256, 128]" in err(
        TINY, "--results-dir", d, "--division", "closed")
    assert "mlperf.target_auc: neo mlperf stops at this AUROC; the config sets none" in err(
        TINY, "--results-dir", d, "mlperf.target_auc=null")
    assert "model.dcn_rank is 256, the rules require 512" in err(GPU, "--results-dir", d, "--division", "closed",
                                                                 "model.dcn_rank=256")
    assert "mlperf.max_epochs: must be a finite number > 0" in err(TINY, "--results-dir", d, "mlperf.max_epochs=0")
    assert "mlperf.submission_status: 'x' is not one of" in err(TINY, "--results-dir", d, "mlperf.submission_status=x")
    # an earlier run's results are never mixed with a new run's: refused, or replaced with --overwrite
    old = tmp_path / "old"
    (old / "run_0").mkdir(parents=True)
    (old / "run_0" / "metrics.jsonl").write_text("{}\n")
    (old / "result_0.txt").write_text(":::MLLOG {}\n")
    (old / "summary.json").write_text("{}")
    (old / "notes.txt").write_text("mine")
    assert (f"--results-dir {str(old)!r}: holds an earlier run's results (result_0.txt, run_0, summary.json); "
            "pass --overwrite") in err(TINY, "--results-dir", str(old))
    assert sorted(os.listdir(old)) == ["notes.txt", "result_0.txt", "run_0", "summary.json"]   # untouched
    # a run refused while it is set up (after its result file was opened) leaves no partial result
    piped = str(tmp_path / "piped")
    assert "parallel.pipeline.stages: the world size 1 is not a multiple of 2 stages" in err(
        TINY, "--results-dir", piped, "parallel.pipeline.stages=2", f"data.synthetic.cache_dir={tmp_path}/cache")
    assert not [n for n in os.listdir(piped) if n.startswith("result_")]


def test_overwrite_replaces_only_an_earlier_runs_results(tmp_path):
    from neo.mlperf.harness import prepare_results_dir

    old = tmp_path / "old"
    (old / "run_3").mkdir(parents=True)
    (old / "result_3.txt").write_text("x")
    (old / "summary.json").write_text("{}")
    (old / "notes.txt").write_text("mine")
    prepare_results_dir(str(old), first_rank=False)                  # another rank: rank 0 checks
    prepare_results_dir(str(old), overwrite=True)
    assert os.listdir(old) == ["notes.txt"]
    prepare_results_dir(str(old))                                    # nothing of a run left: accepted
