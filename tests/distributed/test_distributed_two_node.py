"""The two-node run on one host: two torchrun agents (2 ranks each), c10d rendezvous on 127.0.0.1,
hierarchical table_row_wise + table_column_wise plan checked against single-process training."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_node_local_run():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "run_two_node_local.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "two-node check OK: W=4 L=2 nodes=2" in proc.stdout, proc.stdout
