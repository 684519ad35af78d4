"""Bad Parquet files: wrong shapes, bad values, nulls, missing columns, files that are not Parquet.
Each is an error naming the file (where the reader is told it) and the column, never a silent
shift of rows or a NaN in training."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline.cli import main
from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.reader import list_parquet_files, table_to_columns
from data_pipeline.schema import META_KEY, DataFileError, DatasetMeta, read_meta, sparse_names

N, D = 6, 3
META = DatasetMeta(num_dense=D, sparse_names=sparse_names(2), source="test")


def _dense(values=None, width=D):
    v = np.arange(N * width, dtype=np.float32) if values is None else np.asarray(values, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(v), width)


def _table(label=None, dense=None, cats=None, drop=None) -> pa.Table:
    cols = {"label": pa.array(np.zeros(N, np.int8)) if label is None else label,
            "dense": _dense() if dense is None else dense}
    for i, c in enumerate(cats or [pa.array(np.arange(N, dtype=np.int64))] * 2):
        cols[f"cat_{i}"] = c
    if drop:
        cols.pop(drop)
    return pa.table(cols).replace_schema_metadata({META_KEY: META.to_json().encode()})


def _write(tmp_path, name, table) -> str:
    path = str(tmp_path / name)
    pq.write_table(table, path)
    return path


def _load_all(path):
    return list(ParquetLoader(path, LoaderOptions(batch_size=2, shuffle=False, prefetch_batches=0)))


def test_good_file_loads(tmp_path):
    path = _write(tmp_path, "good.parquet", _table())
    batches = _load_all(path)
    assert sum(len(b.labels) for b in batches) == N
    np.testing.assert_array_equal(np.concatenate([b.dense.numpy() for b in batches]),
                                  np.arange(N * D, dtype=np.float32).reshape(N, D))


def test_ragged_dense_list_with_the_right_total_is_refused(tmp_path):
    """Row lengths 2, 4, 3, 3, 3, 3 sum to N * D: reshaping would shift every value of rows 0-1."""
    offs = pa.array(np.array([0, 2, 6, 9, 12, 15, 18], np.int32))
    ragged = pa.ListArray.from_arrays(offs, pa.array(np.arange(18, dtype=np.float32)))
    tb = _table(dense=ragged)
    with pytest.raises(DataFileError, match=r"f.parquet row group 0: column 'dense': row 0 holds 2 values.* 3 per"):
        table_to_columns(tb, META, source="f.parquet row group 0")
    path = _write(tmp_path, "ragged.parquet", tb)
    with pytest.raises(DataFileError, match="column 'dense'"):
        _load_all(path)
    # the same values as a list column of exactly D per row are fine
    even = pa.ListArray.from_arrays(pa.array(np.arange(0, 19, 3, dtype=np.int32)),
                                    pa.array(np.arange(18, dtype=np.float32)))
    np.testing.assert_array_equal(table_to_columns(_table(dense=even), META).dense, np.arange(18).reshape(6, 3))


@pytest.mark.parametrize("label,expect", [
    (pa.array(np.array([0, 1, 2, 0, 0, 0], np.int8)), r"column 'label': row 2 holds 2"),
    (pa.array(np.array([0, 1, -1, 0, 0, 0], np.int8)), r"column 'label': row 2 holds -1"),
    (pa.array(np.array([0, 1, 0, np.nan, 0, 0], np.float32)), r"column 'label': row 3 holds nan"),
    (pa.array([0, 1, None, 0, 0, 0], pa.int8()), r"column 'label': 1 null value\(s\), the first in row 2"),
])
def test_bad_labels_are_refused(tmp_path, label, expect):
    with pytest.raises(DataFileError, match=expect):
        table_to_columns(_table(label=label), META)
    with pytest.raises(DataFileError, match=expect):
        _load_all(_write(tmp_path, "l.parquet", _table(label=label)))


def test_soft_labels_in_range_pass():
    cols = table_to_columns(_table(label=pa.array(np.linspace(0, 1, N).astype(np.float32))), META)
    assert cols.label.max() == 1


@pytest.mark.parametrize("bad,expect", [(np.nan, "row 2 feature 1 is nan"), (np.inf, "row 2 feature 1 is inf"),
                                        (-np.inf, "row 2 feature 1 is -inf")])
def test_non_finite_dense_values_are_refused(bad, expect):
    v = np.ones(N * D, np.float32)
    v[2 * D + 1] = bad
    with pytest.raises(DataFileError, match=f"column 'dense': {expect}"):
        table_to_columns(_table(dense=_dense(v)), META)


def test_huge_finite_dense_values_pass():
    """The sum of finite values may overflow to inf: that alone is no error."""
    cols = table_to_columns(_table(dense=_dense(np.full(N * D, 3e38, np.float32))), META)
    assert np.isfinite(cols.dense).all()


def test_nulls_in_a_sparse_column_and_inside_lists_are_named():
    with pytest.raises(DataFileError, match=r"column 'cat_1': 1 null value\(s\), the first in row 3"):
        table_to_columns(_table(cats=[pa.array(np.arange(N)), pa.array([0, 1, 2, None, 4, 5], pa.int64())]), META)
    inner = pa.FixedSizeListArray.from_arrays(pa.array([1.0] * 7 + [None] + [1.0] * 10, pa.float32()), D)
    with pytest.raises(DataFileError, match=r"column 'dense': 1 null value\(s\) inside its lists"):
        table_to_columns(_table(dense=inner), META)


def test_missing_column_and_wrong_width_name_the_file_and_column(tmp_path):
    missing = _write(tmp_path, "missing.parquet", _table(drop="cat_1"))
    with pytest.raises(DataFileError, match=r"missing.parquet: column 'cat_1' is missing"):
        ParquetLoader(missing)
    wide = _write(tmp_path, "wide.parquet", _table(dense=_dense(np.ones(N * 4), width=4)))
    with pytest.raises(DataFileError, match=r"wide.parquet: column 'dense' holds 4 values per row.*num_dense = 3"):
        ParquetLoader(wide)
    with pytest.raises(DataFileError, match=r"wide.parquet"):
        read_meta(pq.read_schema(wide), wide)


def test_files_of_one_split_must_share_their_layout(tmp_path):
    """Two files read as one split: a sparse column flat in one and in lists in the other (each
    file fine alone), another dense width, or other sparse columns, are named with both files
    when the loader is built (before, a flat / list mix failed mid-epoch in the reader)."""
    def pair(name, second):
        d = tmp_path / name
        d.mkdir()
        _write(d, "part-00000.parquet", _table())
        _write(d, "part-00001.parquet", second)
        return str(d)

    pairs = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * N, dtype=np.int64)), 2)
    lists = pa.array([[i] for i in range(N)], pa.list_(pa.int64()))
    other_meta = DatasetMeta(num_dense=D, sparse_names=["cat_0", "cat_9"], source="test")
    renamed = pa.table({"label": pa.array(np.zeros(N, np.int8)), "dense": _dense(),
                        "cat_0": pa.array(np.arange(N, dtype=np.int64)), "cat_9": pa.array(np.arange(N, dtype=np.int64))}
                       ).replace_schema_metadata({META_KEY: other_meta.to_json().encode()})
    for name, second, expect in (
            ("fixed", _table(cats=[pa.array(np.arange(N, dtype=np.int64)), pairs]),
             r"part-00001.parquet: column 'cat_1' holds fixed-size lists of 2, not one value per row, unlike "
             r".*part-00000.parquet"),
            ("lists", _table(cats=[lists, pa.array(np.arange(N, dtype=np.int64))]),
             r"column 'cat_0' holds variable-size lists, not one value per row"),
            ("renamed", renamed, r"part-00001.parquet: sparse column 1 is 'cat_9', not 'cat_1'")):
        with pytest.raises(DataFileError, match=expect):
            ParquetLoader(pair(name, second))
    assert len(_load_all(pair("same", _table()))) == N       # the same layout twice: read as one


def _truncated(tmp_path):
    data = open(_write(tmp_path, "whole.parquet", _table()), "rb").read()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    return str(tmp_path / "truncated.parquet")


@pytest.mark.parametrize("make,expect", [
    (lambda p: (p / "empty.parquet").write_bytes(b"") and None or str(p / "empty.parquet"), "0 bytes"),
    (lambda p: (p / "text.parquet").write_text("not parquet, just some text\n") and str(p / "text.parquet"),
     "not a Parquet file"),
    (_truncated, "cut short"),
])
def test_files_that_are_not_parquet_are_named(tmp_path, make, expect, capsys):
    path = make(tmp_path)
    with pytest.raises(DataFileError, match=expect) as info:
        ParquetLoader(path)
    assert path in str(info.value)
    with pytest.raises(DataFileError, match=expect):
        list_parquet_files([path])
    assert main(["inspect", path, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path in err and err.startswith("neo-data inspect: error:")


def test_inspect_of_bad_values_is_a_one_line_error(tmp_path, capsys):
    path = _write(tmp_path, "l.parquet", _table(label=pa.array(np.full(N, 3, np.int8))))
    assert main(["inspect", path, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "column 'label'" in err
