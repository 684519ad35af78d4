"""The lease on a checkpoint directory: one run writes ``train.checkpoint_dir`` at a time.

A free directory is taken and the lease names its holder; a live holder refuses another run,
naming itself; a lease whose process is gone (this host), or not renewed for the timeout (any
host), is taken over; the same ``TORCHELASTIC_RUN_ID`` takes it over at once; renewals advance
its time; release removes it; of runs racing for it exactly one wins. Through the trainer: a
run on a directory another run holds is refused before training (``neo train`` exits 2, on
every rank), and a normal run holds the lease while it trains and leaves none behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from neo.config import ConfigError
from neo.train.checkpoint import CheckpointError, CheckpointLease
from neo.train.checkpoint.layout import candidates, clear_stale
from neo.train.checkpoint.lease import LEASE_FILE, run_identity
from neo.train.trainer import FitHook
from tests.multiprocess import run_multiprocess
from tests.train.test_trainer import tiny_config

HOST = socket.gethostname()


def _write_lease(root, run_id: str, host: str = HOST, pid: int = 0, renewed_ago: float = 0.0,
                 timeout_s: float = 0.0) -> str:
    """A lease file written by hand, as another run would have left it."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LEASE_FILE)
    now = time.time()
    with open(path, "w") as f:
        json.dump({"run_id": run_id, "host": host, "pid": pid or os.getpid(), "started": now - renewed_ago - 10,
                   "renewed": now - renewed_ago, "timeout_s": timeout_s, "token": "by-hand"}, f)
    return path


def _read_lease(root) -> dict:
    with open(os.path.join(root, LEASE_FILE)) as f:
        return json.load(f)


