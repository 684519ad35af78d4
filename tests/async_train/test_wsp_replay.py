"""WSP under staleness against a replay of its own schedule: a run's result is decided by the
versions its waves computed on (the ``wsp_wave`` records of its run log), whatever the timing
(neo/async_train/replay.py). A run with a slowed worker, replayed with the other worker slowed
instead, gives the same losses, tables, optimizer states and dense model bit for bit; the
schedule matters (one wave moved to an older version changes the result); a replay's schedule
that this config could not have run, or a run log without it, is an error naming the worker and
wave."""

from __future__ import annotations

import json
import os

import pytest
import torch

from neo.async_train.replay import check_replay, check_replay_source, replay_versions
from neo.config import ConfigError
from tests.async_train.test_wsp import _wsp, assert_same_state
from tests.multiprocess import MultiProcessError, run_multiprocess

S, STEPS, WAVE_STEPS = 2, 24, 2
WAVES = STEPS // WAVE_STEPS
COMMON = [f"train.steps={STEPS}", "train.eval_batches=2", f"async_train.staleness={S}",
          f"async_train.wave_steps={WAVE_STEPS}"]


def _rewrite_versions(src: str, dst: str, worker: int, wave: int, version: int) -> None:
    """A copy of run log ``src`` with worker's wave computed on ``version`` instead."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "metrics.jsonl")) as f, open(os.path.join(dst, "metrics.jsonl"), "w") as g:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "wsp_wave" and r["worker"] == worker and r["wave"] == wave:
                r["version"] = version
            g.write(json.dumps(r) + "\n")


def test_a_replayed_schedule_gives_the_recorded_run_bit_for_bit(tmp_data):
    run = f"{tmp_data}/slow1"
    out = run_multiprocess(_wsp, 2, tmp_data, COMMON + ["async_train.slowdown=[{rank: 1, factor: 4}]",
                                                        f"train.run_dir={run}"])
    assert out[0]["final"]["max_staleness_observed"] == S       # a schedule far from the synchronous one
    assert replay_versions(run, 2, WAVES) == [o["versions"] for o in out]
    # the other worker slowed: left to itself this run would compute on other versions; the
    # schedule named by the config's key, as neo train gives it (the runs below: WSPTrainer's argument)
    again = run_multiprocess(_wsp, 2, tmp_data, COMMON + ["async_train.slowdown=[{rank: 0, factor: 4}]",
                                                          f"train.run_dir={tmp_data}/replay",
                                                          f"async_train.replay={run}"])
    for r, (a, b) in enumerate(zip(out, again)):
        assert b["versions"] == a["versions"], r
        assert b["losses"] == a["losses"], r                   # every step of every worker
        assert_same_state(a, b)
    assert again[0]["final"]["auc"] == out[0]["final"]["auc"]

    # The schedule decides: the last wave that could have computed on a version one older (the
    # slowed worker's: the fast one ran at the bound) moved there.
    w, c, v = max((w, c, v) for w in range(2) for c, v in enumerate(out[w]["versions"])
                  if v - 1 >= max(0, c - S) and (c == 0 or out[w]["versions"][c - 1] <= v - 1))
    _rewrite_versions(run, f"{tmp_data}/moved", w, c, v - 1)
    moved = run_multiprocess(_wsp, 2, tmp_data, COMMON + [f"train.run_dir={tmp_data}/moved_run"],
                             replay=f"{tmp_data}/moved")
    assert moved[w]["versions"] == out[w]["versions"][:c] + [v - 1] + out[w]["versions"][c + 1:]
    assert moved[w]["losses"][:c * WAVE_STEPS] == out[w]["losses"][:c * WAVE_STEPS]
    assert moved[w]["losses"][c * WAVE_STEPS] != out[w]["losses"][c * WAVE_STEPS]   # its first step, on other weights
    for o in moved[1:]:
        assert_same_state(moved[0], o)                         # the replicas still agree
    assert any(not torch.equal(moved[0]["weights"][t], out[0]["weights"][t]) for t in out[0]["weights"])

    # A log whose worker 1 computed its last wave on its own result: every rank refuses it before
    # any collective (none waits for the one that failed).
    _rewrite_versions(run, f"{tmp_data}/short", 1, WAVES - 1, WAVES)       # out of [c - S, c] for that wave
    with pytest.raises(MultiProcessError) as e:
        run_multiprocess(_wsp, 2, tmp_data, COMMON + [f"train.run_dir={tmp_data}/short_run"],
                         replay=f"{tmp_data}/short", grace_s=20)
    assert sorted(e.value.failures) == [0, 1]
    assert all(f"worker 1, wave {WAVES - 1}: version {WAVES} is outside" in f for f in e.value.failures.values())


def test_replay_versions_names_what_is_missing_or_malformed(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"WSP replay: no run log at .*nowhere/metrics\.jsonl"):
        replay_versions(str(tmp_path / "nowhere"), 1, 3)
    log = tmp_path / "metrics.jsonl"
    waves = [{"kind": "wsp_wave", "worker": w, "wave": c, "version": max(0, c - 1)} for w in (0, 1) for c in range(3)]
    log.write_text("\n".join(json.dumps(r) for r in waves) + "\n")
    assert replay_versions(str(tmp_path), 2, 3) == [[0, 0, 1]] * 2 == replay_versions(str(log), 2, 3)
    log.write_text("\n".join(json.dumps(r) for r in waves if (r["worker"], r["wave"]) != (1, 2)) + "\n")
    assert replay_versions(str(tmp_path), 2, 2, first=1) == [[0], [0]]   # wave 1 alone, of both
    with pytest.raises(ValueError, match=r"no wsp_wave record of worker 1, wave 2 \(1 of waves 0 \.\. 2 missing\)"):
        replay_versions(str(tmp_path), 2, 3)
    log.write_text(json.dumps(waves[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl line 2: not a JSON record"):
        replay_versions(str(tmp_path), 1, 1)
    log.write_text(json.dumps({"kind": "wsp_wave", "worker": 0, "wave": 0, "version": "0"}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: a wsp_wave record without an integer worker, wave and version"):
        replay_versions(str(tmp_path), 1, 1)
    log.write_text("\n".join(json.dumps(r) for r in waves) + "\n")
    with pytest.raises(ValueError, match=r"line 4: a wave of worker 1, where this run has 1: a run of another world"):
        replay_versions(str(tmp_path), 1, 3)


@pytest.mark.parametrize("versions, first, match", [
    ([0, 0, 0, 0], 0,
     r"worker 3, wave 3: version 0 is outside \[1, 3\] \(async_train\.staleness = 2, starting at version 0\)"),
    ([0, 1, 0], 0, r"worker 3, wave 2: version 0 is older than the 1 of wave 1"),
    ([0, 2], 0, r"worker 3, wave 1: version 2 is outside \[0, 1\]"),            # a wave on its own result
    ([4, 4], 5, r"worker 3, wave 5: version 4 is outside \[5, 5\].*starting at version 5"),   # before a resume
])
def test_check_replay_refuses_a_schedule_this_config_could_not_have_run(versions, first, match):
    with pytest.raises(ValueError, match=match):
        check_replay(versions, first, 2, 3)
    check_replay([0, 0, 0, 1, 2, 3], 0, 2, 3)                  # at the bound: accepted


def test_the_replay_key_acts_under_wsp_only_and_never_reads_the_runs_own_log(tmp_data):
    from neo.async_train import WSPTrainer
    from tests.train.test_trainer import tiny_config

    tmp = tmp_data
    assert tiny_config(tmp, "async_train.mode=wsp").async_train.replay == ""
    assert tiny_config(tmp, "async_train.mode=wsp", f"async_train.replay={tmp}/old").async_train.replay == f"{tmp}/old"
    with pytest.raises(ConfigError, match=r"async_train\.replay: .*has no effect with mode bsp"):
        tiny_config(tmp, f"async_train.replay={tmp}/old")
    check_replay_source(f"{tmp}/old", f"{tmp}/run")                              # another run's log
    check_replay_source(f"{tmp}/run/metrics.jsonl", "")                          # a run without a run log
    for own in (f"{tmp}/run", f"{tmp}/run/", f"{tmp}/run/metrics.jsonl", f"{tmp}/x/../run"):
        with pytest.raises(ConfigError, match=r"async_train\.replay: .* is this run's own train\.run_dir .*another "
                                              r"train\.run_dir"):
            check_replay_source(own, f"{tmp}/run")
    with pytest.raises(ConfigError, match=r"async_train\.replay: .* is this run's own train\.run_dir"):
        WSPTrainer(tiny_config(tmp, "async_train.mode=wsp", f"async_train.replay={tmp}/run"), log=lambda *a, **k: None)
