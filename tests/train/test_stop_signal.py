"""A run stopped by a signal of ``train.stop_signals`` (neo/train/stop.py): the ranks agree on a
step, checkpoint it, give up the lease and exit with 128 + the signal's number; resuming from
that checkpoint ends in the uninterrupted run's state, bit for bit. Three ways in: the trainer
with a hook that signals its own process (one rank of two only), ``neo train`` in a process of
its own, and torchrun's agent forwarding a SIGTERM to its two workers.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from neo.config import ConfigError
from neo.train.checkpoint.lease import LEASE_FILE
from neo.train.trainer import FitHook
from tests.multiprocess import child_env, run_multiprocess
from tests.train.test_cache_training import BIGGER, CACHED
from tests.train.test_trainer import MIXED, ROOT, TINY, tiny_config, train_and_collect

# tiny_config logs (and so lets several ranks agree on a stop) every 4 steps


# ----------------------------------------------------------------------------- the setting
def test_stop_signal_names_are_checked(tmp_path):
    tmp = str(tmp_path)
    assert tiny_config(tmp).train.stop_signals == []
    got = tiny_config(tmp, "train.stop_signals=[term,SIGUSR1,SIGTERM]").train.stop_signals
    assert got == ["SIGTERM", "SIGUSR1"]                       # canonical names, each once
    for bad, why in (("[SIGKILL]", "cannot be caught"), ("[SIGINT]", "KeyboardInterrupt"),
                     ("[SIGSEGV]", "is not a stop signal"), ("[NOPE]", "is not a stop signal"),
                     ("SIGTERM", "expected a list")):
        with pytest.raises(ConfigError, match=rf"train\.stop_signals: .*{why}"):
            tiny_config(tmp, f"train.stop_signals={bad}")


def test_wsp_refuses_stop_signals_with_virtual_workers_of_several_ranks(tmp_path):
    from neo.async_train.wsp import check_wsp_config

    check_wsp_config(tiny_config(str(tmp_path), "train.stop_signals=[SIGTERM]", "async_train.mode=wsp"))   # supported
    cfg = tiny_config(str(tmp_path), "train.stop_signals=[SIGTERM]", "async_train.mode=wsp",
                      "async_train.virtual_workers=[[0,1]]")
    with pytest.raises(ConfigError, match=r"train\.stop_signals: \['SIGTERM'\]: .* virtual workers of several ranks"):
        check_wsp_config(cfg)


def test_neo_mlperf_refuses_stop_signals():
    from neo.config import load_config
    from neo.mlperf.harness import check_request

    cfg = load_config(os.path.join(ROOT, "configs", "mlperf_dcnv2_tiny.yaml"), ["train.stop_signals=[SIGTERM]"])
    with pytest.raises(ConfigError, match=r"train\.stop_signals: \['SIGTERM'\]: a timed MLPerf run stopped part way"):
        check_request(cfg, "open", 1)


_SECOND_SIGNAL = """
import os, signal, sys
from neo.train.stop import StopSignals
with StopSignals(["SIGUSR1"]) as stop:
    os.kill(os.getpid(), signal.SIGUSR1)
    print("first:", stop.received, flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    print("survived the second", flush=True)
"""


def test_the_first_signal_is_recorded_and_the_second_kills():
    p = subprocess.run([sys.executable, "-c", _SECOND_SIGNAL], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=child_env())
    assert p.returncode == -signal.SIGUSR1, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.splitlines() == [f"first: {int(signal.SIGUSR1)}"]


def test_handlers_are_restored_after_the_run(tmp_path):
    from neo.train.stop import StopSignals

    before = signal.getsignal(signal.SIGUSR2)
    with StopSignals(["SIGUSR2"]) as stop:
        assert signal.getsignal(signal.SIGUSR2) != before
    assert signal.getsignal(signal.SIGUSR2) == before and stop.received is None
    with StopSignals([]):                                       # nothing installed
        assert signal.getsignal(signal.SIGUSR2) == before


# ----------------------------------------------------------------------------- through the trainer
STEPS = 24
SCHEDULE = ["optim.warmup_steps=3", "optim.decay_start=5", "optim.decay_steps=20", "optim.type=adam",
            "tables.3.optimizer.type=adam"]


class _SignalAt(FitHook):
    """Sends SIGTERM to this process after step ``at`` on rank ``rank`` only."""

    def __init__(self, rank: int, signal_rank: int, at: int):
        self.fire = rank == signal_rank
        self.at = at

    def after_step(self, step: int) -> bool:
        if self.fire and step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return False


def _train_until_signalled(rank, world_size, tmp, overrides, at):
    from neo.train.trainer import Trainer

    cfg = tiny_config(tmp, *overrides)
    tr = Trainer(cfg, log=lambda *a, **k: None)
    final = tr.fit(_SignalAt(rank, world_size - 1, at))
    return {"final": final, "losses": tr.losses, "handler_back": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}


@pytest.mark.parametrize("world, cached", [(1, False), (2, False), (2, True)], ids=["1", "2", "2 cached"])
def test_a_stop_signal_checkpoints_its_step_and_resuming_equals_uninterrupted(tmp_data, world, cached):
    ck, run_dir = f"{tmp_data}/stop-{world}-{cached}", f"{tmp_data}/stop-run-{world}-{cached}"
    plan = (MIXED if world == 2 else []) + (BIGGER + CACHED if cached else [])
    base = SCHEDULE + plan + [f"train.steps={STEPS}"]
    full = run_multiprocess(train_and_collect, world, tmp_data, base)
    # rank W - 1 alone gets the signal after step 6: one rank stops after step 6 (its next step);
    # two ranks agree at their next exchange, after step 8 (log_every 4)
    stopped = run_multiprocess(_train_until_signalled, world, tmp_data,
                               base + [f"train.checkpoint_dir={ck}", f"train.run_dir={run_dir}",
                                       "train.stop_signals=[SIGTERM]", "train.checkpoint_every=0"], 6)
    at = 6 if world == 1 else 8
    for out, ref in zip(stopped, full):
        f = out["final"]
        assert f["stopped"] == "SIGTERM" and f["exit_status"] == 128 + signal.SIGTERM and f["steps"] == at, f
        assert f["checkpoint"] == f"{ck}/step-{at}" and "auc" not in f
        assert out["losses"] == ref["losses"][:at]
        assert out["handler_back"]
    assert open(f"{ck}/latest").read().strip() == f"step-{at}"
    assert os.path.exists(f"{ck}/step-{at}/manifest.json") and not os.path.exists(f"{ck}/{LEASE_FILE}")
    records = [json.loads(x) for x in open(f"{run_dir}/metrics.jsonl")]
    assert [r["kind"] for r in records if r["kind"] in ("stopped", "final")] == ["stopped"]
    assert [r["step"] for r in records if r["kind"] == "stopped"] == [at]
    # the same command again resumes there and ends where the uninterrupted run ended
    rest = run_multiprocess(train_and_collect, world, tmp_data, base + [f"train.checkpoint_dir={ck}"])
    for r, ref in zip(rest, full):
        assert r["losses"] == ref["losses"][at:]
        for name in ref["weights"]:
            assert torch.equal(r["weights"][name], ref["weights"][name]), name
        assert r["final"]["state_sha256"] == ref["final"]["state_sha256"]


# ----------------------------------------------------------------------------- from outside
def _records(path: str):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int):
    """Every process below ``pid``."""
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += kids
    return out


def _signal_once_training(cmd, env, metrics: str, timeout: float = 240, sig: int = signal.SIGTERM):
    """Start ``cmd``, send it ``sig`` once a train record is logged; (exit status, stdout, stderr).
    Whatever it left running is killed (torchrun's workers have sessions of their own)."""
    logs = os.path.dirname(metrics) + "-output"
    os.makedirs(logs, exist_ok=True)
    family = []
    with open(f"{logs}/stdout", "w") as out, open(f"{logs}/stderr", "w") as err:   # files: no pipe to fill
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while not any(r["kind"] == "train" for r in _records(metrics)):
                assert proc.poll() is None, open(f"{logs}/stderr").read()[-3000:]
                assert time.monotonic() < deadline, "no train record in time"
                time.sleep(0.05)
            family = _descendants(proc.pid)
            os.kill(proc.pid, sig)
            rc = proc.wait(timeout=max(10, deadline - time.monotonic()))
        finally:
            for pid in [proc.pid] + _descendants(proc.pid) + family:
                _kill_if_ours(pid)
    return rc, open(f"{logs}/stdout").read(), open(f"{logs}/stderr").read()


def _kill_if_ours(pid: int) -> None:
    """SIGKILL ``pid`` if it is still a Neo or torchrun process (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"neo" in f.read():
                os.kill(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        pass


def _cli_overrides(tmp: str, run: str, ck: str):
    return [f"data.synthetic.cache_dir={tmp}/cache", f"train.run_dir={tmp}/{run}", "train.progress=false",
            "train.batch_size=64", "train.log_every=4", "train.steps=100000", "train.stop_signals=[SIGTERM]",
            f"train.checkpoint_dir={ck}", "train.eval_every=0"]


def test_neo_train_stops_on_sigterm_with_a_checkpoint_and_exit_status_143(tmp_data):
    ck = f"{tmp_data}/cli-ck"
    env = child_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "neo.train", TINY] + _cli_overrides(tmp_data, "cli", ck)
    rc, out, err = _signal_once_training(cmd, env, f"{tmp_data}/cli/metrics.jsonl")
    assert rc == 143, (rc, err[-3000:])
    final = json.loads(out.strip().splitlines()[-1])
    step = final["steps"]
    assert final["stopped"] == "SIGTERM" and final["checkpoint"] == f"{ck}/step-{step}" and 0 < step < 100000
    assert f"neo train: stopped by SIGTERM after step {step}; checkpoint {ck}/step-{step}" in err
    assert open(f"{ck}/latest").read().strip() == f"step-{step}"
    assert sorted(os.listdir(ck)) == ["latest", f"step-{step}"]          # no lease, no tmp-*


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_torchrun_forwards_the_signal_and_both_ranks_stop_at_one_step(tmp_data, sig):
    """SIGTERM reaches the workers through torchrun's agent as it is; SIGUSR1 (SLURM's --signal)
    once torchrun's --signals-to-handle lists it."""
    ck, run = f"{tmp_data}/torchrun-ck-{sig}", f"torchrun-{sig}"
    env = child_env(OMP_NUM_THREADS="1")
    handle = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"] if sig == "SIGUSR1" else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *handle,
           "-m", "neo.train", TINY] + _cli_overrides(tmp_data, run, ck) + MIXED + [f"train.stop_signals=[{sig}]"]
    rc, out, err = _signal_once_training(cmd, env, f"{tmp_data}/{run}/metrics.jsonl", sig=getattr(signal, sig))
    assert rc != 0, err[-3000:]                                           # torchrun itself was stopped
    stops = [r for r in _records(f"{tmp_data}/{run}/metrics.jsonl") if r["kind"] == "stopped"]
    assert len(stops) == 1 and stops[0]["stopped"] == sig and stops[0]["world_size"] == 2, err[-3000:]
    step = stops[0]["step"]
    assert step % 4 == 0                                                  # where the ranks exchange
    assert f"neo train: stopped by {sig} after step {step}; checkpoint {ck}/step-{step}" in err, err[-3000:]
    assert open(f"{ck}/latest").read().strip() == f"step-{step}"
    assert sorted(os.listdir(ck)) == ["latest", f"step-{step}"]