@pytest.fixture
def sleeper():
    """A live process of this host (killed at teardown)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def leases():
    """CheckpointLease objects of the test, released at teardown (their renewal threads stop)."""
    made = []

    def make(*args, **kwargs) -> CheckpointLease:
        made.append(CheckpointLease(*args, **kwargs))
        return made[-1]

    yield make
    for lease in made:
        lease.release()


# ----------------------------------------------------------------------------- the lease alone
def test_a_free_directory_is_taken_and_the_lease_names_its_holder(tmp_path, leases):
    root = str(tmp_path / "ck")
    before = time.time()
    lease = leases(root, 60.0, run_id="run-a")
    assert lease.acquire() is None and lease.held
    held = _read_lease(root)
    assert held["run_id"] == "run-a" and held["host"] == HOST and held["pid"] == os.getpid()
    assert before <= held["started"] <= held["renewed"] <= time.time()
    assert os.listdir(root) == [LEASE_FILE]                 # no temporary or moved-aside file left
    lease.release()
    assert not os.path.exists(os.path.join(root, LEASE_FILE)) and not lease.held
    lease.release()                                          # idempotent


def test_a_live_holder_refuses_another_run(tmp_path, leases, sleeper):
    root = str(tmp_path / "ck")
    holder = leases(root, 60.0, run_id="holder")
    holder.acquire()
    with pytest.raises(CheckpointError) as e:
        leases(root, 60.0, run_id="other").acquire()
    message = str(e.value)
    for part in (root, "run holder", f"host {HOST}", f"pid {os.getpid()}", "renewed 0 s ago", "train.checkpoint_dir",
                 "train.checkpoint_lease_s = 60 s"):
        assert part in message, (part, message)
    assert _read_lease(root)["run_id"] == "holder" and holder.held
    # another process of this host, alive, holding it under its own run id
    other = str(tmp_path / "other")
    _write_lease(other, "sleeping-run", pid=sleeper, renewed_ago=20)
    with pytest.raises(CheckpointError, match=rf"held by run sleeping-run \(host {HOST}, pid {sleeper}\), "
                                              r"renewed 20 s ago"):
        leases(other, 60.0, run_id="other").acquire()
    assert _read_lease(other)["run_id"] == "sleeping-run"


def test_a_lease_whose_process_is_gone_is_taken_over(tmp_path, leases, dead_pid):
    root = str(tmp_path / "ck")
    _write_lease(root, "crashed-run", pid=dead_pid)          # renewed just now, but its process is gone
    lease = leases(root, 60.0, run_id="run-b")
    note = lease.acquire()
    assert note is not None and "run crashed-run" in note and f"its process {dead_pid} no longer exists" in note
    assert _read_lease(root)["run_id"] == "run-b" and _read_lease(root)["pid"] == os.getpid()
    assert os.listdir(root) == [LEASE_FILE]


def test_a_lease_of_another_host_is_stale_only_after_the_timeout(tmp_path, leases):
    root = str(tmp_path / "ck")
    _write_lease(root, "remote-run", host="elsewhere", renewed_ago=50)
    with pytest.raises(CheckpointError, match=r"run remote-run \(host elsewhere, pid \d+\), renewed 50 s ago"):
        leases(root, 60.0, run_id="run-c").acquire()
    # the holder's own longer timeout counts: it renews every 150 s
    _write_lease(root, "remote-run", host="elsewhere", renewed_ago=120, timeout_s=600)
    with pytest.raises(CheckpointError, match=r"renewed 120 s ago.*checkpoint_lease_s = 600 s"):
        leases(root, 60.0, run_id="run-c").acquire()
    _write_lease(root, "remote-run", host="elsewhere", renewed_ago=61)
    lease = leases(root, 60.0, run_id="run-c")
    note = lease.acquire()
    assert note is not None and "run remote-run (host elsewhere" in note and "not renewed for 61 s" in note
    assert _read_lease(root)["run_id"] == "run-c"


def test_the_same_elastic_run_takes_its_lease_over_at_once(tmp_path, leases, monkeypatch):
    root = str(tmp_path / "ck")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    assert run_identity() == "job-7"
    _write_lease(root, "job-7", host="elsewhere")                # renewed just now, by a live process
    lease = leases(root, 60.0)
    note = lease.acquire()
    assert note is not None and "run job-7" in note and "restarted" in note
    held = _read_lease(root)
    assert held["run_id"] == "job-7" and held["host"] == HOST and held["token"] != "by-hand"
    lease.release()
    _write_lease(root, "job-8", host="elsewhere")                # another job's live lease
    with pytest.raises(CheckpointError, match="run job-8"):
        leases(root, 60.0).acquire()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")          # torchrun's value when there is no id
    assert run_identity() == f"{HOST}:{os.getpid()}"


def test_renewals_advance_and_stop_at_release(tmp_path, leases):
    root = str(tmp_path / "ck")
    lease = leases(root, 0.2, run_id="run-d")                   # renewed every 0.05 s
    lease.acquire()
    first = _read_lease(root)
    thread = next(t for t in threading.enumerate() if t.name == "neo-checkpoint-lease")
    assert thread.daemon
    time.sleep(0.3)
    later = _read_lease(root)
    assert later["renewed"] > first["renewed"] and later["started"] == first["started"]
    assert later["token"] == first["token"]
    lease.release()
    thread.join(timeout=2)
    assert not thread.is_alive() and not os.path.exists(os.path.join(root, LEASE_FILE))
    time.sleep(0.1)
    assert not os.path.exists(os.path.join(root, LEASE_FILE))   # no renewal after the release


def test_a_holder_whose_lease_was_taken_over_knows_and_leaves_it(tmp_path, leases):
    root = str(tmp_path / "ck")
    lost = []
    first = leases(root, 60.0, run_id="job-9", on_lost=lost.append)
    first.acquire()
    second = leases(root, 60.0, run_id="job-9")                 # a restart of the same run
    assert "restarted" in second.acquire()
    assert first.renew() is False and not first.held
    assert len(lost) == 1 and "taken over by run job-9" in lost[0] and root in lost[0]
    first.release()                                              # leaves the new holder's file alone
    assert _read_lease(root)["token"] == second._record.token


def test_a_holder_whose_lease_was_taken_over_and_released_knows(tmp_path, leases):
    """A holder paused past its timeout: another run takes the lease over, finishes and releases
    it (removing the file). The first holder's next check or renewal must not take the absent
    file for its own (it would then commit into, and prune, the other run's directory: audit of
    2026-11-30); a file moved aside by a contender still at work (its claim file present) still is."""
    root = str(tmp_path / "ck")
    lost = []
    first = leases(root, 0.2, run_id="paused", on_lost=lost.append)
    first.acquire()
    first._stop.set()                                            # its renewals stop (SIGSTOP)
    time.sleep(0.5)
    second = leases(root, 0.2, run_id="other")
    assert "not renewed" in second.acquire()
    second.release()
    assert not os.path.exists(os.path.join(root, LEASE_FILE))
    dead_claim = os.path.join(root, f"{LEASE_FILE}.claim-fedcba9876543210")   # of a contender killed mid-takeover
    open(dead_claim, "w").close()
    os.utime(dead_claim, (time.time() - 3600, time.time() - 3600))
    t0 = time.monotonic()
    why = first.check()
    assert time.monotonic() - t0 < 5 and not os.path.exists(dead_claim)        # not waited for: removed
    assert why is not None and "was removed while this run held the lease" in why, why
    assert not first.held and len(lost) == 1 and "commits no more checkpoints" in lost[0]
    assert first.renew() is False and not os.path.exists(os.path.join(root, LEASE_FILE))

    # a contender mid-takeover (its claim present, the file moved aside): still this run's lease
    root2 = str(tmp_path / "ck2")
    holder = leases(root2, 60.0, run_id="holder")
    holder.acquire()
    path = os.path.join(root2, LEASE_FILE)
    claim = f"{path}.claim-0123456789abcdef"
    open(claim, "w").close()
    os.rename(path, f"{path}.stale-x")

    def put_back():
        time.sleep(0.1)
        os.rename(f"{path}.stale-x", path)
        os.remove(claim)

    t = threading.Thread(target=put_back)
    t.start()
    assert holder.check() is None and holder.held
    t.join()


@pytest.mark.parametrize("stale", [False, True])
def test_of_runs_racing_for_a_lease_exactly_one_wins(tmp_path, stale):
    for round_ in range(10):
        root = str(tmp_path / f"ck-{round_}")
        if stale:
            _write_lease(root, "old-run", host="elsewhere", renewed_ago=3600)
        n = 8
        barrier = threading.Barrier(n)
        contenders = [CheckpointLease(root, 60.0, run_id=f"run-{i}") for i in range(n)]
        outcomes = [None] * n

        def race(i: int) -> None:
            barrier.wait()
            try:
                contenders[i].acquire()
                outcomes[i] = "won"
            except CheckpointError as e:
                outcomes[i] = str(e)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        try:
            winners = [i for i, o in enumerate(outcomes) if o == "won"]
            assert len(winners) == 1, outcomes
            assert _read_lease(root)["run_id"] == f"run-{winners[0]}"
            assert all(f"held by run run-{winners[0]}" in o for o in outcomes if o != "won"), outcomes
            assert os.listdir(root) == [LEASE_FILE]
        finally:
            for c in contenders:
                c.release()


def test_the_layout_ignores_the_lease(tmp_path):
    root = str(tmp_path / "ck")
    _write_lease(root, "run-e")
    os.makedirs(os.path.join(root, "step-3"))
    os.makedirs(os.path.join(root, "tmp-4"))
    clear_stale(root)
    assert sorted(os.listdir(root)) == [LEASE_FILE, "step-3"]
    assert candidates(root) == [os.path.join(root, "step-3")]


@pytest.mark.parametrize("value", ["0", "-1", ".inf", ".nan"])
def test_the_lease_timeout_must_be_finite_and_positive(tmp_path, value):
    assert tiny_config(str(tmp_path)).train.checkpoint_lease_s == 60.0
    with pytest.raises(ConfigError, match=r"train\.checkpoint_lease_s"):
        tiny_config(str(tmp_path), f"train.checkpoint_lease_s={value}")


# ----------------------------------------------------------------------------- through the trainer
def _neo_train(rank, world_size, tmp, overrides):
    """``neo train``'s run() of the tiny config: (exit status, stderr)."""
    from neo.commands.train import run

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run(tiny_config(tmp, *overrides))
    return status, err.getvalue()


