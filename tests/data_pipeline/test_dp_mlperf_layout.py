"""The MLPerf / TorchRec day-file layout: written by ``neo-data mlperf-layout``, read back sample for
sample against its source (the synthetic generator's Parquet, or the Parquet it was converted
from), loaded like ``ParquetLoader`` (equal batches at W = 1; at W = 2 the ranks' slices of every
global batch), resumed from ``state_dict``, refused with named errors when a file is bad, and
trained with ``data.source: mlperf`` to the same losses as ``data.source: parquet`` on the same data.
"""

from __future__ import annotations

import json
import os
import re
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from data_pipeline.cli import main
from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.mlperf_layout import (LayoutError, MlperfLoader, check_shapes, open_days, scan_ids,
                                         split_segments)
from data_pipeline.reader import list_parquet_files, table_to_columns
from data_pipeline.schema import MLPERF_MULTI_HOT_SIZES, read_meta
from data_pipeline.writer import Columns

BAGS = [3, 2, 1, 1]
SYN = ["--rows", "100", "--dense", "4", "--seed", "3", "--workers", "1", "--no-progress"]


def _cli(*args: str) -> None:
    assert main(list(args)) == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Parquet sources (multi-hot and one-hot, 1300 samples in files of 500) and four layouts."""
    root = tmp_path_factory.mktemp("mlperf")
    d = {k: str(root / k) for k in ("pq_mh", "pq_oh", "syn_mh", "mh", "oh")}
    for name, bags in (("pq_mh", "3,2,1,1"), ("pq_oh", "1")):
        _cli("synth", "-o", d[name], "--samples", "1300", "--tables", "4", "--ids-per-bag", bags,
             "--rows-per-file", "500", "--row-group-rows", "128", *SYN, "--summary", str(root / f"{name}.json"))
    _cli("mlperf-layout", "--from-synthetic", "--samples", "1000", "--eval-samples", "300", "--days", "3",
         "--sizes", "3,2,1,1", "-o", d["syn_mh"], *SYN, "--summary", str(root / "s.json"))
    for name, src, extra in (("mh", "pq_mh", []), ("oh", "pq_oh", ["--one-hot"])):
        files = list_parquet_files(os.path.join(d[src], "train"))
        _cli("mlperf-layout", "--from-parquet", *files[:2], "--eval-parquet", files[2], "--days", "2",
             "-o", d[name], "--no-progress", "--summary", str(root / f"{name}.json"), *extra)
    return d


def test_from_parquet_refuses_the_synthetic_options(data, tmp_path, capsys):
    """--rows, --samples ... act only with --from-synthetic: with --from-parquet they are an error
    naming them, not ignored (audit of 2026-11-29)."""
    files = list_parquet_files(os.path.join(data["pq_mh"], "train"))
    out = tmp_path / "ml"
    assert main(["mlperf-layout", "--from-parquet", *files[:1], "--days", "2", "-o", str(out), "--rows", "10",
                 "--samples", "5", "--no-progress"]) == 2
    assert "--samples, --rows: options of --from-synthetic" in capsys.readouterr().err and not out.exists()


def test_a_rerun_never_mixes_days_and_a_failed_run_leaves_nothing(tmp_path, capsys, monkeypatch):
    """Days appear only whole: a rerun into an output with an earlier run's days is refused unless
    --overwrite, which replaces them all (3 days then 1 day: no day_2 left beside the new run); a
    run that fails mid-way leaves no day file, temporary part or staging directory; --days 0 is an
    argparse error, not a division by zero (audit of 2026-11-30)."""
    from data_pipeline import mlperf_write

    out = tmp_path / "ml"
    run = ["mlperf-layout", "--from-synthetic", "--samples", "60", "--eval-samples", "0", "--sizes", "1,2", *SYN,
           "-o", str(out)]
    _cli(*run, "--days", "3")
    assert sorted(p.name for p in out.glob("day_*_dense.npy")) == [f"day_{d}_dense.npy" for d in range(3)]
    assert main([*run, "--days", "1"]) == 2
    assert "already holds 10 file(s) of an earlier run (day_0_dense.npy, ...); pass --overwrite" in \
        capsys.readouterr().err
    (out / "mine.txt").write_text("kept")
    _cli(*run, "--days", "1", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["day_0_dense.npy", "day_0_labels.npy",
                                                    "day_0_sparse_multi_hot.npz", "mine.txt", "neo_layout.json"]
    layout = json.loads((out / "neo_layout.json").read_text())
    assert layout["days"] == {"0": 60} and layout["config"]["data.mlperf.dir"] == str(out)

    theirs = tmp_path / "theirs"                 # day files without neo_layout.json: MLPerf's own download
    theirs.mkdir()
    (theirs / "day_0_dense.npy").write_bytes(b"not ours")
    assert main([*run[:-1], str(theirs), "--days", "1", "--overwrite"]) == 2
    assert "without a neo_layout.json: not written by neo-data" in capsys.readouterr().err
    assert sorted(p.name for p in theirs.iterdir()) == ["day_0_dense.npy"]

    fresh = tmp_path / "failed"
    close = mlperf_write.DayWriter.close

    def fail_on_day_1(self):
        if "day_1_" in self.paths[0]:
            raise OSError("disk full (injected)")
        close(self)

    monkeypatch.setattr(mlperf_write.DayWriter, "close", fail_on_day_1)
    assert main([*run[:-1], str(fresh), "--days", "3"]) == 2
    assert "disk full (injected)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml", "theirs"]   # no output, no staging left
    with pytest.raises(SystemExit) as exit_info:
        main([*run, "--days", "0"])
    assert exit_info.value.code == 2 and "--days: must be >= 1, got 0" in capsys.readouterr().err


def _parquet_rows(directory: str) -> Columns:
    files = list_parquet_files(os.path.join(directory, "train"))
    meta = read_meta(pq.read_schema(files[0]))
    return Columns.concat([table_to_columns(pq.read_table(f), meta) for f in files])


def _layout_rows(directory: str, days, layout: str) -> Columns:
    opened = open_days(directory, days, layout, len(BAGS))
    return Columns.concat([opened[d].read(slice(0, opened[d].rows)) for d in days])


def _same(a: Columns, b: Columns) -> None:
    assert np.array_equal(a.label, b.label) and np.array_equal(a.dense, b.dense)
    for f, (x, y) in enumerate(zip(a.sparse, b.sparse)):
        assert np.array_equal(np.asarray(x).reshape(len(a), -1), np.asarray(y).reshape(len(b), -1)), f


def test_written_layouts_equal_their_sources(data):
    syn = _layout_rows(data["syn_mh"], [0, 1, 2, 3], "multi_hot")      # the generator's samples 0..1299
    _same(syn, _parquet_rows(data["pq_mh"]))
    _same(_layout_rows(data["mh"], [0, 1, 2], "multi_hot"), _parquet_rows(data["pq_mh"]))
    _same(_layout_rows(data["oh"], [0, 1, 2], "one_hot"), _parquet_rows(data["pq_oh"]))
    meta = json.load(open(os.path.join(data["syn_mh"], "neo_layout.json")))
    assert meta["days"] == {"0": 333, "1": 333, "2": 334, "3": 300} and meta["eval_day"] == 3
    assert 0.5 < meta["best_auc_validation"] <= 1 and meta["validation_rows"] == 150
    # the reference's dtypes and shapes; np.load (no memory map) reads the same arrays
    z = np.load(os.path.join(data["mh"], "day_0_sparse_multi_hot.npz"))
    assert sorted(z.files, key=int) == ["0", "1", "2", "3"] and z["0"].dtype == np.int32 and z["0"].shape == (500, 3)
    assert all(i.compress_type == zipfile.ZIP_STORED for i in zipfile.ZipFile(z.fid).infolist())
    assert np.load(os.path.join(data["mh"], "day_0_labels.npy")).shape == (500, 1)
    assert np.load(os.path.join(data["oh"], "day_1_sparse.npy")).dtype == np.int32


def test_reads_numpy_savez_and_fortran_order(tmp_path):
    """Files as the reference's scripts write them: np.savez members (a zip64 extra field in each local
    header, absent from the central directory), a transposed (Fortran-order) one-hot sparse .npy."""
    rng = np.random.default_rng(0)
    bags = [rng.integers(0, 50, (7, k)).astype(np.int32) for k in BAGS]
    dense, labels = rng.random((7, 4), dtype=np.float32), rng.integers(0, 2, (7, 1)).astype(np.int32)
    for layout in ("multi_hot", "one_hot"):
        d = tmp_path / layout
        d.mkdir()
        np.save(d / "day_0_dense.npy", dense)
        np.save(d / "day_0_labels.npy", labels)
        if layout == "multi_hot":
            np.savez(d / "day_0_sparse_multi_hot.npz", **{str(f): b for f, b in enumerate(bags)})
        else:
            np.save(d / "day_0_sparse.npy", np.stack([b[:, 0] for b in bags]).astype(np.int64).T)  # (7, 4), F order
        day = open_days(str(d), [0], layout, 4)[0]
        cols = day.read(np.array([1, 4, 6]))
        assert np.array_equal(cols.dense, dense[[1, 4, 6]]) and np.array_equal(cols.label, labels[[1, 4, 6], 0])
        for f, b in enumerate(bags):
            want = b[[1, 4, 6]] if layout == "multi_hot" else b[[1, 4, 6], 0]
            assert np.array_equal(cols.sparse[f], want)


def _opts(**kw) -> LoaderOptions:
    base = dict(batch_size=64, shuffle=True, shuffle_window=300, seed=5, prefetch_batches=2)
    return LoaderOptions(**dict(base, **kw))


def _mh_train(data):
    return split_segments(open_days(data["mh"], [0, 1, 2], "multi_hot", 4), "train", [0, 1])


def _batch_equal(a, b) -> bool:
    pairs = ((a.dense, b.dense), (a.labels, b.labels), (a.sparse.values, b.sparse.values),
             (a.sparse.lengths, b.sparse.lengths))
    return all(torch.equal(x, y) for x, y in pairs) and a.sparse.keys == b.sparse.keys


def test_loader_equals_parquet_loader_at_one_rank(data):
    files = list_parquet_files(os.path.join(data["pq_mh"], "train"))[:2]
    for drop in (False, True):
        ours = list(MlperfLoader(_mh_train(data), _opts(drop_last=drop)))
        ref = list(ParquetLoader(files, _opts(drop_last=drop)))
        assert len(ours) == len(ref) == (15 if drop else 16) and all(_batch_equal(a, b) for a, b in zip(ours, ref))
    val = split_segments(open_days(data["mh"], [2], "multi_hot", 4), "validation", eval_day=2)
    test = split_segments(open_days(data["mh"], [2], "multi_hot", 4), "test", eval_day=2)
    assert (val[0].begin, val[0].end, test[0].begin, test[0].end) == (0, 150, 150, 300)


def test_two_ranks_take_their_slice_of_every_global_batch(data):
    for drop in (False, True):
        one = list(MlperfLoader(_mh_train(data), _opts(batch_size=64, drop_last=drop)))
        ranks = [list(MlperfLoader(_mh_train(data), _opts(batch_size=32, rank=r, world_size=2, drop_last=drop)))
                 for r in range(2)]
        assert [len(r) for r in ranks] == [16, 16] if not drop else [15, 15]
        for g, b in enumerate(one):
            parts = [r[g] for r in ranks if g < len(r)]
            assert torch.equal(torch.cat([p.dense for p in parts]), b.dense)
            assert torch.equal(torch.cat([p.labels for p in parts]), b.labels)
        seen = sorted(tuple(x) for r in ranks for bt in r for x in bt.dense.tolist())
        assert seen == sorted(tuple(x) for bt in one for x in bt.dense.tolist())   # each sample once


def test_state_dict_resumes_exactly_and_across_world_sizes(data):
    full = list(MlperfLoader(_mh_train(data), _opts()))
    a = MlperfLoader(_mh_train(data), _opts())
    it = iter(a)
    head = [next(it) for _ in range(5)]
    it.close()
    b = MlperfLoader(_mh_train(data), _opts(prefetch_batches=0))
    b.load_state_dict(a.state_dict())
    assert all(_batch_equal(x, y) for x, y in zip(head + list(b), full)) and b.epoch == 1
    # two ranks stopped after 3 batches of 32; one rank resumes at 3 * 32 * 2 samples (batches of 64)
    c = MlperfLoader(_mh_train(data), _opts(batch_size=64))
    c.load_state_dict(dict(c.state_dict(), position=3 * 32 * 2))
    assert _batch_equal(next(iter(c)), full[3])
    with pytest.raises(ValueError, match="world_size=1.*has 2"):
        MlperfLoader(_mh_train(data), _opts(world_size=2)).load_state_dict(a.state_dict())


def _copy(src: str, dst) -> str:
    import shutil
    shutil.copytree(src, dst)
    return str(dst)


def test_bad_files_are_named_with_their_numbers(data, tmp_path):
    d = _copy(data["mh"], tmp_path / "missing")
    os.remove(os.path.join(d, "day_1_labels.npy"))
    with pytest.raises(LayoutError, match=r"day_1_labels\.npy: missing"):
        open_days(d, [0, 1], "multi_hot", 4)
    d = _copy(data["mh"], tmp_path / "trunc")
    p = os.path.join(d, "day_0_dense.npy")
    size = os.path.getsize(p)
    os.truncate(p, size - 100)
    with pytest.raises(LayoutError, match=rf"day_0_dense\.npy: truncated: .*float32 \(500, 4\) = {size} bytes, "
                                          rf"the file holds {size - 100} bytes \(493 of 500 rows\)"):
        open_days(d, [0], "multi_hot", 4)
    p = os.path.join(d, "day_1_sparse_multi_hot.npz")
    os.truncate(p, os.path.getsize(p) // 2)
    with pytest.raises(LayoutError, match=r"day_1_sparse_multi_hot\.npz: not a complete zip archive \(\d+ bytes"):
        open_days(d, [1], "multi_hot", 4)
    d = _copy(data["oh"], tmp_path / "rows")
    np.save(os.path.join(d, "day_0_labels.npy"), np.zeros((499, 1), np.int32))
    with pytest.raises(LayoutError, match=r"day 0: row counts differ: .*day_0_dense\.npy has 500 rows, "
                                          r".*day_0_sparse\.npy has 500, .*day_0_labels\.npy has 499"):
        open_days(d, [0], "one_hot", 4)
    d = _copy(data["mh"], tmp_path / "zipped")
    z = np.load(os.path.join(d, "day_0_sparse_multi_hot.npz"))
    np.savez_compressed(os.path.join(d, "day_0_sparse_multi_hot.npz"), **{k: z[k] for k in z.files})
    with pytest.raises(LayoutError, match=r"\[0\.npy\]: compressed"):
        open_days(d, [0], "multi_hot", 4)
    days = open_days(data["mh"], [0], "multi_hot", 4)
    with pytest.raises(LayoutError, match=r"day_0_sparse_multi_hot\.npz\[1\.npy\]: bags of 2 ids, "
                                          r"data\.mlperf\.multi_hot_sizes\[1\] = 3"):
        check_shapes(days, [3, 3, 1, 1])
    assert check_shapes(days, BAGS) == 4
    msg = scan_ids(list(days.values()), [100, 100, 100, 40], [f"cat_{f}" for f in range(4)], None)
    assert msg is not None and "day_0_sparse_multi_hot.npz[3.npy]: row " in msg and "num_rows = 40" in msg
    assert scan_ids(list(days.values()), [100] * 4, ["a"] * 4, None) is None


def test_bad_labels_and_dense_values_are_named_with_file_and_row(data, tmp_path):
    """As the Parquet reader refuses them: labels outside [0, 1] (NaN too) and non-finite dense
    values, found as the rows are read (a slice or a loader's shuffled indices)."""
    d = _copy(data["mh"], tmp_path / "labels")
    labels = np.load(os.path.join(d, "day_0_labels.npy"))
    labels[[7, 9]] = 7
    np.save(os.path.join(d, "day_0_labels.npy"), labels)
    day = open_days(d, [0], "multi_hot", 4)[0]
    day.read(slice(0, 7))                                                      # rows before the bad one
    with pytest.raises(LayoutError, match=r"day_0_labels\.npy: row 7 holds label 7, labels must be in \[0, 1\] "
                                          r"\(2 such rows in the 500 read\)"):
        day.read(slice(0, 500))
    with pytest.raises(LayoutError, match=r"day_0_labels\.npy: row 9 holds label 7"):
        day.read(np.array([3, 9, 400]))
    np.save(os.path.join(d, "day_0_labels.npy"), np.where(labels == 7, np.nan, labels).astype(np.float32))
    with pytest.raises(LayoutError, match=r"row 7 holds label nan"):
        open_days(d, [0], "multi_hot", 4)[0].read(slice(0, 500))
    d = _copy(data["mh"], tmp_path / "dense")
    dense = np.load(os.path.join(d, "day_1_dense.npy"))
    dense[123, 2] = np.inf
    np.save(os.path.join(d, "day_1_dense.npy"), dense)
    with pytest.raises(LayoutError, match=r"day_1_dense\.npy: row 123 feature 2 is inf \(1 non-finite values in the "
                                          r"24 rows read\); dense features must be finite"):
        open_days(d, [1], "multi_hot", 4)[1].read(slice(100, 124))
    train = [s for s in split_segments(open_days(d, [0, 1], "multi_hot", 4), "train", [0, 1])]
    with pytest.raises(LayoutError, match=r"day_1_dense\.npy: row 123 feature 2 is inf"):
        for _ in MlperfLoader(train, _opts()):
            pass


# ----------------------------------------------------------------------------- training
def _config(tmp: str, data_section: dict, rows: int = 100) -> dict:
    return {"topology": {"hbm_gib": 1},
            "tables": [{"name": f"t{i}", "num_rows": rows, "dim": 8, "optimizer": {"type": "adagrad", "lr": 0.1}}
                       for i in range(4)],
            "model": {"interaction": "dot", "dense_arch": [16, 8], "over_arch": [16, 1]},
            "data": dict(data_section, prefetch_batches=2, shuffle_window=300),
            "optim": {"type": "adagrad", "lr": 0.05},
            "train": {"batch_size": 64, "steps": 6, "eval_every": 0, "log_every": 100, "run_dir": f"{tmp}/run",
                      "progress": False, "seed": 0}}


def _train(rank: int, world_size: int, configs):
    """Each config trained in turn in this process: losses and final metrics, or the error's text."""
    from neo.config import config_from_dict
    from neo.train.trainer import Trainer

    out = []
    for c in configs:
        try:
            tr = Trainer(config_from_dict(c), log=lambda *a, **k: None)
            final = tr.fit()
            out.append({"losses": tr.losses, "final": final})
        except LayoutError as e:
            out.append({"error": str(e)})
    return out


def test_training_on_the_layout_equals_training_on_parquet(data, tmp_path):
    from tests.multiprocess import run_multiprocess

    files = list_parquet_files(os.path.join(data["pq_mh"], "train"))
    mlperf = {"source": "mlperf", "mlperf": {"dir": data["mh"], "train_days": ["0-1"], "val_day": 2,
                                             "multi_hot_sizes": BAGS}}
    parquet = {"source": "parquet", "train_paths": files[:2], "val_paths": files[2:]}
    bad = {"source": "mlperf", "mlperf": dict(mlperf["mlperf"])}
    (ours, ref, err), = run_multiprocess(_train, 1, [_config(str(tmp_path / "a"), mlperf),
                                                     _config(str(tmp_path / "b"), parquet),
                                                     _config(str(tmp_path / "c"), bad, rows=60)])
    assert len(ours["losses"]) == 6 and ours["losses"] == ref["losses"]      # same samples, same order
    assert ours["final"]["eval_samples"] == 150 and ref["final"]["eval_samples"] == 300   # validation half / file
    assert "num_rows = 60" in err["error"] and "cat_" in err["error"]


def _neo_train(rank: int, world_size: int, config: dict):
    """``neo train``'s run() on ``config``: (exit status, what it printed on stderr)."""
    import contextlib
    import io

    from neo.commands.train import run
    from neo.config import config_from_dict

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run(config_from_dict(config))
    return status, err.getvalue()


def test_neo_train_stops_with_status_2_on_a_bad_row(data, tmp_path):
    """A bad label met mid-run (not in the first batches read): one line naming the file and row,
    exit status 2 (as a config error), not a traceback."""
    from tests.multiprocess import run_multiprocess

    d = _copy(data["mh"], tmp_path / "bad")
    labels = np.load(os.path.join(d, "day_1_labels.npy"))
    labels[400] = 2                                   # global sample 900 of 1000: read in the last batches
    np.save(os.path.join(d, "day_1_labels.npy"), labels)
    mlperf = {"source": "mlperf", "mlperf": {"dir": d, "train_days": ["0-1"], "val_day": 2, "multi_hot_sizes": BAGS}}
    cfg = _config(str(tmp_path / "run"), mlperf)
    cfg["train"].update(steps=0, epochs=1)
    cfg["data"]["shuffle"] = False
    (status, err), = run_multiprocess(_neo_train, 1, cfg)
    assert status == 2 and "Traceback" not in err, err
    assert re.search(r"neo train: error: .*day_1_labels\.npy: row 400 holds label 2, labels must be in \[0, 1\]", err), err


@pytest.mark.parametrize("id_check", ["off", "head"])
def test_an_id_past_its_table_met_mid_run_is_named_with_file_and_row(data, tmp_path, id_check):
    """The id scan off, or reading only the first rows: the loader checks each batch's ids as it
    reads them; one line naming the day file, row, column and table, exit status 2."""
    from tests.multiprocess import run_multiprocess

    d = _copy(data["mh"], tmp_path / "bad")
    os.remove(os.path.join(d, "neo_layout.json"))          # no table sizes to check at setup
    path = os.path.join(d, "day_1_sparse_multi_hot.npz")
    arrays = dict(np.load(path))
    arrays["1"][400, 1] = 150                               # global sample 900 of 1000
    np.savez(path, **arrays)
    mlperf = {"source": "mlperf", "mlperf": {"dir": d, "train_days": ["0-1"], "val_day": 2, "multi_hot_sizes": BAGS,
                                             "id_check": id_check, "id_check_rows": 100}}
    cfg = _config(str(tmp_path / "run"), mlperf)
    cfg["train"].update(steps=0, epochs=1)
    cfg["data"]["shuffle"] = id_check == "head"            # shuffled: the file row still named
    (status, err), = run_multiprocess(_neo_train, 1, cfg)
    assert status == 2 and "Traceback" not in err, err
    assert re.search(r"neo train: error: \S*day_1_sparse_multi_hot\.npz\[1\.npy\]: column 'cat_1' row 400: id 150 is "
                     r"outside \[0, 100\) of table 't1' \(num_rows\)", err), err


def _prepare(tmp: str, mlperf: dict, rows: int = 100):
    import types

    from neo.config import config_from_dict
    from neo.train.build import resolve_tables
    from neo.train.data import make_loaders, prepare_data

    cfg = config_from_dict(_config(tmp, {"source": "mlperf", "mlperf": mlperf}, rows))
    one = types.SimpleNamespace(rank=0, world_size=1)
    spec = prepare_data(cfg, resolve_tables(cfg), one)
    return spec, make_loaders(cfg, spec, one)


def test_config_and_checks_before_training(data, tmp_path):
    from neo.config import ConfigError
    from neo.config.data import MLPERF_MULTI_HOT_SIZES as CONFIG_SIZES, parse_days

    assert CONFIG_SIZES == list(MLPERF_MULTI_HOT_SIZES)
    assert parse_days(["0-2", 5, "7"], "d") == [0, 1, 2, 5, 7]
    with pytest.raises(ConfigError, match=r"data\.mlperf\.train_days\[0\]: '3-1'"):
        _prepare(str(tmp_path), {"dir": data["mh"], "train_days": ["3-1"]})
    with pytest.raises(ConfigError, match=r"data\.mlperf\.layout: 'two_hot' is not one of \['multi_hot', 'one_hot'\]"):
        _prepare(str(tmp_path), {"dir": data["mh"], "layout": "two_hot"})
    with pytest.raises(ConfigError, match=r"data\.mlperf\.dir: needed"):
        _prepare(str(tmp_path), {})
    base = {"dir": data["mh"], "train_days": [0, 1], "val_day": 2, "multi_hot_sizes": BAGS}
    with pytest.raises(ConfigError, match=r"data\.mlperf\.val_day: day 1 is also a training day .*trained on"):
        _prepare(str(tmp_path), dict(base, val_day=1))
    with pytest.raises(LayoutError, match=r"day_5_dense\.npy: missing, with 2 other file\(s\) of days \[0, 1, 5\]"):
        _prepare(str(tmp_path), dict(base, val_day=5))
    with pytest.raises(LayoutError, match=r"\[0\.npy\]: bags of 3 ids, data\.mlperf\.multi_hot_sizes\[0\] = 2"):
        _prepare(str(tmp_path), dict(base, multi_hot_sizes=[2, 2, 1, 1]))
    with pytest.raises(LayoutError, match=r"neo_layout\.json: feature 0 \(cat_0\) has ids below "
                                          r"table_sizes\[0\] = 100, table 't0' has num_rows = 60"):
        _prepare(str(tmp_path), base, rows=60)
    bare = _copy(data["mh"], tmp_path / "bare")                 # no neo_layout.json: the id scan decides
    os.remove(os.path.join(bare, "neo_layout.json"))
    with pytest.raises(LayoutError, match=r"day_0_sparse_multi_hot\.npz\[0\.npy\]: row \d+: feature 0 \(cat_0 -> "
                                          r"table 't0'\) has id \d+, outside \[0, num_rows = 60\)"):
        _prepare(str(tmp_path), dict(base, dir=bare), rows=60)
    spec, (train, val) = _prepare(str(tmp_path), dict(base, dir=bare, fold_ids=True), rows=60)
    assert spec.best_auc is None and val.num_samples == 150 and spec.num_dense == 4
    # one_hot: ids folded modulo the tables' rows while read, as the reference's ``hashes``
    spec, (train, val) = _prepare(str(tmp_path), dict(base, dir=data["oh"], layout="one_hot"), rows=60)
    raw = _layout_rows(data["oh"], [0, 1], "one_hot")
    loader = MlperfLoader(spec.mlperf.train, _opts(shuffle=False), spec.mlperf.fold_rows)
    got = torch.cat([b.sparse.values.view(4, -1) for b in loader], 1)                  # (F, N)
    assert torch.equal(got, torch.from_numpy(np.stack(raw.sparse) % 60))
    assert train.num_samples == 1000 and train.meta.table_sizes == [60] * 4


def test_two_ranks_share_the_id_scan_and_its_error(data, tmp_path):
    """W = 2: rank r scans days r, r + 2, ...; the bad id of day 1, found by rank 1 alone, stops both
    ranks before training with the same message. Then the good files train and evaluate at W = 2."""
    from tests.multiprocess import run_multiprocess

    bad = _copy(data["mh"], tmp_path / "bad")
    path = os.path.join(bad, "day_1_sparse_multi_hot.npz")
    arrays = dict(np.load(path))
    arrays["0"][7, 1] = 150
    np.savez(path, **arrays)
    cfg = _config(str(tmp_path), {"source": "mlperf", "mlperf": {"dir": bad, "train_days": [0, 1], "val_day": None,
                                                                 "multi_hot_sizes": BAGS}})
    good = _config(str(tmp_path), {"source": "mlperf",
                                   "mlperf": dict(cfg["data"]["mlperf"], dir=data["mh"], val_day=2)})
    good["train"].update(batch_size=32, steps=2)
    ((e0, g0), (e1, g1)) = run_multiprocess(_train, 2, [cfg, good])
    assert len(g0["losses"]) == 2 and g0["final"]["eval_samples"] == g1["final"]["eval_samples"] == 150
    assert e0 == e1 and "day_1_sparse_multi_hot.npz[0.npy]: row 7: feature 0 (cat_0 -> table 't0') has id 150, " \
        "outside [0, num_rows = 100)" in e0["error"]
