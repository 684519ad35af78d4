"""tools/gpu_check_triton.py --compile-only: every Triton kernel variant, at the launch
configurations the backend's rules choose, compiled for sm_90 (Hopper) on this GPU-less machine
(Triton ships ptxas), and its PTX checked: no FMA contraction and no approximate division or
square root (bit-exactness with the reference), vector row loads in the forward. The kernels'
other tests run them in Triton's interpreter, which never compiles them: a launch that the GPU
compiler rejects (as Triton 3.6 rejected 32 rows x 2 warps of the update) is caught here."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_kernel_variant_compiles_for_sm90_with_exact_arithmetic():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # compiled, not interpreted
    p = subprocess.run([sys.executable, "tools/gpu_check_triton.py", "--compile-only"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    out = p.stdout
    assert p.returncode == 0, (out + p.stderr)[-4000:]
    assert "every variant compiled and passed" in out, out[-4000:]
    lines = [ln for ln in out.splitlines() if ln.startswith(("forward ", "update ", "row_keys"))]
    # 5 D x 3 weight types (forward; at D 64 also counting the invalid ids, with an atomic add)
    # + row_keys + 25 variants at D 64 and 3 at each other D (update)
    assert len(lines) == 15 + 3 + 1 + 25 + 12 and all(": ok" in ln for ln in lines), "\n".join(lines)
    assert sum("count=1" in ln for ln in lines) == 3
