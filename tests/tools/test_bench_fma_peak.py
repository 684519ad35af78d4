"""tools/bench_fma_peak.py: the loop compiles and runs, and its arithmetic is counted right."""

from __future__ import annotations

import pytest

from neo.cpp import cpu_flags
from tests.tools import load_tool

fma = load_tool("bench_fma_peak.py")


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="an AVX2 loop needs an AVX2 CPU")
def test_a_short_avx2_run_counts_12_chains_of_8_lanes(tmp_path):
    r = fma.measure("avx2", iterations=200_000, reps=2, workdir=str(tmp_path))
    assert (r["chains"], r["lanes"], r["iterations"]) == (12, 8, 200_000)
    assert r["seconds"] > 0
    assert r["gflops"] == pytest.approx(200_000 * 12 * 8 * 2 / r["seconds"] / 1e9)
    assert r["fma_per_s"] == pytest.approx(r["gflops"] * 1e9 / 2)
