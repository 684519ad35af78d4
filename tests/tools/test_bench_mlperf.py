"""tools/bench_mlperf.py's summary: the per-repeat ratios pair the two runs of each repeat
(pure functions, no training)."""

from __future__ import annotations

from tests.tools import load_tool

bench = load_tool("bench_mlperf.py")


def _rec(system: str, repeat: int, sps: float):
    return {"system": system, "repeat": repeat, "samples_per_s": sps}


def test_paired_ratios_divide_the_runs_of_one_repeat_whatever_their_order():
    # repeats alternate which system runs first; a repeat with one system only has no ratio
    records = [_rec("neo", 0, 300.0), _rec("torchrec", 0, 100.0),
               _rec("neo", 1, 90.0),
               _rec("torchrec", 2, 50.0), _rec("neo", 2, 100.0)]
    assert bench._paired_ratios(records) == [3.0, 2.0]


def test_summary_reports_the_pairs_next_to_the_ratio_of_medians(capsys):
    curve = [{"samples": 512, "auc": 0.7, "seconds": 0.1}]
    records = []
    for rep, (n, t) in enumerate([(210.0, 100.0), (150.0, 100.0), (300.0, 100.0)]):
        for system, sps in (("neo", n), ("torchrec", t)):
            records.append({"system": system, "repeat": rep, "status": "success", "samples_per_s": sps,
                            "time_to_target_s": 1.0, "final_auc": 0.7, "epoch_num": 0.5, "curve": curve})
    out = bench._print(records)
    assert out["samples_per_s_ratio"] == 2.1                      # median 210 / median 100
    assert out["samples_per_s_ratio_pairs"] == [2.1, 1.5, 3.0]
    assert "2 of 3 >= 2x" in capsys.readouterr().out


def test_time_to_target_ratio_pairs_the_repeats_both_systems_reached(capsys):
    """Repeat 1: TorchRec missed the target; repeat 2: Neo did. The ratio is over repeat 0 and 3 only
    (medians of other sets of runs would compare one system's lucky runs with all of the other's)."""
    curve = [{"samples": 512, "auc": 0.7, "seconds": 0.1}]
    times = [(1.0, 4.0), (0.5, None), (None, 1.0), (2.0, 6.0)]
    records = []
    for rep, pair in enumerate(times):
        for system, t in zip(("neo", "torchrec"), pair):
            records.append({"system": system, "repeat": rep, "status": "success" if t else "aborted",
                            "samples_per_s": 100.0, "time_to_target_s": t, "final_auc": 0.7, "epoch_num": 0.5,
                            "curve": curve})
    out = bench._print(records)
    assert out["runs_reached_target"] == {"neo": 3, "torchrec": 3}
    assert out["time_to_target_repeats"] == [0, 3]
    assert out["time_to_target_ratio"] == round(5.0 / 1.5, 3)       # medians 5.0 and 1.5 over repeats 0 and 3
    assert "both systems" in out["time_to_target_ratio_over"]
    assert "neo 3 of 4" in capsys.readouterr().out


def test_no_time_to_target_ratio_without_a_repeat_both_reached():
    curve = [{"samples": 512, "auc": 0.7, "seconds": 0.1}]
    records = [{"system": s, "repeat": 0, "status": "aborted", "samples_per_s": 100.0, "time_to_target_s": t,
                "final_auc": 0.7, "epoch_num": 0.5, "curve": curve} for s, t in (("neo", 1.0), ("torchrec", None))]
    out = bench._print(records)
    assert out["runs_reached_target"] == {"neo": 1, "torchrec": 0} and "time_to_target_ratio" not in out
