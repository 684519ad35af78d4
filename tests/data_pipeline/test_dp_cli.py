"""The ``neo-data`` command line."""

from __future__ import annotations

import json

import pytest

from dp_helpers import sample_path
from data_pipeline.cli import main


def test_missing_reference_data_is_named():
    with pytest.raises(FileNotFoundError, match="'no_such_file.tsv' is not in .*samples.*criteo_kaggle_sample.tsv"):
        sample_path("no_such_file.tsv")


def test_commands_end_to_end(tmp_path, criteo_sample, capsys):
    out = tmp_path / "criteo"
    last_day = tmp_path / "day_1"                       # the same rows as a second day file (a file twice is refused)
    last_day.write_bytes(open(criteo_sample, "rb").read())
    assert main(["criteo-preprocess", criteo_sample, str(last_day), "-o", str(out), "--split", "mlperf",
                 "--max-ids", "mlperf", "--workers", "1", "--summary", str(tmp_path / "c.json"), "--no-progress"]) == 0
    s = json.loads((tmp_path / "c.json").read_text())
    assert s["lines_read"] == 400 and {k: v["rows_written"] for k, v in s["splits"].items()} == \
        {"train": 200, "validation": 100, "test": 100}

    assert main(["inspect", str(out / "train"), "--summary", str(tmp_path / "i.json"), "--no-progress"]) == 0
    i = json.loads((tmp_path / "i.json").read_text())
    assert i["rows"] == 200 and i["statistics"]["label_mean"] == pytest.approx(49 / 200)
    assert i["meta"]["table_sizes"][0] == 40000000 and len(i["statistics"]["dense"]) == 13
    assert all(f["max_id"] < 40000000 for f in i["statistics"]["sparse"] if f["max_id"] is not None)
    assert i["statistics"]["sparse"][5]["max_id"] < 3  # table 5 of MLPerf has 3 rows

    sizes = ",".join(["2"] * 26)
    rows = ",".join(["100"] * 26)
    assert main(["multihot", "-i", str(out / "validation"), "-o", str(tmp_path / "mh"), "--sizes", sizes,
                 "--table-sizes", rows, "--summary", str(tmp_path / "m.json"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["rows"] == 100

    capsys.readouterr()
    assert main(["synth", "-o", str(tmp_path / "syn"), "--samples", "5000", "--tables", "3", "--dense", "2",
                 "--rows", "10,20,30", "--ids-per-bag", "1,2,3", "--workers", "1", "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows_written"] == 5000 and 0.5 < printed["best_auc"] < 1


def test_inspect_names_the_split_folders(tmp_path, capsys):
    """A dataset's top folder holds split folders, not files: the error says which to pass."""
    from data_pipeline.cli import main

    assert main(["synth", "-o", str(tmp_path / "ds"), "--samples", "500", "--tables", "2", "--rows", "10",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "no Parquet files" in err and "split folders" in err and str(tmp_path / "ds" / "train") in err
    assert main(["inspect", str(tmp_path / "nope.parquet")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_criteo_options_that_do_not_fit_are_one_line_with_status_2(tmp_path, criteo_sample, capsys):
    """An input given twice (its rows twice, or a training day in the validation split) and the
    MLPerf split over one file: refused before any work, as the other bad options are."""
    link = tmp_path / "same.txt"
    link.symlink_to(criteo_sample)                                  # the same file by another name
    for args, message in (([criteo_sample, criteo_sample], "is given twice"),
                          ([criteo_sample, str(link), "--split", "mlperf"], "is given twice"),
                          ([criteo_sample, "--split", "mlperf"],
                           "split 'mlperf' needs at least two day files (training days, then the last day); 1 given")):
        out = tmp_path / "out"
        assert main(["criteo-preprocess", *args, "-o", str(out), "--workers", "1", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("neo-data criteo-preprocess: error: ") and message in err and "Traceback" not in err, err
        assert not out.exists()


def test_summaries_are_strict_json_and_their_path_is_checked_first(tmp_path, capsys):
    """An empty data set's best AUC is not a number: null in summary.json, not the bare NaN
    (found by the audit of 2026-11-29); a --summary that cannot be written is refused before any
    data is (it failed after writing everything)."""
    out = tmp_path / "empty"
    assert main(["synth", "-o", str(out), "--samples", "0", "--tables", "2", "--rows", "10", "--no-progress",
                 "--summary", str(tmp_path / "s.json")]) == 0
    for path in (out / "summary.json", tmp_path / "s.json"):
        text = path.read_text()
        summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"{path}: {c} is not JSON"))
        assert summary["best_auc"] is None
    capsys.readouterr()
    assert main(["synth", "-o", str(tmp_path / "never"), "--samples", "100", "--tables", "2", "--rows", "10",
                 "--no-progress", "--summary", str(tmp_path)]) == 2
    assert "--summary" in capsys.readouterr().err and not (tmp_path / "never").exists()