def test_torchrun_stops_a_wsp_run_at_a_version_with_its_checkpoint(tmp_data):
    """async_train.mode: wsp under torchrun: SIGTERM to the agent reaches both workers, which stop
    at the version both completed; rank 0 writes its checkpoint, says so, and leaves no lease."""
    ck, run = f"{tmp_data}/wsp-ck", "wsp-run"
    env = child_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "neo.async_train", TINY] + _cli_overrides(tmp_data, run, ck) + [
           "async_train.wave_steps=2", "async_train.staleness=1", "train.checkpoint_every=4"]
    rc, out, err = _signal_once_training(cmd, env, f"{tmp_data}/{run}/metrics.jsonl")
    assert rc != 0, err[-3000:]
    stops = [r for r in _records(f"{tmp_data}/{run}/metrics.jsonl") if r["kind"] == "stopped"]
    assert len(stops) == 1 and stops[0]["stopped"] == "SIGTERM", err[-3000:]
    v = stops[0]["version"]
    assert v >= 1 and stops[0]["checkpoint"] == f"{ck}/wsp-{v:08d}.pt", stops
    assert f"neo wsp: stopped by SIGTERM at version {v}; checkpoint {ck}/wsp-{v:08d}.pt" in err, err[-3000:]
    assert f"wsp-{v:08d}.pt" in os.listdir(ck) and "lease.json" not in os.listdir(ck)


