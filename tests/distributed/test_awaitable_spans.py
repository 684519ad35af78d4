"""Awaitables name their collective steps in profiler traces, and cost nothing when none records."""

from __future__ import annotations

import torch
from torch.profiler import profile

from neo.distributed import comms
from neo.distributed.comms import Awaitable


def _names(prof) -> list:
    return [e.name for e in prof.events()]


def test_wait_and_progress_are_named_under_a_profiler_and_open_nothing_without_one(monkeypatch):
    a = Awaitable(lambda: torch.ones(2) * 3, "ids")
    a._progress = lambda: None                    # a multi-stage collective's first stage
    with profile() as prof:
        assert torch.equal(a.wait(), torch.full((2,), 3.0))
    assert "neo.progress/ids" in _names(prof) and "neo.wait/ids" in _names(prof)

    opened = []
    monkeypatch.setattr(comms, "record_function", lambda label: opened.append(label))
    b = Awaitable(lambda: 5, "lengths")
    assert b.wait() == 5 and opened == []
