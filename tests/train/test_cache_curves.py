"""The planner's miss-ratio curves measured on the training data (``measure_cache_curves``): the
steady state of each simulated cache, not its first batches from empty.

The oracle reads the same global batches through its own loader and runs ``simulate()`` (the
cache index of training, every batch admitted in order) over all of them: a share's hit rate
must be that of the ``cache_sample_batches`` batches after the cache's misses first reach twice
its slots, exactly; a share whose cache the data cannot warm takes the skew model at the Zipf
exponent fitted to the first batches' distinct rows."""

from __future__ import annotations

import types

import numpy as np
import pytest

from neo.planner.cache_model import CACHE_FRACTIONS, fit_skew, hit_rate
from neo.train.build import measure_cache_curves, resolve_tables
from neo.train.data import feature_mapping, make_loaders, prepare_data, rename_features
from tests.planner.test_planner_cache import warm_window
from tests.train.test_trainer import tiny_config

ONE = types.SimpleNamespace(rank=0, world_size=1, local_world_size=1)
CACHED = ["tables.0.num_rows=3000", "tables.0.placement=cached", "tables.0.cache_policy=lookahead",
          "tables.0.cache_lookahead=4", "data.synthetic.distribution=zipf", "sharding.cache_sample_batches=8"]
BATCH = 64


def the_batches(cfg, data):
    """The user table's sorted distinct ids and id count of every global batch, in order."""
    tables = resolve_tables(cfg)
    loader, _ = make_loaders(cfg, data, ONE)
    mapping = feature_mapping(loader.meta.sparse_names, tables)
    rows, ids = [], []
    for batch in loader:
        values = rename_features(batch, mapping).sparse.feature(tables[0].feature_names[0])[0].numpy()
        rows.append(np.unique(values))
        ids.append(len(values))
    return rows, ids


@pytest.mark.parametrize("warmup", [512, 0])
def test_curves_are_the_warm_caches_hit_rates(tmp_data, warmup):
    cfg = tiny_config(tmp_data, *CACHED, f"train.batch_size={BATCH}", f"sharding.cache_warmup_batches={warmup}")
    data = prepare_data(cfg, resolve_tables(cfg), ONE, log=lambda *a, **k: None)
    specs = cfg.table_specs()
    got = measure_cache_curves(cfg, data, specs, [True, False, False, False], BATCH)
    assert got[1:] == specs[1:]                          # the tables it may not cache are left alone
    user = got[0]
    batches, ids = the_batches(cfg, data)
    counted = cfg.sharding.cache_sample_batches
    first = batches[:counted]
    assert user.distinct_per_batch == pytest.approx(np.mean([len(b) for b in first]))
    need = max(len(np.union1d(a, b)) for a, b in zip(first, first[1:]))
    shares = [f for f in CACHE_FRACTIONS if np.ceil(f * 3000) >= need]
    assert [f for f, _ in user.hit_curve] == shares and shares
    skew = fit_skew(3000, float(np.mean(ids[:counted])), user.distinct_per_batch)
    warm = 0
    for f, h in user.hit_curve:
        C = int(np.ceil(f * 3000))
        expected = warm_window(batches[:counted + warmup], 3000, C, "lookahead", 4, counted)
        if expected is None:
            expected = hit_rate(f, 3000, skew, float(np.mean(ids[:counted])), policy="lookahead", lookahead=4)
        else:
            warm += 1
            cold = warm_window(first, 3000, C, "lookahead", 4, counted, turnovers=0.0)
            assert h > cold                              # what the first batches from empty say
        assert h == pytest.approx(expected, abs=1e-12), f
    assert warm == (len(shares) - 1 if warmup else 0)   # the data warms all but the largest cache


def test_caches_past_the_memory_or_work_budget_take_the_fitted_model(tmp_data, monkeypatch):
    """Memory for one simulated cache only: the smallest share is simulated (its warm rate, as in
    the test above), the others take the skew model at the fitted exponent. A work budget the first
    batches already spend: reading stops there, and every share takes the model."""
    import neo.train.build as build

    cfg = tiny_config(tmp_data, *CACHED, f"train.batch_size={BATCH}")
    data = prepare_data(cfg, resolve_tables(cfg), ONE, log=lambda *a, **k: None)
    batches, ids = the_batches(cfg, data)
    counted = cfg.sharding.cache_sample_batches
    n = float(np.mean(ids[:counted]))
    skew = fit_skew(3000, n, float(np.mean([len(b) for b in batches[:counted]])))
    model = {f: hit_rate(f, 3000, skew, n, policy="lookahead", lookahead=4) for f in CACHE_FRACTIONS}
    smallest = 16 * 3000 + 24 * int(np.ceil(0.05 * 3000))
    monkeypatch.setattr(build, "CURVE_MEMORY_BYTES", smallest)
    user = measure_cache_curves(cfg, data, cfg.table_specs(), [True, False, False, False], BATCH)[0]
    first, *rest = user.hit_curve
    assert first[0] == 0.05 and first[1] == warm_window(batches, 3000, 150, "lookahead", 4, counted)
    assert rest and all(h == pytest.approx(model[f], abs=1e-12) for f, h in rest)
    monkeypatch.setattr(build, "CURVE_MEMORY_BYTES", 2 << 30)
    monkeypatch.setattr(build, "CURVE_WORK_ROWS", 1)
    user = measure_cache_curves(cfg, data, cfg.table_specs(), [True, False, False, False], BATCH)[0]
    assert all(h == pytest.approx(model[f], abs=1e-12) for f, h in user.hit_curve)