@pytest.mark.parametrize("world", [1, 2])
def test_a_run_on_a_directory_another_run_holds_is_refused_before_training(tmp_data, world):
    ck, run_dir = f"{tmp_data}/held-{world}", f"{tmp_data}/held-run-{world}"
    _write_lease(ck, "other-run", renewed_ago=5)          # this test's process: alive
    before = _read_lease(ck)
    outs = run_multiprocess(_neo_train, world, tmp_data, ["train.steps=2", f"train.checkpoint_dir={ck}",
                                                          f"train.run_dir={run_dir}", "train.progress=false"])
    for status, err in outs:
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, err
        assert lines[0].startswith("neo train: error: ") and "is in use by another run" in lines[0]
        ago = re.search(rf"held by run other-run \(host {HOST}, pid {os.getpid()}\), renewed (\d+) s ago", lines[0])
        assert ago and 5 <= int(ago.group(1)) < 60, lines[0]      # 5 s before the run started
    assert outs[0][1] == outs[-1][1]                      # every rank: the same error
    assert _read_lease(ck) == before and os.listdir(ck) == [LEASE_FILE]
    assert not os.path.exists(os.path.join(run_dir, "metrics.jsonl"))


class _LeaseSeen(FitHook):
    """Reads the lease file after every step."""

    def __init__(self, root: str):
        self.root, self.seen = root, []

    def after_step(self, step: int) -> bool:
        self.seen.append(_read_lease(self.root))
        return False


