"""``neo plan`` end to end through neo.cli.main."""

import json
import os
from pathlib import Path

import pytest

from neo.cli import main
from neo.planner import Plan, ShardingType

EXAMPLE = str(Path(__file__).resolve().parents[2] / "configs" / "plan_example.yaml")


def test_neo_plan_example_end_to_end(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", EXAMPLE, "--world-size", "8", "--local-world-size", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Sharding plan: 36 tables on 8 ranks (2 nodes x 4)" in text
    assert "user_id" in text and "imbalance max/mean" in text and "comm ms" in text
    d = json.loads(out.read_text())
    assert d["world_size"] == 8 and d["local_world_size"] == 4
    assert len(d["tables"]) == 36 and len(d["ranks"]) == 8
    allowed = {s.value for s in ShardingType}
    for name, t in d["tables"].items():
        assert t["sharding_type"] in allowed
        for s in t["shards"]:
            assert set(s) >= {"rank", "row_offset", "rows", "col_offset", "cols"} and s["cols"] % 4 == 0
        if t["sharding_type"] == "data_parallel":
            assert sorted(s["rank"] for s in t["shards"]) == list(range(8))
    plan = Plan.load(str(out))
    assert plan.tables["user_id"].sharding_type is not ShardingType.TABLE_WISE  # 143 GiB: must be split
    assert plan.tables["hashtag"].sharding_type is ShardingType.COLUMN_WISE
    assert {s.rank for s in plan.tables["group_ids"].shards} <= {0, 1}
    assert all(r.memory_bytes <= 64 * 2**30 for r in plan.ranks)


def test_neo_plan_overrides_and_world_size(capsys):
    rc = main(["plan", EXAMPLE, "--world-size", "16", "--local-world-size", "8",
               "topology.hbm_gib=80", "--max-tables", "5"])
    text = capsys.readouterr().out
    assert rc == 0 and "on 16 ranks (2 nodes x 8)" in text and "31 more tables" in text


def test_neo_plan_errors(capsys):
    rc = main(["plan", EXAMPLE, "tables[0].dim=7"])
    assert rc == 2 and "tables[0].dim" in capsys.readouterr().err
    rc = main(["plan", EXAMPLE, "topology.hbm_gib=1", "tables[0].sharding_types=[table_wise]"])
    err = capsys.readouterr().err
    assert rc == 2 and "'user_id'" in err and "GiB" in err and "missing" in err


def test_simulate_predicts_the_step_at_each_world_size(capsys):
    gpu = os.path.join(os.path.dirname(EXAMPLE), "mlperf_dcnv2_gpu.yaml")
    assert main(["plan", gpu, "--simulate", "8,16", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["world_size"] for r in rows] == [8, 16] and all(r["device_kind"] == "h100" for r in rows)
    for r in rows:
        c = r["components_ms"]
        assert r["step_ms"] == pytest.approx(sum(c.values()), rel=1e-3)
        assert r["samples_per_s"] == pytest.approx(r["global_batch"] / r["step_ms"] * 1e3, rel=1e-3)
        assert r["rank_ms_max"] >= r["rank_ms_mean"] > 0
    assert rows[1]["global_batch"] == 2 * rows[0]["global_batch"]          # weak scaling by default
    assert main(["plan", gpu, "--simulate", "8,16", "--strong", "--json"]) == 0
    strong = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert strong[0]["global_batch"] == strong[1]["global_batch"]
    assert main(["plan", gpu, "--simulate"]) == 0
    assert "scaling" in capsys.readouterr().out


def test_neo_plan_plans_for_the_trainers_batch_unless_the_topology_names_one(tmp_path, capsys):
    """``neo train`` plans for ``train.batch_size``; ``neo plan`` on the same config must show that plan."""
    main_job = str(Path(EXAMPLE).parent / "main_job.yaml")

    def plan(*overrides):
        out = tmp_path / "p.json"
        assert main(["plan", main_job, "--world-size", "2", "--local-world-size", "2", "--out", str(out),
                     "sharding.planner=auto", *overrides]) == 0
        capsys.readouterr()
        return [(r["rank"], r["comm_bytes_intra"]) for r in json.loads(out.read_text())["ranks"]]

    assert plan("train.batch_size=4096") == plan("topology.batch_size_per_rank=4096", "train.batch_size=8")
    assert plan("train.batch_size=4096") != plan("train.batch_size=64")


def test_neo_calibrate_writes_every_constant_and_neo_plan_uses_them(tmp_path, capsys, monkeypatch):
    """``neo calibrate --quick`` in one process: a JSON with the machine, the date and every cost
    constant measured at world size 1, which ``neo plan`` then names and predicts with. The
    machine's last-level cache is reported as 1 MiB: the cache evictions before each timed call
    write twice that, not twice a server's hundreds of MiB (most of the command's time here)."""
    import dataclasses
    import math

    import neo.calibrate as calibrate
    from neo.calibrate.measure import cache_cases
    from neo.planner.constants import CostConstants, load_constants

    real = calibrate._machine
    monkeypatch.setattr(calibrate, "_machine", lambda: dict(real(), l3_bytes=1 << 20))
    out = tmp_path / "calibration.json"
    assert main(["calibrate", "--quick", "--out", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["machine"]["device_kind"] == "cpu" and doc["date"]
    got = doc["constants"]["1"]
    for f in dataclasses.fields(CostConstants):
        assert f.name in got, f.name
        if isinstance(got[f.name], float):
            assert math.isfinite(got[f.name]) and got[f.name] >= 0, f.name
    c = load_constants(str(out), 1, "cpu")
    assert c.lookup_id_s == got["lookup_id_s"] and c.pooled_elem_s == got["pooled_elem_s"]
    # the cache's terms are fitted to its own measurement (a full cache: misses in every case)
    cache = doc["measurements"]["1"]["cache"]
    assert [(r["cache_rows"], r["batch"]) for r in cache] == [(float(a), float(b)) for a, b in cache_cases(1_000_000)]
    assert all(r["misses"] > 0 and r["accesses"] > r["misses"] and r["seconds"] > 0 for r in cache)
    fitted = calibrate.cache_constants(doc["measurements"]["1"], got["host_bw"])
    assert fitted == {k: got[k] for k in ("cache_batch_s", "cache_access_s", "cache_miss_latency")}
    main_job = os.path.join(os.path.dirname(EXAMPLE), "main_job.yaml")
    assert main(["plan", main_job, "--world-size", "1", f"sharding.cost_constants={out}"]) == 0
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--world-size", "0"], "must be > 0, got 0"),
    (["--local-world-size", "two"], "'two' is not an integer"),
    (["--simulate", "8,-16"], "must be > 0, got -16"),
    (["--max-tables", "-1"], "must be >= 0, got -1"),
])
def test_neo_plan_rejects_bad_counts_naming_the_value(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", EXAMPLE, *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_neo_plan_out_into_a_missing_directory_is_an_error(tmp_path, capsys):
    rc = main(["plan", EXAMPLE, "--world-size", "8", "--local-world-size", "4", "--out",
               str(tmp_path / "absent" / "plan.json")])
    assert rc == 2
    err = capsys.readouterr().err           # said before planning, with no report before it
    assert err == f"neo plan: error: --out {tmp_path / 'absent' / 'plan.json'}: its directory does not exist\n"


def test_an_unknown_command_is_named(capsys):
    assert main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert "neo: error: unknown command 'bogus'" in err and "cache-report" in err
    assert main([]) == 0 and "commands:" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["train..batch_size", "train.", ".train", "tables[x].dim"])
def test_a_malformed_override_key_is_an_error(key, capsys):
    assert main(["plan", EXAMPLE, "--world-size", "8", "--local-world-size", "4", f"{key}=3"]) == 2
    assert f"override key {key!r}: not a dotted path" in capsys.readouterr().err
