"""Synthetic data: determinism, planted teacher, Zipf skew, production locality preset."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from dp_helpers import sample_path
from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.locality import (NUM_BUCKETS, fit_mixture, fit_skew, parse_locality_stats, reuse_histogram,
                                    target_histogram, total_variation, zipf_ranks)
from data_pipeline.synthetic import GEN_BLOCK, SynthOptions, _teacher, apply_preset, auc, generate, generate_block
from data_pipeline.writer import WriterOptions


def small(tmp, **kw):
    base = dict(num_samples=GEN_BLOCK + 12345, output=str(tmp), num_dense=4, table_rows=[50, 1000, 100000],
                ids_per_bag=[1], seed=7, workers=1, auc_samples=50000,
                writer=WriterOptions(rows_per_file=30000, row_group_rows=8192))
    base.update(kw)
    return SynthOptions(**base)


def read_all(d):
    return pq.read_table(str(d / "train")).replace_schema_metadata(None)


def test_deterministic_regardless_of_workers_and_sharding(tmp_path):
    s1 = generate(small(tmp_path / "a"))
    s2 = generate(small(tmp_path / "b", workers=2, writer=WriterOptions(rows_per_file=1 << 20, row_group_rows=5000)))
    assert len(s1["files"]) == 3 and len(s2["files"]) == 1
    t1, t2 = read_all(tmp_path / "a"), read_all(tmp_path / "b")
    assert t1.num_rows == GEN_BLOCK + 12345 and t1.equals(t2)
    assert s1["best_auc"] == s2["best_auc"]
    generate(small(tmp_path / "p", workers=2, executor="process"))
    assert read_all(tmp_path / "p").equals(t1)
    generate(small(tmp_path / "c", seed=8))
    assert not read_all(tmp_path / "c").equals(t1)
    meta = pq.read_schema(s1["files"][0]).metadata[b"neo.data"].decode()
    assert '"best_auc"' in meta and '"seed": 7' in meta


def test_teacher_is_learnable_and_auc_exact(tmp_path):
    o = small(tmp_path, num_samples=40000, auc_samples=40000)
    s = generate(o)
    cols, p = generate_block(o, _teacher(o), 0)
    assert s["best_auc"] == pytest.approx(auc(cols.label, p), abs=1e-12)
    assert 0.70 < s["best_auc"] < 0.95
    # a check that the AUC routine is exact: Mann-Whitney by brute force on a small sample
    y, q = cols.label[:300].astype(bool), np.round(p[:300], 2)  # ties included
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a in q[y] for b in q[~y]]
    assert auc(y, q) == pytest.approx(np.mean(pairs), abs=1e-12)
    assert 0.15 < s["positive_rate"] < 0.4
    # learnable: the dense part alone, by a least-squares fit, ranks clicks better than chance
    t = read_all(tmp_path)
    X = t.column("dense").combine_chunks().flatten().to_numpy().reshape(-1, 4)
    yy = t.column("label").to_numpy().astype(float)
    w, *_ = np.linalg.lstsq(np.c_[X, np.ones(len(X))], yy, rcond=None)
    assert auc(yy, np.c_[X, np.ones(len(X))] @ w) > 0.6


def test_multi_hot_and_variable_bags_load(tmp_path):
    generate(small(tmp_path / "f", num_samples=3000, ids_per_bag=[1, 3, 2]))
    generate(small(tmp_path / "v", num_samples=3000, ids_per_bag=[2], variable_bags=True))
    bf = next(iter(ParquetLoader(str(tmp_path / "f" / "train"), LoaderOptions(batch_size=100))))
    bf.sparse.check()
    assert bf.sparse.length_per_key() == [100, 300, 200]
    bv = next(iter(ParquetLoader(str(tmp_path / "v" / "train"), LoaderOptions(batch_size=100))))
    bv.sparse.check()
    assert int(bv.sparse.lengths.min()) == 0 and int(bv.sparse.lengths.max()) == 4
    for f, rows in enumerate([50, 1000, 100000]):
        v, _, _ = bv.sparse.feature(f"cat_{f}")
        assert int(v.min()) >= 0 and int(v.max()) < rows


def test_zipf_skew_controls_reuse():
    rng = np.random.default_rng(0)
    u = reuse_histogram(zipf_ranks(rng, 1 << 16, 1 << 20, 0.0))
    z = reuse_histogram(zipf_ranks(rng, 1 << 16, 1 << 20, 1.2))
    assert u.sum() == pytest.approx(1) and z.sum() == pytest.approx(1)
    assert u[0] > 0.9 and z[0] < 0.5  # uniform: nearly all rows seen once per batch; Zipf: heavy reuse
    r = zipf_ranks(rng, 100000, 1000, 1.0)
    assert r.min() >= 0 and r.max() < 1000 and np.mean(r < 10) > np.mean((r >= 500) & (r < 510)) * 20


def test_mixture_fit_is_not_fitted_to_one_draws_noise():
    """The distance fit_mixture reports is the one its tables reach on fresh batches (their
    histograms averaged over fresh draws), not one draw's luck. Fitted to a single draw per
    candidate (draws=1), production-2022's 26 tables claimed 0.086 at seed 9 and 0.077 at seed 10
    while fresh batches of them averaged to 0.121 and 0.096; with the default four draws the gap
    is below 0.003 at both (below 0.011 at seeds 0-11 of both years)."""
    target, sec = target_histogram(sample_path("dlrm_datasets_2022_locality_stats.txt"))
    tgt = target / target.sum()
    for seed in (9, 10):
        mix = fit_mixture(target, sec.batch_size, 26, seed=seed)
        rng = np.random.default_rng([seed, 999])
        fresh = np.mean([np.mean([reuse_histogram(zipf_ranks(rng, sec.batch_size, rows, s)) for _ in range(6)], axis=0)
                         for rows, s in mix.tables], axis=0)   # (17,) the tables' expected histogram
        assert total_variation(fresh, tgt) < mix.tv_distance + 0.015, (seed, mix.tv_distance)
    with pytest.raises(ValueError, match=r"draws: must be >= 1, got 0"):
        fit_mixture(target, 100, 2, draws=0)


@pytest.mark.parametrize("year", ["2021", "2022"])
def test_locality_stats_and_preset(tmp_path, year):
    path = sample_path(f"dlrm_datasets_{year}_locality_stats.txt")
    secs = parse_locality_stats(path)
    assert len(secs) == {"2021": 17, "2022": 16}[year]
    for s in secs:
        assert len(s.index_ratio) == NUM_BUCKETS and abs(s.index_ratio.sum() - 1) < 0.02
    target, sec = target_histogram(path)
    if year == "2021":  # the aggregate section, as quoted in the README
        assert sec.name == "fbgemm_t856_bs65536.pt" and target[0] == pytest.approx(0.069, abs=1e-3)
    single = fit_skew(target, sec.batch_size, 100000)
    o = apply_preset(SynthOptions(num_samples=sec.batch_size, output=str(tmp_path), workers=2, auc_samples=5000),
                     f"production-{year}", path)   # its 26 tables: the 2022 fit 0.083-0.086 and the
    # generated batch 0.083-0.086 at seeds 0-15 (fitted to one draw per candidate, the batch measured
    # 0.1018 at seeds shifted by 67, 0.124 at seed 9: test_mixture_fit_is_not_fitted_to_one_draws_noise)
    assert o.locality["tv_distance"] < single.tv_distance and o.locality["tv_distance"] < 0.1
    assert len(o.table_rows) == 26 and len(o.skew) == 26 and o.locality["batch_size"] == sec.batch_size
    s = generate(o)
    measured = s["locality_measured"]
    assert measured["samples_used"] == sec.batch_size and measured["tv_distance"] < 0.1
    assert total_variation(target, target) == 0


def test_coprime_multiplier_makes_a_bijection_of_the_rows():
    """The first multiplier at or after ``start`` coprime with ``rows``: ``rank * a + c`` then
    maps the rows onto themselves (the synthetic ids, bench_embedding's --skew, bench_cache)."""
    import numpy as np

    from data_pipeline.locality import coprime_multiplier

    assert coprime_multiplier(12, 4) == 5 and coprime_multiplier(12, 5) == 5 and coprime_multiplier(7, 14) == 15
    for rows, start in ((1000, 250), (997, 1_000_003), (2**10, 2654435761)):
        a = coprime_multiplier(rows, start)
        assert a >= start and sorted(((np.arange(rows) * a + 3) % rows).tolist()) == list(range(rows))
