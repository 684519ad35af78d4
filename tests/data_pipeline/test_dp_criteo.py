"""Criteo preprocessing: the real sample end to end, malformed-line policies, splits, folding, vocabulary."""

from __future__ import annotations

import gzip
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dp_helpers import py_parse
from data_pipeline.criteo import CriteoOptions, count_lines, preprocess_criteo
from data_pipeline.criteo_parse import MalformedLineError, parse_hex_column, parse_int_column
from data_pipeline.writer import WriterOptions


def read_rows(directory: str):
    t = pq.read_table(directory)
    n = t.num_rows
    label = t.column("label").to_numpy()
    dense = t.column("dense").combine_chunks().flatten().to_numpy().reshape(n, 13)
    cats = np.stack([t.column(f"cat_{i}").to_numpy() for i in range(26)], 1)
    return label, dense, cats


def expected(lines):
    parsed = [py_parse(ln) for ln in lines]
    return (np.array([p[0] for p in parsed]), np.array([p[1] for p in parsed], np.float32),
            np.array([p[2] for p in parsed], np.int64))


@pytest.mark.parametrize("workers,block_bytes,executor", [(1, 8 << 20, "thread"), (1, 3000, "thread"),
                                                         (2, 5000, "thread"), (2, 5000, "process")])
def test_sample_end_to_end(tmp_path, criteo_sample, sample_lines, workers, block_bytes, executor):
    s = preprocess_criteo(CriteoOptions(inputs=[criteo_sample], output=str(tmp_path), workers=workers,
                                        block_bytes=block_bytes, executor=executor,
                                        writer=WriterOptions(rows_per_file=64, row_group_rows=16)),
                          log=lambda m: None)
    assert s["lines_read"] == 200 and s["rows_written"] == 200 and sum(s["dropped"].values()) == 0
    files = sorted(os.listdir(tmp_path / "train"))
    assert files == [f"part-{i:05d}.parquet" for i in range(4)]  # 64 + 64 + 64 + 8 rows
    label, dense, cats = read_rows(str(tmp_path / "train"))
    el, ed, ec = expected(sample_lines)
    assert label.sum() == 49  # the README's count of positives
    np.testing.assert_array_equal(label, el)
    np.testing.assert_allclose(dense, ed, rtol=1e-6)
    np.testing.assert_array_equal(cats, ec)
    # specific values of the first row: "0 \t\t 3 \t 260 \t\t 17668 ..." and C1 = 05db9164
    assert dense[0, 0] == 0.0 and dense[0, 1] == pytest.approx(math.log(4)) and dense[0, 2] == pytest.approx(math.log(261))
    assert cats[0, 0] == 0x05DB9164 and cats[0, 1] == 0x08D6D899
    # negative integers occur (row 2 has I2 = -1) and become log(0 + 1) = 0
    assert sample_lines[1].split(b"\t")[2] == b"-1" and dense[1, 1] == 0.0
    # missing values: counted, and written as 0
    raw = [ln.split(b"\t") for ln in sample_lines]
    miss_dense = [sum(1 for r in raw if r[1 + j] == b"") for j in range(13)]
    miss_cat = [sum(1 for r in raw if r[14 + j] == b"") for j in range(26)]
    assert s["missing_values"]["dense"] == miss_dense and s["missing_values"]["categorical"] == miss_cat
    assert sum(miss_cat) > 0 and all(cats[i, j] == 0 for i, r in enumerate(raw) for j in range(26) if r[14 + j] == b"")
    meta = pq.read_schema(str(tmp_path / "train" / files[0])).metadata[b"neo.data"]
    assert b'"source": "criteo"' in meta


def test_column_parsers_match_python():
    rng = np.random.default_rng(1)
    hexes = ["", "0", "ff", "FFFFFFFF", "05db9164", "abc", "12345678", "xyz", "123456789", "-1", "0x12", "aBcD"]
    hexes += ["%08x" % v for v in rng.integers(0, 2**32, 50)]
    ids, bad, missing = parse_hex_column(pa.array(hexes))
    for s, i, b, m in zip(hexes, ids, bad, missing):
        ok = 1 <= len(s) <= 8 and all(c in "0123456789abcdefABCDEF" for c in s)
        assert b == (not ok and s != ""), s
        assert m == (s == "")
        if ok:
            assert i == int(s, 16), s
    ints = ["", "0", "-1", "17668", "-", "1.5", "12a", "999999999999999999", "-999999999999999999",
            "1234567890123456789", " 5", "+5", "007"] + [str(v) for v in rng.integers(-10**9, 10**9, 50)]
    vals, bad, missing = parse_int_column(pa.array(ints))
    for s, v, b in zip(ints, vals, bad):
        body = s[1:] if s.startswith("-") else s
        ok = body.isdigit() and len(body) <= 18 and body.isascii()
        assert b == (not ok and s != ""), s
        if ok:
            assert v == int(s), s


