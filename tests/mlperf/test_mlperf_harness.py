"""``neo mlperf`` end to end on the scaled config: to the target, MLPerf's compliance checker on the
result files, the logged values against the config, two ranks, a run that cannot reach its target.

The runs go through the real command (a subprocess) or ``tests.multiprocess`` (the test process
never holds a process group). The unit tests of the pieces are in test_mlperf_pieces.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlperf_logging  # noqa: F401  (pinned in requirements.txt: missing is a failure, not a skip)
import pytest
import yaml

from neo.config import config_from_dict
from tests.multiprocess import run_multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "mlperf_dcnv2_tiny.yaml")
REQUIRED = ["cache_clear", "init_start", "init_stop", "run_start", "run_stop", "submission_benchmark",
            "submission_division", "submission_org", "submission_platform", "submission_status", "epoch_start",
            "epoch_stop", "eval_start", "eval_stop", "eval_accuracy", "eval_samples", "train_samples",
            "global_batch_size", "gradient_accumulation_steps", "seed", "opt_name", "opt_base_learning_rate",
            "opt_adagrad_learning_rate_decay", "opt_weight_decay", "opt_adagrad_initial_accumulator_value",
            "opt_adagrad_epsilon", "opt_learning_rate_warmup_steps", "opt_learning_rate_decay_start_step",
            "opt_learning_rate_decay_steps"]


def read_log(path: str):
    """The ``:::MLLOG`` records of a result file, in order."""
    with open(path) as f:
        return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if line.startswith(":::MLLOG ")]


def value(records, key):
    (rec,) = [r for r in records if r["key"] == key]
    return rec["value"]


def compliance(path: str, tmp: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                          "--ruleset", "6.0.0", "--log_output", os.path.join(tmp, "checker.log"), path],
                         capture_output=True, text=True, timeout=120, cwd=tmp)
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("mlperf-cache"))


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory, cache):
    """``neo mlperf`` on the tiny config, 3 seeds, one process: (results dir, stdout)."""
    out_dir = str(tmp_path_factory.mktemp("mlperf-results"))
    proc = subprocess.run([sys.executable, "-m", "neo.cli", "mlperf", TINY, "--results-dir", out_dir, "--seeds", "3",
                           f"data.synthetic.cache_dir={cache}"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out_dir, proc.stdout


def test_tiny_config_reaches_its_target_and_passes_the_compliance_checker(tiny_results, tmp_path):
    out_dir, stdout = tiny_results
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    assert [r["seed"] for r in summary["runs"]] == [0, 1, 2]
    for r in summary["runs"]:
        assert r["status"] == "success" and r["final_auc"] >= 0.745 and 0 < r["epoch_num"] <= 1.0
        assert r["time_to_train_s"] < 180
        out = compliance(r["result_file"], str(tmp_path))
        assert "SUCCESS" in out and "FAILED" not in out, out
    times = sorted(r["time_to_train_s"] for r in summary["runs"])
    assert summary["olympic"] and summary["score_s"] == pytest.approx(times[1], abs=1e-3)
    assert "olympic mean" in stdout and "score:" in stdout


def test_logged_values_are_the_runs(tiny_results):
    out_dir, _ = tiny_results
    with open(TINY) as f:
        cfg = config_from_dict(yaml.safe_load(f))
    recs = read_log(os.path.join(out_dir, "result_1.txt"))
    keys = [r["key"] for r in recs]
    assert not [k for k in REQUIRED if k not in keys]
    assert value(recs, "submission_benchmark") == "dlrm_dcnv2" and value(recs, "submission_division") == "open"
    assert value(recs, "seed") == 1                                  # run i: train.seed + i
    assert value(recs, "global_batch_size") == cfg.train.batch_size   # one rank
    assert value(recs, "gradient_accumulation_steps") == 1
    assert value(recs, "train_samples") == cfg.data.synthetic.num_samples
    assert value(recs, "eval_samples") == cfg.data.synthetic.val_samples
    assert value(recs, "opt_name") == "adagrad" and value(recs, "opt_base_learning_rate") == cfg.optim.lr
    assert value(recs, "opt_adagrad_epsilon") == cfg.optim.eps
    for k in ("opt_adagrad_learning_rate_decay", "opt_weight_decay", "opt_adagrad_initial_accumulator_value",
              "opt_learning_rate_warmup_steps", "opt_learning_rate_decay_start_step", "opt_learning_rate_decay_steps"):
        assert value(recs, k) == 0, k
    # order: init, then run_start, evaluations, run_stop last
    assert keys.index("init_start") < keys.index("init_stop") < keys.index("run_start") < keys.index("eval_start")
    assert keys[-2:] == ["epoch_stop", "run_stop"] and recs[-1]["metadata"]["status"] == "success"
    # eval every floor(0.05 x 128) = 6 steps of 512 samples: epoch_num = 6 k x 512 / 65536
    evals = [r for r in recs if r["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in evals] == [6 * (k + 1) * 512 / 65536 for k in range(len(evals))]
    assert evals[-1]["value"] >= cfg.mlperf.target_auc > max(e["value"] for e in evals[:-1])
    with open(os.path.join(out_dir, "run_1", "metrics.jsonl")) as f:
        final = [json.loads(x) for x in f if '"final"' in x][-1]
    assert final["step"] == 6 * len(evals)                             # the trainer stopped there


def _harness(rank: int, world_size: int, cache: str, runs):
    """Each (results dir, seeds, overrides) through run_benchmark on one process group."""
    from neo.mlperf.harness import run_benchmark
    from neo.train.build import init_process_groups

    out, pg = [], None
    for results_dir, seeds, overrides in runs:
        with open(TINY) as f:
            cfg = config_from_dict(yaml.safe_load(f), [f"data.synthetic.cache_dir={cache}"] + list(overrides))
        pg = pg or init_process_groups(cfg.train)
        out.append(run_benchmark(cfg, results_dir, seeds=seeds, pg=pg, say=lambda *a, **k: None))
    return out


def test_two_ranks_then_a_run_that_cannot_reach_its_target(cache, tmp_path):
    ok, bad = str(tmp_path / "two"), str(tmp_path / "aborted")
    runs = [(ok, 1, ["train.batch_size=256"]),                          # global batch 512, as one process
            (bad, 1, ["train.batch_size=256", "mlperf.target_auc=0.9999", "mlperf.max_epochs=0.1",
                      "optim.lr=0.03", "train.seed=7"])]
    out = run_multiprocess(_harness, 2, cache, runs, timeout_s=240, env={"OMP_NUM_THREADS": "1"})
    for a, b in zip(out[0], out[1]):                                   # every rank: the same gathered AUCs
        assert [(r["status"], [(p["step"], p["auc"]) for p in r["curve"]]) for r in a["runs"]] == \
            [(r["status"], [(p["step"], p["auc"]) for p in r["curve"]]) for r in b["runs"]]
    two, aborted = out[0]
    assert two["world_size"] == 2 and two["runs"][0]["status"] == "success"
    recs = read_log(os.path.join(ok, "result_0.txt"))
    assert value(recs, "global_batch_size") == 512 and value(recs, "eval_samples") == 4096
    assert "SUCCESS" in compliance(os.path.join(ok, "result_0.txt"), str(tmp_path))

    run = aborted["runs"][0]
    assert run["status"] == "aborted" and aborted["score_s"] is None and aborted["converged"] == 0
    assert run["epoch_num"] == pytest.approx(13 * 512 / 65536)          # ceil(0.1 x 128) = 13 steps
    recs = read_log(os.path.join(bad, "result_7.txt"))
    assert recs[-1]["key"] == "run_stop" and recs[-1]["metadata"]["status"] == "aborted"
    assert value(recs, "opt_base_learning_rate") == 0.03 and value(recs, "seed") == 7
    assert [r["metadata"]["epoch_num"] for r in recs if r["key"] == "eval_accuracy"][-1] == run["epoch_num"]
    assert "SUCCESS" in compliance(os.path.join(bad, "result_7.txt"), str(tmp_path))   # aborted is a valid log