def test_neo_train_passes_sigterm_to_the_torchrun_it_launched(tmp_data):
    """A pipelined config is relaunched under torchrun by ``neo train``: a SIGTERM to ``neo train``
    reaches the workers through it (they stop cleanly; no checkpoints under a pipeline), instead of
    killing ``neo train`` alone and leaving torchrun and its workers running."""
    env = child_env(OMP_NUM_THREADS="1")
    cfg = os.path.join(ROOT, "configs", "pipeline_deep_mlp.yaml")
    cmd = [sys.executable, "-m", "neo.cli", "train", cfg, f"data.synthetic.cache_dir={tmp_data}/cache",
           f"train.run_dir={tmp_data}/pipelined", "train.progress=false", "train.log_every=4", "train.steps=100000",
           "train.eval_every=0", "train.stop_signals=[SIGTERM]"]
    elastic = os.path.join(tempfile.gettempdir(), "torchelastic_*")             # torchrun's default log folders
    before = set(glob.glob(elastic))
    rc, out, err = _signal_once_training(cmd, env, f"{tmp_data}/pipelined/metrics.jsonl")
    assert rc == 143, (rc, err[-3000:])        # the ranks' status (128 + SIGTERM), not torchrun's 1
    stops = [r for r in _records(f"{tmp_data}/pipelined/metrics.jsonl") if r["kind"] == "stopped"]
    assert len(stops) == 1 and stops[0]["stopped"] == "SIGTERM" and stops[0]["checkpoint"] is None, err[-3000:]
    assert set(glob.glob(elastic)) == before, "the relaunch left torchrun's log folder in the temporary directory"
    assert f"neo train: stopped by SIGTERM after step {stops[0]['step']}; nothing saved" in err, err[-3000:]
