"""``train.eval_batch_size``: evaluation in batches of another size than training's gives the same
metrics over the same samples (each sample's prediction does not depend on its batch), at one and
two ranks, with a mixed plan and with cached tables, with the last batch padded."""

from __future__ import annotations

import pytest

from neo.config import ConfigError
from tests.multiprocess import run_multiprocess
from tests.train.test_cache_training import BIGGER, CACHED
from tests.train.test_trainer import MIXED, tiny_config, train_and_collect


@pytest.mark.parametrize("world, extra, sizes", [(1, [], (300, 5000)), (2, MIXED, (300, 5000)),
                                                 (2, MIXED + BIGGER + CACHED, (40, 100))],
                         ids=["one rank", "two ranks mixed", "two ranks cached"])
def test_evaluation_does_not_depend_on_its_batch_size(tmp_data, world, extra, sizes):
    # 2048 validation samples, 1024 a rank at W 2; training batches of 64. 300, 40 and 100 leave
    # a padded last batch; 5000 is one batch. The training is the same in each run (same seed),
    # so the final evaluation sees the same weights.
    runs = {size: run_multiprocess(train_and_collect, world, tmp_data,
                                   ["train.steps=6", "train.eval_every=0", f"train.eval_batch_size={size}"] + extra)
            for size in (0,) + sizes}
    for rank in range(world):
        ref = runs[0][rank]
        assert ref["final"]["eval_samples"] == 2048
        for size in sizes:
            got = runs[size][rank]
            assert got["losses"] == ref["losses"]
            assert got["final"]["eval_samples"] == 2048
            for k in ("auc", "logloss", "accuracy"):
                assert got["final"][k] == pytest.approx(ref["final"][k], rel=1e-6, abs=1e-7), (size, k)


def _evaluate(rank, world_size, tmp, overrides):
    from neo.embedding.cache import CacheCapacityError
    from neo.train.trainer import Trainer

    tr = Trainer(tiny_config(tmp, *overrides), log=lambda *a, **k: None)
    try:
        tr.evaluate()
    except CacheCapacityError as e:
        return str(e)
    finally:
        tr.release_checkpoint_dir()
    return None


def test_an_evaluation_batch_too_large_for_a_cache_says_so(tmp_data):
    (said,) = run_multiprocess(_evaluate, 1, tmp_data, BIGGER + CACHED + ["train.eval_batch_size=1000"])
    assert said is not None and said.startswith("table 'user#0': a batch needs "), said
    assert "This was an evaluation batch of train.eval_batch_size = 1000 samples (train.batch_size 64)" in said


def test_the_validation_loader_batches_at_eval_batch_size(tmp_data):
    from neo.train.trainer import Trainer

    tr = Trainer(tiny_config(tmp_data, "train.eval_batch_size=300"), log=lambda *a, **k: None)
    sizes = [b.batch_size for b in tr.val_loader]
    assert sizes == [300] * 6 + [248] and tr.train_loader.options.batch_size == 64
    tr.release_checkpoint_dir()


def test_eval_batch_size_must_not_be_negative(tmp_path):
    assert tiny_config(str(tmp_path)).train.eval_batch == 64          # 0: the training batch
    with pytest.raises(ConfigError, match=r"train\.eval_batch_size: must be >= 0, got -1"):
        tiny_config(str(tmp_path), "train.eval_batch_size=-1")
