"""tools/bench_export.py: a whole DLRM's inference eager, as a torch.export program, and in plain
PyTorch; the exported program checked bit for bit against eager Neo and plain PyTorch within fp32
tolerance before anything is timed (the tool exits naming the system otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_quick_run_exports_checks_and_times_every_system(tmp_path):
    out = tmp_path / "export.json"
    p = subprocess.run([sys.executable, "tools/bench_export.py", "--quick", "--iters", "2", "--warmup", "1",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    records = json.loads(out.read_text())
    assert [r["system"] for r in records] == ["neo", "neo-exported", "torch"]
    torch_ms = records[2]["ms"]
    for r in records:
        assert r["ms"] > 0 and abs(r["torch_over_system"] - torch_ms / r["ms"]) < 1e-9 and r["export_s"] > 0
        assert r["machine"]["cpu_model"] and r["machine"]["neo_cpu_isa"] in ("baseline", "avx2", "avx512")
    assert "neo / neo-exported" in p.stdout