def _train_watching_the_lease(rank, world_size, tmp, overrides, ck):
    from neo.train.trainer import Trainer

    said = []
    tr = Trainer(tiny_config(tmp, *overrides), log=said.append)
    hook = _LeaseSeen(ck)
    tr.fit(hook)
    return {"seen": hook.seen, "said": [s for s in said if isinstance(s, str)], "pid": os.getpid(),
            "left": sorted(os.listdir(ck))}


def test_a_run_holds_the_lease_while_it_trains_and_leaves_none(tmp_data, dead_pid):
    ck = f"{tmp_data}/normal"
    _write_lease(ck, "crashed-run", pid=dead_pid)
    (out,) = run_multiprocess(_train_watching_the_lease, 1, tmp_data,
                              ["train.steps=3", f"train.checkpoint_dir={ck}", f"train.run_dir={tmp_data}/normal-run"],
                              ck)
    taken = [s for s in out["said"] if "took over the lease" in s]
    assert len(taken) == 1 and "run crashed-run" in taken[0] and f"process {dead_pid} no longer exists" in taken[0]
    assert len(out["seen"]) == 3
    for held in out["seen"]:
        assert held["run_id"] == f"{HOST}:{out['pid']}" and held["pid"] == out["pid"] and held["host"] == HOST
    assert out["left"] == ["latest", "step-3"]             # the lease is gone once the run is over


class _TakenOverAt(FitHook):
    """After step ``at``, writes another run's live lease over this run's (as a run that took over
    while this one was paused would)."""

    def __init__(self, root: str, at: int):
        self.root, self.at = root, at

    def after_step(self, step: int) -> bool:
        if step == self.at:
            _write_lease(self.root, "the-new-holder", renewed_ago=0)
        return False


def _train_losing_the_lease(rank, world_size, tmp, overrides, ck):
    from neo.train.trainer import Trainer

    said = []
    tr = Trainer(tiny_config(tmp, *overrides), log=said.append)
    try:
        tr.fit(_TakenOverAt(ck, 3))
        error = None
    except CheckpointError as e:
        error = str(e)
    return {"error": error, "said": [s for s in said if isinstance(s, str)], "left": sorted(os.listdir(ck))}


@pytest.mark.parametrize("async_save", [False, True])
def test_a_run_whose_lease_was_taken_over_commits_nothing_more(tmp_data, async_save):
    ck = f"{tmp_data}/lost-{async_save}"
    (out,) = run_multiprocess(_train_losing_the_lease, 1, tmp_data,
                              ["train.steps=6", "train.checkpoint_every=2", f"train.checkpoint_async={async_save}",
                               f"train.checkpoint_dir={ck}", f"train.run_dir={tmp_data}/lost-run-{async_save}"], ck)
    # the first save to commit after the takeover at step 3 fails on its guard (step 4's; in the
    # background, step 2's own commit may come after the takeover too): nothing more is committed,
    # the new holder's lease is untouched, and the run stops with the reason
    assert out["error"] is not None and "taken over by run the-new-holder" in out["error"], out
    assert "step-4" not in out["left"] and "step-6" not in out["left"]
    if not async_save:                                     # step 2 was committed while the run held it
        assert "checkpoint of step 4 failed" in out["error"] and "step-2 is still the latest" in out["error"]
        assert "step-2" in out["left"]
    assert _read_lease(ck)["run_id"] == "the-new-holder"
    assert any("commits no more checkpoints there" in s for s in out["said"])
