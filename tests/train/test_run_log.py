"""The run log across runs in one directory, and the one line a failed checkpoint save becomes."""

from __future__ import annotations

import json
import os

from neo.train.checkpoint.layout import error_summary
from neo.train.run_log import RunLog


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_a_fresh_run_moves_an_earlier_runs_log_aside_and_a_resume_rewinds(tmp_path):
    """Two fresh runs in one run directory: the second starts its own metrics.jsonl (the first's
    goes to previous/, no step twice); a resume keeps the records up to its checkpoint."""
    run_dir = str(tmp_path / "run")
    for losses in ([0.9, 0.8], [0.7, 0.6]):
        log = RunLog(run_dir, 0, 2, progress=False, tensorboard=False)
        for step, loss in enumerate(losses, start=1):
            log.record("train", step, {"loss": loss})
        log.record("final", 2, {})
        log.close()
    assert log.moved_aside == os.path.join(run_dir, "previous")
    now, before = _records(os.path.join(run_dir, "metrics.jsonl")), _records(os.path.join(run_dir, "previous",
                                                                                            "metrics.jsonl"))
    assert [r.get("loss") for r in now] == [0.7, 0.6, None] and [r.get("loss") for r in before] == [0.9, 0.8, None]
    log = RunLog(run_dir, 0, 2, initial_step=1, progress=False, tensorboard=False, rewind_to=1)
    log.close()
    assert log.moved_aside is None and log.dropped_records == 2
    assert [(r["kind"], r["step"]) for r in _records(os.path.join(run_dir, "metrics.jsonl"))] == [("train", 1)]


def test_a_failed_dcp_save_is_one_line_per_failed_rank():
    """DCP's CheckpointException carries every failed rank's traceback in its text; the message
    keeps each rank's exception alone (before: the traceback inside the 'one line')."""
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    try:
        raise OSError(28, "No space left on device", "ck/tmp-8/__0_0.distcp")
    except OSError as e:
        wrapped = _wrap_exception(e)
    e = CheckpointException("save failed", {1: wrapped, 0: wrapped})
    assert "Traceback" in str(e)
    line = error_summary(e)
    assert line == ("rank 0: OSError: [Errno 28] No space left on device: 'ck/tmp-8/__0_0.distcp'; "
                    "rank 1: OSError: [Errno 28] No space left on device: 'ck/tmp-8/__0_0.distcp'")
    assert error_summary(ValueError("a\nb")) == "ValueError: a b"
