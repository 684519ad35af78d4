"""tools/gpu_check.sh's stage machinery on this GPU-less machine: the stages asked for run, each
one's exit status is in the summary table, and the script fails where a stage failed (the GPU
stages themselves need a CUDA device: docs/benchmarks.md has their runs on an H200)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gpu_check(tmp_path, stages: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, STAGES=stages, OUT=str(tmp_path))
    return subprocess.run(["bash", "tools/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_env_stage_runs_and_is_summarised(tmp_path):
    p = _gpu_check(tmp_path, "env")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "== gpu_check summary" in p.stdout and "env      exit   0" in p.stdout
    assert "CPU " in p.stdout and "torch" in p.stdout                      # the machine is reported
    assert (tmp_path / "gpu_check.log").read_text().count("=== env") == 2   # start and end, logged


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a GPU stage failing where there is no GPU")
def test_a_failed_stage_fails_the_script_after_every_stage_ran(tmp_path):
    p = _gpu_check(tmp_path, "train env")
    assert p.returncode == 1, p.stdout[-3000:]
    summary = p.stdout.split("== gpu_check summary")[1]
    assert "env      exit   0" in summary
    train = next(line for line in summary.splitlines() if line.startswith("train"))
    assert "exit   0" not in train, summary
