"""tools/soak.py: the growth verdict on synthetic series (pure functions), and the whole tool on
a 40-step run of the tiny config under torchrun (the JSON it writes)."""

from __future__ import annotations

import json
import os

import pytest

from tests.tools import load_tool

soak = load_tool("soak.py")


def _series():
    """Samples every 10 steps to 1000, warm-up 100. Rank 0 leaks 0.05 KiB per step after
    warm-up; rank 1 ramps up during warm-up, then stays at 2000 KiB but for one spike."""
    out = []
    for step in range(10, 1001, 10):
        r0 = 1000 + 0.05 * max(0, step - 100)
        r1 = 1000 + 10 * step if step < 100 else (3000 if step == 500 else 2000)
        out.append({"step": step, "rss_kib": {"0": r0, "1": r1}})
    return out


def test_growth_of_single_samples():
    g = soak.memory_growth(_series(), warmup_step=100, max_growth_pct=2.0)
    r0, r1 = g["0"], g["1"]
    assert (r0["warmup_step"], r0["warmup_kib"], r0["end_step"], r0["end_kib"]) == (100, 1000, 1000, 1045)
    assert r0["growth_pct"] == pytest.approx(4.5) and r0["point_growth_pct"] == pytest.approx(4.5)
    assert r0["trend_pct_per_1k_steps"] == pytest.approx(5.0)       # 0.05 KiB/step of 1000 KiB
    assert not r0["ok"]
    assert r1["warmup_kib"] == 2000 and r1["growth_pct"] == 0 and r1["ok"]   # the warm-up ramp is left out
    assert r1["peak_kib"] == 3000 and r1["peak_growth_pct"] == pytest.approx(50.0)
    assert soak.memory_growth(_series(), 100, max_growth_pct=5.0)["0"]["ok"]  # the bound is strict: < bound
    assert not soak.memory_growth(_series(), 100, max_growth_pct=4.5)["0"]["ok"]


def test_growth_of_medians_ignores_a_spike():
    g = soak.memory_growth(_series(), warmup_step=100, max_growth_pct=2.0, span=200)
    # rank 0: median of steps 100..290 (1000 .. 1009.5) and of steps 810..1000 (1035.5 .. 1045)
    assert g["0"]["warmup_kib"] == pytest.approx(1004.75) and g["0"]["end_kib"] == pytest.approx(1040.25)
    assert g["0"]["growth_pct"] == pytest.approx(100 * 35.5 / 1004.75, abs=1e-3) and not g["0"]["ok"]
    assert g["0"]["point_growth_pct"] == pytest.approx(4.5)
    assert g["1"]["growth_pct"] == 0 and g["1"]["ok"] and g["1"]["peak_growth_pct"] == pytest.approx(50.0)
    spiky = [dict(s, rss_kib={"0": 5000 if s["step"] == 1000 else 1000}) for s in _series()]
    assert soak.memory_growth(spiky, 100, 2.0, span=200)["0"]["growth_pct"] == 0      # a last-sample spike
    assert soak.memory_growth(spiky, 100, 2.0)["0"]["growth_pct"] == pytest.approx(400.0)


def test_step_times_per_window():
    # global batch 100: 10 ms per step for steps 1-100, then 20 ms per step
    samples = []
    for step in range(10, 201, 10):
        train_s = 0.01 * min(step, 100) + 0.02 * max(0, step - 100)
        rec = {"step": step, "samples_per_s": step * 100 / train_s}
        assert soak.train_seconds(rec, 100) == pytest.approx(train_s)
        samples.append({"step": step, "train_s": train_s, "wall_s": 1.0 + 1.5 * train_s, "rss_kib": {"0": step}})
    rows = soak.windows(samples, 100, 200, start_wall=1.0)
    assert [(r["first_step"], r["last_step"]) for r in rows] == [(1, 100), (101, 200)]
    assert [r["step_ms_median"] for r in rows] == [pytest.approx(10.0), pytest.approx(20.0)]
    assert [r["wall_s"] for r in rows] == [pytest.approx(1.5), pytest.approx(3.0)]
    assert [r["rss_kib"] for r in rows] == [{"0": 100}, {"0": 200}]


def test_a_config_error_stops_before_training(tmp_path, capsys):
    rc = soak.main(["--config", "configs/train_tiny.yaml", "--steps", "10", "--run-dir", str(tmp_path / "run"),
                    "train.no_such_key=1"])
    assert rc == 2
    assert "no_such_key" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.multiprocess
def test_a_short_soak_of_the_tiny_config(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = soak.main(["--config", "configs/train_tiny.yaml", "--steps", "40", "--checkpoint-every", "10",
                    "--sample-every", "5", "--max-growth-pct", "1000", "--run-dir", str(tmp_path / "run"),
                    "--json", str(out), f"data.synthetic.cache_dir={tmp_path}/cache"])
    printed = capsys.readouterr().out
    assert rc == 0, printed + open(tmp_path / "run" / "train.log").read()[-3000:]
    assert "PASS" in printed and "rank 1:" in printed
    res = json.loads(out.read_text())
    assert res["complete"] and res["passed"] and res["train_exit_status"] == 0
    assert res["steps"] == 40 and res["world_size"] == 2 and res["global_batch"] == 256
    assert res["warmup_step"] == 4 and res["median_span_steps"] == 10
    assert {"cpu_model", "cpus", "torch", "date"} <= set(res["machine"])
    assert res["date"].endswith("UTC")
    train = res["command"]["train"]
    assert train[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "train.steps=40" in train
    assert "train.checkpoint_every=10" in train and "train.resume=false" in train
    steps = [r["step"] for r in res["records"]]
    assert steps == list(range(5, 41, 5))
    for r in res["records"]:
        assert set(r["rss_kib"]) == {"0", "1"} and all(v > 50_000 for v in r["rss_kib"].values())   # KiB
        assert set(r["rss_anon_kib"]) == {"0", "1"} and r["train_s"] > 0
    assert [r["train_s"] for r in res["records"]] == sorted(r["train_s"] for r in res["records"])
    assert res["growth"] == json.loads(json.dumps(soak.memory_growth(res["records"], 4, 1000, 10)))
    assert set(res["growth"]) == {"0", "1"}
    assert len(res["windows"]) == 4 and all(w["step_ms_median"] > 0 for w in res["windows"])
    assert res["final"]["steps"] == 40 and len(res["final"]["state_sha256"]) == 64
    assert res["latest_checkpoint"] == "step-40"
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "step-40" / "manifest.json")
