"""Writer commands and bad outputs: a rerun never mixes runs, a failed run leaves nothing, bad
inputs and options are one-line errors (exit status 2)."""

from __future__ import annotations

import gzip
import json
import os

import pyarrow.parquet as pq
import pytest

from data_pipeline.cli import main
from data_pipeline.criteo import CriteoOptions, preprocess_criteo
from data_pipeline.synthetic import SynthOptions, generate
from data_pipeline.writer import OutputExistsError, WriterOptions


def _lines(sample_lines, k):
    return b"\n".join(sample_lines[:k]) + b"\n"


def _rows(directory) -> int:
    """Rows of every Parquet file in ``directory``, as the loader would list them (all ``*.parquet``)."""
    return sum(pq.ParquetFile(os.path.join(directory, f)).metadata.num_rows
               for f in os.listdir(directory) if f.endswith(".parquet"))


def _criteo(*args):
    return main(["criteo-preprocess", *map(str, args), "--no-progress", "--workers", "1"])


def test_rerun_into_old_output_is_refused_then_overwrite_replaces_it(tmp_path, sample_lines, capsys):
    big, small, out = tmp_path / "big.tsv", tmp_path / "small.tsv", tmp_path / "out"
    big.write_bytes(_lines(sample_lines, 200))
    small.write_bytes(_lines(sample_lines, 50))
    assert _criteo(big, "-o", out, "--rows-per-file", "50", "--summary", tmp_path / "s1.json") == 0
    assert _rows(out / "train") == 200 and len(os.listdir(out / "train")) == 4
    capsys.readouterr()

    assert _criteo(small, "-o", out, "--rows-per-file", "50") == 2
    err = capsys.readouterr().err
    assert str(out / "train") in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert _rows(out / "train") == 200                       # the earlier run untouched

    assert _criteo(small, "-o", out, "--rows-per-file", "50", "--overwrite", "--summary", tmp_path / "s2.json") == 0
    assert sorted(os.listdir(out / "train")) == ["part-00000.parquet"] and _rows(out / "train") == 50
    assert json.loads((out / "summary.json").read_text())["rows_written"] == 50


def test_overwrite_removes_splits_and_vocabulary_the_new_run_does_not_write(tmp_path, sample_lines):
    day = tmp_path / "day.tsv"
    day.write_bytes(_lines(sample_lines, 200))
    last = tmp_path / "last.tsv"                                   # another day file (one file twice is refused)
    last.write_bytes(_lines(sample_lines, 200))
    out = tmp_path / "out"
    assert _criteo(day, last, "-o", out, "--split", "mlperf", "--vocab-min-count", "2", "--summary", tmp_path / "a") == 0
    assert {"train", "validation", "test", "vocab"} <= set(os.listdir(out))
    assert _criteo(day, "-o", out, "--overwrite", "--summary", tmp_path / "b") == 0
    assert sorted(os.listdir(out)) == ["summary.json", "train"] and _rows(out / "train") == 200


def test_synth_and_multihot_refuse_an_old_output(tmp_path):
    o = SynthOptions(num_samples=300, output=str(tmp_path / "syn"), table_rows=[10, 20], auc_samples=100, workers=1)
    generate(o)
    with pytest.raises(OutputExistsError, match="syn.train.*--overwrite"):
        generate(SynthOptions(num_samples=100, output=o.output, table_rows=[10, 20], auc_samples=100, workers=1))
    assert _rows(tmp_path / "syn" / "train") == 300
    generate(SynthOptions(num_samples=100, output=o.output, table_rows=[10, 20], auc_samples=100, workers=1,
                          writer=WriterOptions(overwrite=True)))
    assert _rows(tmp_path / "syn" / "train") == 100

    mh = ["multihot", "-i", str(tmp_path / "syn" / "train"), "-o", str(tmp_path / "mh"), "--sizes", "2,3",
          "--table-sizes", "10,20", "--no-progress", "--summary", str(tmp_path / "m.json")]
    assert main(mh) == 0 and main(mh) == 2
    assert main(mh + ["--overwrite"]) == 0 and _rows(tmp_path / "mh") == 100


def test_a_foreign_parquet_file_is_never_deleted(tmp_path):
    split = tmp_path / "out" / "train"
    split.mkdir(parents=True)
    (split / "mine.parquet").write_bytes(b"not ours")
    with pytest.raises(OutputExistsError, match="not written by neo-data"):
        generate(SynthOptions(num_samples=10, output=str(tmp_path / "out"), table_rows=[5], auc_samples=10,
                              workers=1, writer=WriterOptions(overwrite=True)))
    assert (split / "mine.parquet").read_bytes() == b"not ours"


