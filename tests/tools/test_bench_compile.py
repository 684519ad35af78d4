"""tools/bench_compile.py: the head eager and under Inductor, Neo's and plain PyTorch's, each
compiled system checked against Neo's eager logits and pooled gradient before it is timed (the
tool exits naming the system otherwise), and the ratios are torch's time over each system's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_quick_run_compiles_and_checks_every_system(tmp_path):
    out = tmp_path / "compile.json"
    p = subprocess.run([sys.executable, "tools/bench_compile.py", "--quick", "--iters", "2", "--warmup", "1",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    records = json.loads(out.read_text())
    assert [r["system"] for r in records] == ["neo", "neo-compiled", "torch", "torch-compiled"]
    torch_ms = records[2]["ms"]
    for r in records:
        assert r["ms"] > 0 and abs(r["torch_over_system"] - torch_ms / r["ms"]) < 1e-9
        assert r["machine"]["cpu_model"] and r["machine"]["neo_cpu_isa"] in ("baseline", "avx2", "avx512")
    assert "neo / neo-compiled" in p.stdout
