"""WSP checkpoints (neo/async_train/checkpoint.py): a run stopped at a version and resumed from its
checkpoint ends where the uninterrupted run ends (staleness 0: bit for bit: losses, tables,
optimizer state, dense model); the newest ``checkpoint_keep`` are kept; a checkpoint of another
shape of run and a cadence that is not a wave's end are errors naming the field."""

from __future__ import annotations

import os
import time

import pytest

from neo.config import ConfigError
from tests.async_train.test_wsp import _wsp, assert_same_state
from tests.multiprocess import run_multiprocess
from tests.train.test_trainer import tiny_config

COMMON = ["train.eval_batches=4", "train.log_every=4", "async_train.wave_steps=2", "train.checkpoint_every=4",
          "train.checkpoint_keep=2"]


def test_a_resumed_run_ends_where_the_uninterrupted_one_ends(tmp_data):
    def args(name, steps, stale=0):
        return COMMON + [f"train.steps={steps}", f"async_train.staleness={stale}", f"train.run_dir={tmp_data}/{name}",
                         f"train.checkpoint_dir={tmp_data}/{name}-ck"]

    whole = run_multiprocess(_wsp, 2, tmp_data, args("whole", 12))
    assert sorted(os.listdir(f"{tmp_data}/whole-ck")) == ["wsp-00000004.pt", "wsp-00000006.pt"]   # keep 2
    first = run_multiprocess(_wsp, 2, tmp_data, args("part", 8))                    # versions 2 and 4 written
    assert first[0]["final"]["start_version"] == 0
    rest = run_multiprocess(_wsp, 2, tmp_data, args("part", 12))                   # resumes at version 4, step 8
    assert rest[0]["final"]["start_version"] == 4 and rest[0]["final"]["steps"] == 12
    for r in range(2):
        assert first[r]["losses"] + rest[r]["losses"] == whole[r]["losses"], r        # every step of every rank
        assert_same_state(rest[r], whole[r])
    assert rest[0]["final"]["auc"] == whole[0]["final"]["auc"]
    assert rest[0]["final"]["state_sha256"] == whole[0]["final"]["state_sha256"]          # the digest says so
    assert first[0]["final"]["state_sha256"] != whole[0]["final"]["state_sha256"]
    # resumed past the config's end (version 6, a run of 8 steps = 4 waves): nothing trained, said so,
    # throughput 0 and the checkpoint it resumed from (it reported -10M samples/s and an older file)
    past = run_multiprocess(_wsp, 2, tmp_data, args("part", 8))[0]["final"]
    assert past["start_version"] == 6 and past["samples_per_s"] == 0 and past["waves"] == 6, past
    assert past["checkpoint"].endswith("wsp-00000006.pt") and "nothing left to train" in past["note"]
    # staleness 1: the resumed run computes its waves on whatever versions exist; it ends with every
    # version applied, replicas equal, at the final step
    stale = run_multiprocess(_wsp, 2, tmp_data, args("stale", 8, 1))
    resumed = run_multiprocess(_wsp, 2, tmp_data, args("stale", 12, 1))
    assert resumed[0]["final"]["start_version"] == 4 and len(stale[0]["losses"]) + len(resumed[0]["losses"]) == 12
    assert_same_state(resumed[0], resumed[1])


def test_a_checkpoint_of_another_run_shape_is_refused(tmp_data):
    ck = f"{tmp_data}/shape-ck"
    run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=4", f"train.run_dir={tmp_data}/shape",
                                                  f"train.checkpoint_dir={ck}"])
    with pytest.raises(AssertionError, match=r"CheckpointError: .*wsp-00000002\.pt: written with wave_steps = 2, "
                                             r"this run has 4"):
        run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=8", "async_train.wave_steps=4",
                                                      f"train.run_dir={tmp_data}/shape2", f"train.checkpoint_dir={ck}"])
    # another model: a named CheckpointError, not load_state_dict's traceback (audit of 2026-11-29)
    with pytest.raises(AssertionError, match=r"CheckpointError: .*wsp-00000002\.pt: does not fit this run's model"):
        run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=8", "model.dense_arch=[32,8]",
                                                      f"train.run_dir={tmp_data}/shape3", f"train.checkpoint_dir={ck}"])
    import torch                                            # a file with no model state in it

    state = torch.load(f"{ck}/wsp-00000002.pt", weights_only=True)
    del state["model"]
    torch.save(state, f"{ck}/wsp-00000002.pt")
    with pytest.raises(AssertionError, match=r"CheckpointError: .*wsp-00000002\.pt: no model state in it"):
        run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=8", f"train.run_dir={tmp_data}/shape4",
                                                      f"train.checkpoint_dir={ck}"])


def test_the_cadence_must_be_a_wave_end(tmp_data):
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every: 6.*multiple of async_train\.wave_steps \(4\)"):
        from neo.async_train.wsp import check_wsp_config
        check_wsp_config(tiny_config(tmp_data, "async_train.mode=wsp", "async_train.wave_steps=4",
                                     "train.checkpoint_every=6", f"train.checkpoint_dir={tmp_data}/x"))