def test_truncated_gzip_is_a_one_line_error_and_leaves_no_output(tmp_path, sample_lines, capsys):
    data = gzip.compress(_lines(sample_lines, 200))
    bad = tmp_path / "day.gz"
    bad.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    capsys.readouterr()
    assert _criteo(bad, "-o", out, "--rows-per-file", "20", "--block-mb", "0.001") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "after line" in err and "Traceback" not in err
    assert not out.exists()                                   # no partial data set, not even the folder


def test_error_policy_after_written_files_leaves_no_output(tmp_path, sample_lines):
    lines = list(sample_lines[:200])
    lines[150] = b"garbage"
    path = tmp_path / "day.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Exception, match="day.tsv:151"):
        preprocess_criteo(CriteoOptions(inputs=[str(path)], output=str(out), policy="error", workers=1,
                                        block_bytes=2000, writer=WriterOptions(rows_per_file=20, row_group_rows=10)),
                          log=lambda m: None)
    assert os.listdir(out) == []                              # staged files gone, the user's folder kept


def test_failed_overwrite_keeps_the_old_data_set_whole(tmp_path, sample_lines):
    good, bad = tmp_path / "good.tsv", tmp_path / "bad.gz"
    good.write_bytes(_lines(sample_lines, 200))
    z = gzip.compress(_lines(sample_lines, 200))
    bad.write_bytes(z[: len(z) // 2])
    out = tmp_path / "out"
    assert _criteo(good, "-o", out, "--rows-per-file", "50", "--summary", tmp_path / "s") == 0
    before = (out / "summary.json").read_text()
    assert _criteo(bad, "-o", out, "--overwrite", "--rows-per-file", "20", "--block-mb", "0.001") == 2
    assert _rows(out / "train") == 200 and (out / "summary.json").read_text() == before
    assert sorted(os.listdir(out)) == ["summary.json", "train"]


def test_a_directory_as_input_is_a_one_line_error(tmp_path, capsys):
    assert _criteo(tmp_path, "-o", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("neo-data criteo-preprocess: error:") and str(tmp_path) in err and "directory" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,option", [
    (["criteo-preprocess", "x.tsv", "-o", "o", "--rows-per-file", "0"], "--rows-per-file"),
    (["criteo-preprocess", "x.tsv", "-o", "o", "--row-group-rows", "0"], "--row-group-rows"),
    (["criteo-preprocess", "x.tsv", "-o", "o", "--max-ids", "abc"], "--max-ids"),
    (["criteo-preprocess", "x.tsv", "-o", "o", "--max-ids", "0"], "--max-ids"),
    (["criteo-preprocess", "x.tsv", "-o", "o", "--max-ids", "5,6"], "--max-ids"),
    (["criteo-preprocess", "x.tsv", "-o", "o", "--workers", "0"], "--workers"),
    (["synth", "-o", "o", "--samples", "5", "--rows", "0"], "--rows"),
    (["synth", "-o", "o", "--samples", "-1"], "--samples"),
    (["synth", "-o", "o", "--samples", "5", "--skew", "x"], "--skew"),
    (["multihot", "-i", "i", "-o", "o", "--sizes", "0"], "--sizes"),
])
def test_bad_option_values_name_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err


def test_synth_refuses_per_table_lists_that_do_not_fit_the_table_count(tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(["synth", "-o", str(out), "--samples", "50", "--tables", "3", "--rows", "5,6", "--no-progress"]) == 2
    assert "--rows has 2 values for 3 tables" in capsys.readouterr().err and not out.exists()
    assert main(["synth", "-o", str(out), "--samples", "50", "--rows", "5,6", "--ids-per-bag", "1,2,3",
                 "--no-progress"]) == 2
    assert "--ids-per-bag has 3 values for 2 tables" in capsys.readouterr().err
    assert main(["synth", "-o", str(out), "--samples", "50", "--rows", "5,6", "--no-progress"]) == 0
    assert len(pq.read_schema(str(out / "train" / "part-00000.parquet")).names) == 2 + 2


def test_examples_are_kept_per_reason_not_per_block(tmp_path, sample_lines):
    """Seven short lines first, then two bad labels, in one block: each reason gets its examples."""
    lines = list(sample_lines[:40])
    for i in range(7):
        lines[i] = b"short"
    for i in (30, 31):
        lines[i] = b"7" + lines[i][1:]
    path = tmp_path / "day.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    s = preprocess_criteo(CriteoOptions(inputs=[str(path)], output=str(tmp_path / "o"), workers=1),
                          log=lambda m: None)
    by_reason = {}
    for e in s["examples"]:
        by_reason.setdefault(e["reason"], []).append(e["line"])
    assert by_reason == {"column_count": [1, 2, 3, 4, 5], "bad_label": [31, 32]}
    assert s["dropped"]["column_count"] == 7 and s["dropped"]["bad_label"] == 2
