"""Helpers of the bad-config tests (``test_bad_config.py``, ``test_bad_launch.py``): a plan file
of the tiny config, and ``neo train`` on it as a command of its own or through ``neo.cli.main``
in the test's process."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.train.test_trainer import ROOT, TINY


def _plan(tmp_path, name: str, *args: str) -> str:
    """A plan file of the tiny config written by ``neo plan ... --out`` (run in this process)."""
    from neo.commands.plan import main as plan_main

    out = str(tmp_path / name)
    assert plan_main([TINY, *args, "--out", out]) == 0
    return out


def _neo_train(tmp_data: str, *overrides: str) -> subprocess.CompletedProcess:
    """``neo train`` on the tiny config, as a command in a process of its own."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/bad", "train.progress=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _neo_train_here(capsys, tmp_data: str, *overrides: str, config: str = TINY) -> subprocess.CompletedProcess:
    """The same command run in this process (``neo.cli.main``, which the ``neo`` command calls and
    exits with): its status and what it printed, without the 3 to 4 s a new interpreter takes to
    import torch. A traceback would be an exception out of this call. The tests that run the
    command itself (``_neo_train``) check that its exit status is main's return value."""
    import torch

    from neo.cli import main

    capsys.readouterr()                                 # what the test printed before
    threads = torch.get_num_threads()
    try:
        status = main(["train", config, f"data.synthetic.cache_dir={tmp_data}/cache", f"train.run_dir={tmp_data}/bad",
                       "train.progress=false", *overrides])
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["neo", "train"], status, captured.out, captured.err)
