"""tools/check_cache_model.py: the skew model per policy against the simulated steady state."""

from __future__ import annotations

import json

from tests.tools import load_tool

main = load_tool("check_cache_model.py").main


def test_a_small_grid_records_model_and_simulation_per_policy(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["--rows", "20000", "--alphas", "1.05", "--ids", "256", "--shares", "0.05,0.2",
                 "--counted", "30", "--json", str(out)]) == 0
    recs = json.loads(out.read_text())
    assert [(r["share"], r["policy"]) for r in recs] == [(s, p) for s in (0.05, 0.2) for p in ("lfu", "lru", "lookahead")]
    for r in recs:
        assert 0 < r["simulated"] < 1 and r["error"] == r["model"] - r["simulated"]
        if r["policy"] == "lru":
            assert abs(r["error"]) < 0.03, r                  # Che's approximation
    assert "lookahead: largest error" in capsys.readouterr().out
