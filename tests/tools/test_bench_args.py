"""Bad command-line input to the benchmark scripts in tools/ gives argparse's clean error (exit
status 2, the flag named on stderr) at parse time, before any benchmark work runs."""

from __future__ import annotations

import pytest

from tests.tools import load_tool

CASES = [
    ("bench_embedding.py", ["--threads", "0"], "--threads"),
    ("bench_embedding.py", ["--threads", "-1"], "--threads"),
    ("bench_embedding.py", ["--threads", "a"], "--threads"),
    ("bench_embedding.py", ["--iters", "0"], "--iters"),
    ("bench_embedding.py", ["--warmup", "-1"], "--warmup"),
    ("bench_embedding.py", ["--dtypes", "bf16"], "--dtypes"),
    ("bench_embedding.py", ["--pooling-factor", "0"], "--pooling-factor"),
    ("bench_embedding.py", ["--rows", "-5"], "--rows"),
    ("bench_embedding.py", ["--json", "/proc/neo/x.json"], "--json"),
    ("bench_gather_probe.py", ["--dims", "17"], "--dims"),
    ("bench_gather_probe.py", ["--dims", "0"], "--dims"),
    ("bench_gather_probe.py", ["--table-gib", "-1"], "--table-gib"),
    ("bench_gather_probe.py", ["--lookups", "0"], "--lookups"),
    ("bench_gather_probe.py", ["--reps", "0"], "--reps"),
    ("bench_interaction.py", ["--dims", "0"], "--dims"),
    ("bench_interaction.py", ["--iters", "0"], "--iters"),
    ("bench_interaction.py", ["--processes", "0"], "--processes"),
    ("bench_sequence.py", ["--seq-len", "0"], "--seq-len"),
    ("bench_sequence.py", ["--threads", "0"], "--threads"),
    ("bench_vbe.py", ["--dedup", "0"], "--dedup"),
    ("bench_vbe.py", ["--max-len", "0"], "--max-len"),
    ("bench_eval.py", ["--reps", "0"], "--reps"),
    ("bench_eval.py", ["--json", "/proc/neo/x.json"], "--json"),
    ("bench_train.py", ["--block", "0"], "--block"),
    ("bench_train.py", ["--world-size", "0"], "--world-size"),
    ("bench_train.py", ["--steps", "0"], "--steps"),
    ("bench_train.py", ["--workloads", "multi-hot", "--tables", "27"], "--tables"),
    ("bench_train.py", ["--json", "/proc/neo/x.json"], "--json"),
    ("bench_sharded.py", ["--world-sizes", "0"], "--world-sizes"),
    ("bench_sharded.py", ["--world-sizes", "-2"], "--world-sizes"),
    ("bench_sharded.py", ["--mean-ids", "0"], "--mean-ids"),
    ("bench_sharded.py", ["--cw-dim", "0"], "--cw-dim"),
    ("bench_sharded.py", ["--tables", "0"], "--tables"),
    ("bench_sharded.py", ["--dim", "0"], "--dim"),
    ("bench_sequence_sharded.py", ["--world-sizes", "0"], "--world-sizes"),
    ("bench_planner.py", ["--repeat", "0"], "--repeat"),
    ("bench_planner_fidelity.py", ["--world-sizes", "0"], "--world-sizes"),
    ("bench_planner_fidelity.py", ["--rounds", "0"], "--rounds"),
    ("bench_cache.py", ["--parts", "nonsense"], "--parts"),
    ("bench_cache.py", ["--disk-gib", "0.01"], "--disk-gib"),
    ("bench_cache.py", ["--disk-steps", "0"], "--disk-steps"),
    ("bench_cache.py", ["--rounds", "0"], "--rounds"),
    ("bench_data.py", ["--tsv-lines", "0"], "--tsv-lines"),
    ("bench_data.py", ["--rows", "0"], "--rows"),
    ("soak.py", ["--poll-s", "-1"], "--poll-s"),
    ("soak.py", ["--window", "-5"], "--window"),
    ("soak.py", ["--json", "/proc/neo/x.json"], "--json"),
    ("bench_collectives.py", ["--iters", "0"], "--iters"),
    ("bench_stream.py", ["--sizes", "0"], "--sizes"),
    ("bench_id_check.py", ["--bad", "1.5"], "--bad"),
    ("bench_id_check.py", ["--batch", "0"], "--batch"),
    ("bench_id_check.py", ["--threads", "0"], "--threads"),
]


@pytest.mark.parametrize("script,argv,flag", CASES, ids=[f"{s}:{' '.join(a)}" for s, a, _ in CASES])
def test_bad_argument_is_an_argparse_error(script, argv, flag, capsys):
    main = load_tool(script).main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and flag in err, err


def test_json_path_accepts_a_new_folder_and_refuses_a_folder(tmp_path):
    import argparse

    common = load_tool("bench_common.py")
    assert common.json_path(str(tmp_path / "new" / "x.json")) == str(tmp_path / "new" / "x.json")
    with pytest.raises(argparse.ArgumentTypeError):
        common.json_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError):
        common.json_path("/proc/neo/x.json")


def test_int_list_helpers():
    import argparse

    common = load_tool("bench_common.py")
    assert common.positive_int_list("1,2") == [1, 2]
    assert common.multiple_of_list(16)("16,64") == [16, 64]
    for bad in ("0", "-1", "a", "1,,2", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            common.positive_int_list(bad)
    assert common.nonneg_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        common.positive_float("nan")


@pytest.mark.parametrize("quick", [False, True])
def test_quick_fills_in_only_the_flags_not_given(quick):
    import argparse

    common = load_tool("bench_common.py")
    args = argparse.Namespace(quick=quick, rows=None, steps=7)
    common.apply_quick(args, {"rows": 100, "steps": 10}, {"rows": 5, "steps": 2})
    assert (args.rows, args.steps) == ((5 if quick else 100), 7)


QUICK_CASES = [
    ("bench_planner_fidelity.py", ["--steps", "50"], {"steps": 50, "rounds": 1, "world_sizes": [1, 2]}),
    ("bench_planner_fidelity.py", ["--rounds", "2", "--mixes", "wide_mix"], {"rounds": 2, "mixes": "wide_mix", "steps": 30}),
    ("bench_pipeline.py", ["--steps", "40", "--width", "128"], {"steps": 40, "width": 128, "batch": 128, "repeats": 5}),
    ("bench_async.py", ["--pipeline-steps", "100"], {"pipeline_steps": 100, "steps": 48, "samples": 16384}),
    ("bench_mlperf.py", ["--repeats", "3"], {"repeats": 3}),
]


@pytest.mark.parametrize("script,argv,want", QUICK_CASES, ids=[f"{s}:{' '.join(a)}" for s, a, _ in QUICK_CASES])
def test_quick_keeps_an_explicit_flag(script, argv, want):
    """--quick fills in only the flags not given (bench_common.apply_quick): parsed, nothing run."""
    args = load_tool(script).parse_args(["--quick"] + argv)
    assert {k: getattr(args, k) for k in want} == want


@pytest.mark.parametrize("script", sorted({s for s, _, _ in QUICK_CASES}))
def test_without_quick_every_workload_flag_gets_its_default(script):
    tool = load_tool(script)
    args = tool.parse_args([])
    assert {k: getattr(args, k) for k in tool.DEFAULTS} == tool.DEFAULTS
