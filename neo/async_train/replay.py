"""Replaying a WSP run's schedule: the version each of a worker's waves computed on.

A WSP run depends on its timing only through one thing: the version v(w, c) on which worker w
computed its wave c (every version is applied in order, the same on every replica; within a wave
nothing waits on another worker). The run log records it (``wsp_wave`` records: worker, wave,
version). :func:`replay_versions` reads every worker's; ``WSPTrainer(cfg, replay=RUN_DIR)`` (the
config's ``async_train.replay``, as ``neo train`` runs it) then
computes each wave on exactly that version (it waits for it and applies no later one), so a run
of the same config and data (and world size, threads per rank and CPU kernels' ISA) reproduces
the recorded run's training bit for bit, whatever its own speed: a way to rerun a run that went
wrong, and the oracle of tests/async_train/test_wsp_replay.py (the schedule alone decides the
result; tests/async_train/test_wsp.py: the synchronous schedule, one step a wave, is the
synchronous trainer's, bit for bit at 2 ranks).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence

from neo.config.embedding import ConfigError

__all__ = ["replay_versions", "check_replay", "check_replay_source"]


def run_log_path(run: str) -> str:
    """The run log a replay names: a run directory's ``metrics.jsonl``, or that file itself."""
    return run if run.endswith(".jsonl") else os.path.join(run, "metrics.jsonl")


def replay_versions(run_log: str, workers: int, waves: int, first: int = 0) -> List[List[int]]:
    """For each of ``workers`` workers, the versions its waves ``first .. waves - 1`` computed on,
    from the ``wsp_wave`` records of ``run_log`` (a run directory or its ``metrics.jsonl``), read
    once. Raises FileNotFoundError or ValueError naming the file, line, worker and wave of what is
    missing or malformed."""
    path = run_log_path(run_log)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"WSP replay: no run log at {path}")
    found: List[Dict[int, int]] = [{} for _ in range(workers)]
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"WSP replay: {path} line {line_no}: not a JSON record ({e.msg})") from None
            if not isinstance(r, dict) or r.get("kind") != "wsp_wave":
                continue
            worker, wave, version = r.get("worker"), r.get("wave"), r.get("version")
            if not all(isinstance(x, int) for x in (worker, wave, version)):
                raise ValueError(f"WSP replay: {path} line {line_no}: a wsp_wave record without an integer "
                                 f"worker, wave and version: {line.strip()[:200]}")
            if not 0 <= worker < workers:
                raise ValueError(f"WSP replay: {path} line {line_no}: a wave of worker {worker}, where this run "
                                 f"has {workers}: a run of another world size")
            found[worker][wave] = version      # a resumed run's log: the later record of a wave wins
    for worker, got in enumerate(found):
        missing = [c for c in range(first, waves) if c not in got]
        if missing:
            raise ValueError(f"WSP replay: {path} has no wsp_wave record of worker {worker}, wave {missing[0]} "
                             f"({len(missing)} of waves {first} .. {waves - 1} missing): not a WSP run of this "
                             "config and world size?")
    return [[got[c] for c in range(first, waves)] for got in found]


def check_replay(versions: Sequence[int], first: int, staleness: int, worker: int) -> None:
    """ValueError unless ``versions`` (of waves ``first, first + 1, ..``; a run resumed at version
    ``first`` starts there) is a schedule this config's WSP could have run: version v of wave c in
    [max(c - staleness, first), c], never decreasing."""
    for k, v in enumerate(versions):
        c = first + k
        lo = max(0, c - staleness, first)
        if not lo <= v <= c:
            raise ValueError(f"WSP replay: worker {worker}, wave {c}: version {v} is outside [{lo}, {c}] "
                             f"(async_train.staleness = {staleness}, starting at version {first})")
        if k and v < versions[k - 1]:
            raise ValueError(f"WSP replay: worker {worker}, wave {c}: version {v} is older than the "
                             f"{versions[k - 1]} of wave {c - 1} (a replica's versions only grow)")


def check_replay_source(replay: str, run_dir: str) -> None:
    """A replay must not read the run log of the run it starts: rank 0 moves that log aside as the
    run opens it, maybe before another rank has read it."""
    if run_dir and os.path.realpath(run_log_path(replay)) == os.path.realpath(run_log_path(run_dir)):
        raise ConfigError(f"async_train.replay: {replay} is this run's own train.run_dir ({run_dir}), whose run "
                          "log a new run moves aside: give the replay another train.run_dir")
