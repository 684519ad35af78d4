"""WSP checkpoints (neo/async_train/checkpoint.py): a run stopped at a version and resumed from its
checkpoint ends where the uninterrupted run ends (staleness 0: bit for bit: losses, tables,
optimizer state, dense model); the newest ``checkpoint_keep`` are kept; a checkpoint of another
shape of run and a cadence that is not a wave's end are errors naming the field."""

from __future__ import annotations

import os

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


def test_the_cadence_must_be_a_wave_end(tmp_data):
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every: 6.*multiple of async_train\.wave_steps \(4\)"):
        from neo.async_train.wsp import check_wsp_config
        check_wsp_config(tiny_config(tmp_data, "async_train.mode=wsp", "async_train.wave_steps=4",
                                     "train.checkpoint_every=6", f"train.checkpoint_dir={tmp_data}/x"))