def _broken_file(tmp_path, sample_lines, gz=False):
    good = sample_lines[:6]
    bad_hex = good[2].split(b"\t")
    bad_hex[14 + 3] = b"05db916g"
    long_hex = good[2].split(b"\t")
    long_hex[14 + 5] = b"123456789"
    bad_int = good[3].split(b"\t")
    bad_int[1 + 4] = b"1.5"
    bad_label = good[4].split(b"\t")
    bad_label[0] = b"2"
    lines = [good[0], good[1], b"1\t2\t3", b"\t".join(bad_hex), b"", b"\t".join(bad_int), good[2],
             b"\t".join(bad_label), good[3] + b"\textra", b"\t".join(long_hex), good[4], good[5]]
    data = b"\n".join(lines)  # no newline at the end: the last line still counts
    path = tmp_path / ("broken.tsv.gz" if gz else "broken.tsv")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    good_lines = [good[0], good[1], good[2], good[4], good[5]]
    return str(path), good_lines


@pytest.mark.parametrize("gz", [False, True])
def test_malformed_skip_accounting(tmp_path, sample_lines, gz):
    path, good_lines = _broken_file(tmp_path, sample_lines, gz)
    assert count_lines(path) == 12
    msgs = []
    s = preprocess_criteo(CriteoOptions(inputs=[path], output=str(tmp_path / "out"), workers=1, block_bytes=700),
                          log=msgs.append)
    assert s["lines_read"] == 12
    assert s["dropped"] == {"column_count": 3, "bad_label": 1, "bad_dense": 1, "bad_category": 2}
    assert s["rows_written"] == 5
    assert s["lines_read"] == s["rows_written"] + sum(s["dropped"].values())
    by_line = {e["line"]: e["reason"] for e in s["examples"]}
    assert by_line == {3: "column_count", 4: "bad_category", 5: "column_count", 6: "bad_dense",
                       8: "bad_label", 9: "column_count", 10: "bad_category"}
    assert any("C4" in e["detail"] and "05db916g" in e["detail"] for e in s["examples"])
    assert len(msgs) == 7
    label, dense, cats = read_rows(str(tmp_path / "out" / "train"))
    el, ed, ec = expected(good_lines)
    np.testing.assert_array_equal(label, el)
    np.testing.assert_array_equal(cats, ec)


@pytest.mark.parametrize("workers,executor", [(1, "thread"), (2, "thread"), (2, "process")])
def test_malformed_error_policy(tmp_path, sample_lines, workers, executor):
    path, _ = _broken_file(tmp_path, sample_lines)
    with pytest.raises(MalformedLineError) as ei:
        preprocess_criteo(CriteoOptions(inputs=[path], output=str(tmp_path / "o"), policy="error",
                                        workers=workers, executor=executor), log=lambda m: None)
    e = ei.value
    assert (e.path, e.line, e.reason) == (path, 3, "column_count")
    assert f"{path}:3: column_count" in str(e)
    # the first bad line later in the file, with blocks cut differently
    fields = sample_lines[50].split(b"\t")
    fields[1] = b"1.5"
    lines = sample_lines[:50] + [b"\t".join(fields)] + sample_lines[51:60]
    p2 = tmp_path / "b2.tsv"
    p2.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(MalformedLineError, match=r"b2.tsv:51: bad_dense: field I1 = '1.5'"):
        preprocess_criteo(CriteoOptions(inputs=[str(p2)], output=str(tmp_path / "o2"), policy="error",
                                        block_bytes=2000, workers=1), log=lambda m: None)


def test_mlperf_split_fold_and_vocab(tmp_path, sample_lines):
    days = []
    for d, (a, b) in enumerate([(0, 80), (80, 160), (160, 199)]):  # last day: 39 lines
        p = tmp_path / f"day_{d}"
        p.write_bytes(b"\n".join(sample_lines[a:b]) + b"\n")
        days.append(str(p))
    s = preprocess_criteo(CriteoOptions(inputs=days, output=str(tmp_path / "o"), split="mlperf",
                                        max_ids=[1000] * 26, vocab_min_count=2, workers=1, block_bytes=1500),
                          log=lambda m: None)
    assert {k: v["rows_written"] for k, v in s["splits"].items()} == {"train": 160, "validation": 20, "test": 19}
    raw = expected(sample_lines[:199])[2] % 1000  # (199, 26) folded raw ids
    train_raw = raw[:160]
    for split, rows in (("train", slice(0, 160)), ("validation", slice(160, 180)), ("test", slice(180, 199))):
        _, _, cats = read_rows(str(tmp_path / "o" / split))
        for t in (0, 2, 25):
            vals, counts = np.unique(train_raw[:, t], return_counts=True)
            vocab = sorted(int(v) for v, c in zip(vals, counts) if c >= 2 and v != 0)
            index = {v: i + 2 for i, v in enumerate(vocab)}
            want = [0 if v == 0 else index.get(int(v), 1) for v in raw[rows, t]]
            assert cats[:, t].tolist() == want, (split, t)
    assert s["vocab"]["sizes"][0] == 2 + len([1 for v, c in zip(*np.unique(train_raw[:, 0], return_counts=True))
                                              if c >= 2 and v != 0])