def _wsp_signalled(rank, world_size, tmp, overrides, at_step):
    """As _wsp; rank 1 sends itself SIGTERM (from a thread, as a launcher would) once it has run
    ``at_step`` steps."""
    import signal
    import threading
    import time

    from neo.async_train import WSPTrainer

    tr = WSPTrainer(tiny_config(tmp, "async_train.mode=wsp", *overrides), log=lambda *a, **k: None)
    if rank == 1:
        def watch():
            while tr.step < at_step:
                time.sleep(0.0005)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch, daemon=True).start()
    return {"final": tr.fit(), "losses": tr.losses}


def test_a_signal_stops_every_worker_at_a_checkpoint_the_run_resumes_from(tmp_data):
    """train.stop_signals under WSP: rank 1 is signalled mid-run; both workers stop at their next
    wave, rank 0 writes the version both completed, both report 143; the same command resumes
    there and (staleness 0) ends with the uninterrupted run's state."""
    def args(name):
        return COMMON + ["train.steps=24", "async_train.staleness=0", "train.stop_signals=[SIGTERM]",
                         f"train.run_dir={tmp_data}/{name}", f"train.checkpoint_dir={tmp_data}/{name}-ck"]

    whole = run_multiprocess(_wsp, 2, tmp_data, args("sig-whole"))
    stopped = run_multiprocess(_wsp_signalled, 2, tmp_data, args("sig"), 6)
    final = stopped[0]["final"]
    assert [s["final"]["stopped"] for s in stopped] == ["SIGTERM", "SIGTERM"]
    assert [s["final"]["exit_status"] for s in stopped] == [143, 143]
    v = final["version"]
    assert 3 <= v < 12 and final["checkpoint"] == f"{tmp_data}/sig-ck/wsp-{v:08d}.pt"
    assert os.path.exists(final["checkpoint"]) and final["steps"] == 2 * v
    resumed = run_multiprocess(_wsp, 2, tmp_data, args("sig"))
    assert resumed[0]["final"]["start_version"] == v and "stopped" not in resumed[0]["final"]
    for r in range(2):
        assert resumed[r]["losses"] == whole[r]["losses"][2 * v:], r
        assert_same_state(resumed[r], whole[r])


def test_workers_at_different_waves_stop_at_the_version_both_completed(tmp_data):
    """Staleness 2, rank 1 slowed 3x: rank 0 runs up to two waves ahead (and waits for rank 1);
    rank 1 is signalled: both stop, well inside the collective timeout, at the version both
    completed (rank 0's waves past it are dropped), and the run resumes from there to the end."""
    args = COMMON + ["train.steps=24", "async_train.staleness=2", "async_train.slowdown=[{rank: 1, factor: 3}]",
                     "train.stop_signals=[SIGTERM]", "train.collective_timeout_s=60",
                     f"train.run_dir={tmp_data}/slow", f"train.checkpoint_dir={tmp_data}/slow-ck"]
    t0 = time.time()
    stopped = run_multiprocess(_wsp_signalled, 2, tmp_data, args, 6)
    assert time.time() - t0 < 45                                      # nobody waited out the 60 s timeout
    final = stopped[0]["final"]
    assert [s["final"]["exit_status"] for s in stopped] == [143, 143] and final["version"] >= 3
    assert len(stopped[0]["losses"]) > 2 * final["version"]          # rank 0 had run ahead of the version
    resumed = run_multiprocess(_wsp, 2, tmp_data, args)                     # the same command again
    assert resumed[0]["final"]["start_version"] == final["version"] and resumed[0]["final"]["steps"] == 24
    assert_same_state(resumed[0], resumed[1])


def test_a_waiting_worker_stops_when_asked():
    """WaveClock.wait_version with a stop question: WaveStop as soon as it says yes; returns as
    soon as the version is there; resumed clocks (base) do not wait for versions before the base."""
    import datetime

    import torch.distributed as dist

    from neo.async_train.server import WaveClock, WaveStop

    clock = WaveClock(dist.HashStore(), datetime.timedelta(seconds=30), base=4)
    clock.init()
    clock.wait_version(4)                                   # the base: nothing to wait for
    asked = []
    t0 = time.time()
    with pytest.raises(WaveStop):
        clock.wait_version(5, lambda: asked.append(1) or len(asked) > 3)
    assert len(asked) == 4 and time.time() - t0 < 5
    clock.applied(4)
    clock.wait_version(5, lambda: True)                     # there: no question asked
    assert clock.stop_requested() is None
    clock.request_stop(15)
    clock.request_stop(10)                                  # the first request stands
    assert clock.stop_requested() == 15


def test_a_fresh_run_replaces_an_earlier_runs_checkpoints(tmp_data):
    """train.resume=false in a directory holding a longer run's checkpoints: they go at this run's
    first save, so that a later resume starts from this run's, not from the older later version."""
    ck = f"{tmp_data}/fresh-ck"
    run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=12", f"train.run_dir={tmp_data}/old",
                                                  f"train.checkpoint_dir={ck}"])
    assert sorted(os.listdir(ck)) == ["wsp-00000004.pt", "wsp-00000006.pt"]
    run_multiprocess(_wsp, 2, tmp_data, COMMON + ["train.steps=4", "train.resume=false",
                                                  f"train.run_dir={tmp_data}/new", f"train.checkpoint_dir={ck}"])
    assert sorted(os.listdir(ck)) == ["wsp-00000002.pt"]
