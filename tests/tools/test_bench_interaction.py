"""tools/bench_interaction.py: every system agrees with the torch path before it is timed, and
the ratios against each peer are the peer's time over Neo's."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from tests.tools import load_tool

bench = load_tool("bench_interaction.py")

# TorchRec is in the dev requirements (tools/setup.sh --dev): where it is missing or broken,
# these tests fail rather than skip.
assert bench.torchrec_available(), "TorchRec (torchrec.models.dlrm) does not import: run tools/setup.sh --dev"


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """run_shape sets torch's thread count: restore it for the tests after these."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def small_args(torchrec: bool, bounds: bool = False) -> SimpleNamespace:
    return SimpleNamespace(features=5, batch=16, iters=2, warmup=1, all_variants=False, torchrec=torchrec,
                           bounds=bounds)


def test_torchrecs_interaction_arch_is_timed_beside_neo_and_torch_with_both_ratios(capsys):
    records = bench.run_shape(small_args(torchrec=True), 8, 1, machine={})
    names = [r["system"] for r in records]
    assert names[-2:] == ["torch", "torchrec"] and names[0].startswith("neo-")
    bench.print_records(records)
    neo, torch_path, torchrec = records[0], records[-2], records[-1]
    for ref, key in ((torch_path, "speedup_vs_torch"), (torchrec, "speedup_vs_torchrec")):
        assert neo[key] == {p: ref[p] / neo[p] for p in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")}
    assert set(neo["speedup_vs_torch_paired"]) == set(neo["speedup_vs_torchrec_paired"]) == {"fwd_ms", "bwd_ms",
                                                                                             "fwd_bwd_ms"}
    bench.add_verdicts(records, 5.0)
    bench.print_records(records)
    out = capsys.readouterr().out
    assert "torchrec / neo" in out and "paired" in out and "95% CI" in out
    assert f"5x: {neo['target_verdict']}" in out


def test_paired_ratios_are_the_median_of_each_iterations_ratio():
    neo, torch_path = bench.System("neo-avx2", None), bench.System("torch", None)
    neo.times = {"fwd": [1.0, 2.0, 4.0], "bwd": [2.0, 2.0, 2.0]}
    torch_path.times = {"fwd": [5.0, 4.0, 16.0], "bwd": [4.0, 10.0, 6.0]}
    records = [dict(system="neo-avx2"), dict(system="torch")]
    bench.add_paired(records, [neo, torch_path])
    # per iteration: fwd 5, 2, 4; bwd 2, 5, 3; fwd + bwd 9 / 3, 14 / 4, 22 / 6 (the medians' ratio
    # would be 5 / 2 forward: another figure)
    assert records[0]["speedup_vs_torch_paired"] == {"fwd_ms": 4.0, "bwd_ms": 3.0, "fwd_bwd_ms": 3.5}
    assert "speedup_vs_torch_paired" not in records[1]
    # three ratios reach no 95% interval: the whole range of each phase's ratios
    assert records[0]["speedup_vs_torch_paired_ci95"] == {"fwd_ms": [2.0, 5.0], "bwd_ms": [2.0, 5.0],
                                                          "fwd_bwd_ms": [3.0, 11.0 / 3.0]}


@pytest.mark.parametrize("ci, verdict", [([5.0, 5.4], "met"), ([5.2, 5.9], "met"), ([4.6, 4.99], "not met"),
                                         ([4.9, 5.1], "undecided"), ([4.0, 5.0], "undecided")])
def test_the_target_is_judged_by_the_whole_interval(ci, verdict):
    records = [dict(system="neo-avx2", speedup_vs_torch_paired_ci95={"fwd_bwd_ms": ci}), dict(system="torch")]
    bench.add_verdicts(records, 5.0)
    assert records[0]["target_verdict"] == verdict and records[0]["target_vs_torch"] == 5.0
    assert "target_verdict" not in records[1]


def test_torchrecs_output_is_checked_against_the_torch_path_before_timing(monkeypatch):
    # InteractionArch with its pairs in another order (the upper triangle reversed) must not be timed.
    real = bench.TorchRecInteraction.__init__

    def wrong_pairs(self, F, D):
        real(self, F, D)
        self.arch.triu_indices = self.arch.triu_indices.flip(1)

    monkeypatch.setattr(bench.TorchRecInteraction, "__init__", wrong_pairs)
    with pytest.raises(AssertionError):
        bench.run_shape(small_args(torchrec=True), 8, 1, machine={})


def test_without_torchrec_only_neo_and_torch_run():
    records = bench.run_shape(small_args(torchrec=False), 8, 1, machine={})
    assert [r["system"] for r in records][-1] == "torch"
    assert all("torchrec" not in r["system"] for r in records)


def test_all_variants_times_the_forwards_other_tilings_and_the_lower_isas():
    """--all-variants: at D 64 and 128 the AVX-512 or AVX2 kernels' forward also runs in the
    tilings "auto" did not choose (each record says which ran), and every lower ISA variant
    runs (in the tiles "auto" picks for it: tall in the AVX2 kernels on Zen 3 to 5, else
    narrow); each is checked against the torch path before it is timed."""
    from neo import _C

    args = small_args(torchrec=False)
    args.all_variants = True
    active = _C.cpu_isa()
    lower = bench.ORDER[:bench.ORDER.index(active)]
    for D in (64, 128):
        records = bench.run_shape(args, D, 1, machine={})
        ran = {r["system"]: r["forward_tiles"] for r in records}
        chosen = _C.interaction_forward_tiles(D)
        expected = {f"neo-{active}": chosen, "torch": None}
        features = dict(_C.cpu_features())
        tall_cpu = features["amd_family_19h"] or features["amd_family_1ah"]     # AMD Zen 3 to 5 (csrc/cpu_isa.h)
        expected.update({f"neo-{isa}": "tall" if isa == "avx2" and tall_cpu else "narrow" for isa in lower})
        if active == "avx512":
            others = {"narrow", "grouped", "tall"} | ({"wide"} if D >= 96 else set())
            expected.update({f"neo-avx512-{t}": t for t in others - {chosen}})
        if active == "avx2":
            expected.update({f"neo-avx2-{t}": t for t in {"narrow", "tall"} - {chosen}})
        assert ran == expected


def test_bounds_are_the_larger_of_the_arithmetic_and_the_measured_traffic(capsys):
    """--bounds: the traffic probe joins the rotation as system "traffic" (not checked against
    the torch path: its outputs mean nothing), and Neo's records get the floors: the
    multiply-adds (3 B P D) at the measured FMA rate, the probe's own times, and the copy
    bandwidth model of the same bytes (forward n D + D + P, backward 2 n D + D + P floats a
    sample) beside them."""
    records = bench.run_shape(small_args(torchrec=False, bounds=True), 8, 1, machine={})
    assert [r["system"] for r in records][-2:] == ["torch", "traffic"]
    bench.add_verdicts(records, 1e6)                                      # a target no floor reaches
    bench.add_bounds(records, "avx2")
    bench.print_bounds(records)
    bench.print_records(records)
    neo, torch_path, traffic = records[0], records[-2], records[-1]
    B, n, D, P = 16, 6, 8, 15
    assert neo["bound_fma_ms"] == pytest.approx(1e3 * 3 * B * P * D / neo["bound_fma_per_s"])
    assert (neo["bound_traffic_ms"], neo["bound_traffic_fwd_ms"], neo["bound_traffic_bwd_ms"]) == \
        (traffic["fwd_bwd_ms"], traffic["fwd_ms"], traffic["bwd_ms"])
    model = 4 * B * (n * D + D + P) + 4 * B * (2 * n * D + D + P)
    assert neo["bound_memory_ms"] == pytest.approx(1e3 * model / (neo["bound_copy_gb_s"] * 1e9))
    assert neo["bound_working_set_mib"] == 4                               # both passes' traffic, at least 4 MiB
    assert neo["bound_floor_ms"] == max(neo["bound_fma_ms"], neo["bound_traffic_ms"])
    assert neo["torch_over_floor"] == pytest.approx(torch_path["fwd_bwd_ms"] / neo["bound_floor_ms"])
    assert "bound_floor_ms" not in torch_path and "bound_floor_ms" not in traffic
    assert "speedup_vs_torch" not in traffic                               # not a system compared with torch
    assert neo["target_within_floor"] is False and "target_within_floor" not in torch_path
    out = capsys.readouterr().out
    assert "torch / floor" in out and "the 1e+06x target is beyond this run's floor" in out
    bench.add_verdicts(records, neo["torch_over_floor"] / 2)             # one within it: nothing printed
    bench.add_bounds(records, "avx2")
    bench.print_bounds(records)
    assert neo["target_within_floor"] is True and "beyond this run's floor" not in capsys.readouterr().out


def test_kernels_alone_are_timed_per_phase_in_l2_and_from_memory():
    """The kernels-alone timings: forward and backward apart, per B samples, on a set sized to
    the L2 budget (at least 8 samples, at most B) and on the B samples."""
    phases = bench.kernel_in_and_out_of_cache(F=5, D=16, B=64, l2_bytes=4 * 1024)
    assert set(phases) == {"in_l2", "from_memory"}
    for fwd_ms, bwd_ms in phases.values():
        assert 0 < fwd_ms < 1e3 and 0 < bwd_ms < 1e3


def test_bounds_of_the_baseline_kernels_are_a_note_and_the_records_are_written(tmp_path):
    """The FMA probe knows avx2 and avx512 only: --isa baseline --bounds says so and still writes
    its records (before: a KeyError after the timings, nothing written; audit of 2026-11-30)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "b.json"                # a process of its own: --isa re-executes the script
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "bench_interaction.py")
    p = subprocess.run([sys.executable, tool, "--isa", "baseline", "--bounds", "--features", "4", "--dims", "16",
                        "--batch", "32", "--iters", "1", "--warmup", "0", "--no-torchrec", "--threads", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "--bounds left out" in p.stdout, p.stderr[-2000:]
    records = json.loads(out.read_text())
    assert records and all(r["bounds_note"] == "no FMA floor for the baseline kernels" for r in records)


def test_times_are_grouped_by_the_system_that_ran_just_before():
    s = bench.System("neo-avx2", None)
    s.times = {"fwd": [1.0, 2.0, 3.0, 10.0], "bwd": [1.0, 1.0, 1.0, 10.0]}
    s.after = ["torch", "torchrec", "torch", "torchrec"]
    # fwd + bwd: after torch 2 and 4 s (median 3), after torchrec 3 and 20 (median 11.5); in ms
    assert bench.by_predecessor(s) == {"torch": 3000.0, "torchrec": 11500.0}


def test_every_record_has_its_times_by_predecessor_and_the_differences_are_printed(capsys):
    records = bench.run_shape(small_args(torchrec=True), 8, 1, machine={})
    names = {r["system"] for r in records}
    for r in records:
        by = r["fwd_bwd_ms_by_predecessor"]
        # each timed iteration follows another system of the run, never the same one
        # (bench_common.call_orders); the warm-up iteration came first, so none follows nothing
        assert by and set(by) <= names - {r["system"]} and all(v > 0 for v in by.values())
    fake = [dict(system="neo-avx2", dim=8, threads=1, fwd_bwd_ms_by_predecessor={"torch": 1.0, "torchrec": 1.2}),
            dict(system="torch", dim=8, threads=1, fwd_bwd_ms_by_predecessor={"neo-avx2": 5.0, "torchrec": 5.1})]
    bench.print_by_predecessor(fake)
    out = capsys.readouterr().out
    assert "neo-avx2            D=8    threads=1: after torch 1.00, after torchrec 1.20" in out
    assert "after neo-avx2" not in out   # torch's two medians within 5% of each other: not printed


def test_each_measuring_process_gets_every_option_but_processes_and_json():
    """--processes: child_argv, parsed again, gives back every option of the command line it came
    from (a new option that child_argv drops fails here), with --processes and --json left out."""
    parser = bench.build_parser()
    for argv in ([], ["--features", "7", "--dims", "16,32", "--batch", "64", "--threads", "1,2", "--iters", "5",
                      "--warmup", "0", "--all-variants", "--bounds", "--no-torchrec", "--target", "4.5",
                      "--isa", "avx2", "--processes", "3", "--json", "x.json"]):
        args = parser.parse_args(argv)
        child = parser.parse_args(bench.child_argv(args))
        mine = {k: v for k, v in vars(args).items() if k not in ("processes", "json")}
        assert {k: v for k, v in vars(child).items() if k not in ("processes", "json")} == mine
        assert child.processes == 1 and child.json is None


def fake_run(neo_ms, torch_ms, after_neo, after_torch):
    """One process's records at D 8, one thread: Neo's and torch's forward + backward times per iteration."""
    def record(system, ms, after):
        return dict(system=system, features=5, n=6, dim=8, batch=16, threads=1, forward_tiles=None, machine={},
                    fwd_ms=0.0, bwd_ms=0.0, fwd_bwd_ms=0.0, target_verdict="process's own",
                    speedup_vs_torch_paired={"fwd_bwd_ms": 0.0},
                    iterations=dict(fwd_ms=[m / 2 for m in ms], bwd_ms=[m / 2 for m in ms], after=after))
    return [record("neo-avx2", neo_ms, after_neo), record("torch", torch_ms, after_torch)]


def test_processes_are_pooled_iteration_by_iteration_each_pair_within_its_process(capsys):
    """pool_processes: medians over every process's iterations, the paired ratios over the pairs of
    each process (process 1: 10 / 2 and 12 / 2; process 2: 30 / 6 and 36 / 6: ratios 5, 6, 5, 6;
    pairing across processes would give 10 / 6 or 36 / 2 too), each process's record without its
    iterations in per_process."""
    runs = [fake_run([2.0, 2.0], [10.0, 12.0], ["torch"] * 2, ["neo-avx2"] * 2),
            fake_run([6.0, 6.0], [30.0, 36.0], ["torch", "none"], ["neo-avx2"] * 2)]
    records = bench.pool_processes(runs, target=5.0)
    neo, torch_path = records
    assert (neo["system"], torch_path["system"]) == ("neo-avx2", "torch")
    assert neo["processes"] == 2 and neo["iters"] == 4
    assert neo["fwd_bwd_ms"] == pytest.approx(4.0) and torch_path["fwd_bwd_ms"] == pytest.approx(21.0)
    assert neo["fwd_ms"] == pytest.approx(2.0) and neo["bwd_ms"] == pytest.approx(2.0)
    assert neo["speedup_vs_torch_paired"]["fwd_bwd_ms"] == pytest.approx(5.5)
    assert neo["speedup_vs_torch_paired_ci95"]["fwd_bwd_ms"] == pytest.approx([5.0, 6.0])   # 4 ratios: their range
    assert neo["target_verdict"] == "met" and "target_verdict" not in torch_path
    assert neo["fwd_bwd_ms_by_predecessor"] == pytest.approx({"torch": 2.0, "none": 6.0})   # 2, 2, 6 after torch
    assert [p["target_verdict"] for p in neo["per_process"]] == ["process's own"] * 2
    assert all("iterations" not in p and "machine" not in p for p in neo["per_process"])
    bench.print_records(records)
    bench.print_per_process(records)
    out = capsys.readouterr().out
    assert "neo-avx2            D=8    threads=1: 0.00x process's own, 0.00x process's own" in out


def test_processes_run_apart_and_their_records_are_pooled(tmp_path):
    """--processes 2 end to end: two child processes, their records pooled into the JSON."""
    import json
    import subprocess
    import sys

    from tests.tools import TOOLS

    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, os.path.join(TOOLS, "bench_interaction.py"), "--processes", "2",
                        "--features", "4", "--dims", "16", "--batch", "32", "--iters", "3", "--warmup", "1",
                        "--no-torchrec", "--threads", "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "== process 2 of 2" in p.stdout and "torch / neo per process" in p.stdout
    records = json.loads(out.read_text())
    assert [r["system"] for r in records][-1] == "torch" and records[0]["system"].startswith("neo-")
    for r in records:
        assert r["processes"] == 2 and r["iters"] == 6 and len(r["per_process"]) == 2
        assert all(x["iters"] == 3 for x in r["per_process"])
    assert "target_verdict" in records[0] and all("target_verdict" in x for x in records[0]["per_process"])
