"""The suite under pytest-xdist (README's test command, ``-n 2``): each worker takes its share of
the cores' torch threads, and the processes it starts inherit that share; a serial run keeps
torch's own thread count."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import _share_cores_between_workers


@pytest.mark.parametrize("workers", [2, 3])
def test_a_worker_takes_its_share_of_the_cores(monkeypatch, workers):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")              # restored by monkeypatch after the test
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    torch.set_num_threads(5)                               # restored by conftest's autouse fixture
    _share_cores_between_workers()
    assert torch.get_num_threads() == 8 // workers
    assert os.environ["OMP_NUM_THREADS"] == str(8 // workers)


def test_more_workers_than_cores_still_leaves_each_one_thread(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    torch.set_num_threads(2)
    _share_cores_between_workers()
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("count", [None, "1"])
def test_a_serial_run_keeps_the_thread_count(monkeypatch, count):
    if count is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    torch.set_num_threads(3)
    _share_cores_between_workers()
    assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "7"
