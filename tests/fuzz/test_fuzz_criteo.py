"""Bad Criteo lines, fuzzed, through the TSV parser of ``neo-data criteo-preprocess`` (issue 17, item 5).

Blocks of good lines with a few mutated ones (wrong field counts, non-hex categoricals, empty
fields, numbers of 19+ digits, stray signs, unicode, tabs, ``\\r``, NUL, quotes, a BOM), CRLF or
LF endings, with or without a last newline. They are checked against a plain-Python oracle of
the documented rules (``data_pipeline/criteo_parse.py``): under policy ``skip`` every line is
kept or counted once under its reason (rows kept + rows skipped == lines read) and the kept
rows are the oracle's; under policy ``error`` the first bad line raises
:class:`MalformedLineError` naming the file, its line number, the reason and the field.
"""

from __future__ import annotations

import gzip
import io
import re
from typing import List, Optional, Tuple

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from data_pipeline.criteo import CorruptInputError, CriteoOptions, preprocess_criteo
from data_pipeline.criteo_parse import COLUMN_NAMES, REASONS, MalformedLineError, parse_block
from data_pipeline.writer import WriterOptions

BOM = b"\xef\xbb\xbf"
_DENSE = re.compile(rb"-?[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,8}")


# ----------------------------------------------------------------------------- the oracle
def oracle_lines(data: bytes, first_line: int) -> List[bytes]:
    """The lines of a block by the documented rules: ``\\n`` ends a line, ``\\r\\n`` too, a BOM
    starting line 1 of a file is skipped; a last line without ``\\n`` counts."""
    if first_line == 1 and data.startswith(BOM):
        data = data[len(BOM):]
    data = data.replace(b"\r\n", b"\n")
    lines = data.split(b"\n")
    return lines[:-1] if data.endswith(b"\n") or not data else lines


def oracle_line(line: bytes) -> Tuple[str, Optional[str], Optional[tuple]]:
    """(reason or "ok", the field at fault, (label, dense, ids) of a good line)."""
    f = line.split(b"\t")
    if len(f) != 40:
        return "column_count", None, None
    if f[0] not in (b"0", b"1"):
        return "bad_label", "label", None
    for j in range(13):
        if f[1 + j] and not _DENSE.fullmatch(f[1 + j]):
            return "bad_dense", COLUMN_NAMES[1 + j], None
    for j in range(26):
        if f[14 + j] and not _HEX.fullmatch(f[14 + j]):
            return "bad_category", COLUMN_NAMES[14 + j], None
    dense = [np.float32(np.log1p(np.float64(max(int(x), 0)))) if x else np.float32(0) for x in f[1:14]]
    ids = [int(x, 16) if x else 0 for x in f[14:]]
    return "ok", None, (int(f[0]), dense, ids)


def oracle(data: bytes, first_line: int):
    """(lines, [(line number, reason, field)] of the bad ones, good rows)."""
    bad, good = [], []
    lines = oracle_lines(data, first_line)
    for k, line in enumerate(lines):
        reason, field, row = oracle_line(line)
        if reason == "ok":
            good.append(row)
        else:
            bad.append((first_line + k, reason, field))
    return len(lines), bad, good


# ----------------------------------------------------------------------------- strategies
digits = st.text("0123456789", min_size=1, max_size=18)
dense_ok = st.one_of(st.just(""), digits, digits.map(lambda s: "-" + s))
hex_ok = st.one_of(st.just(""), st.text("0123456789abcdefABCDEF", min_size=1, max_size=8))
JUNK = ["-", "--1", "+5", " 5", "5 ", "1.5", "1e3", "0x1f", "9" * 19, "-" + "9" * 19, "9" * 40, "123456789",
        "abcdefg", "ABCDEFGH0", "é", "\u2603", "\u0663", "\t", "\t\t", "\n", "\r", "\r\n", "\x00", '"', '"a\tb"',
        "\\t", "２", "", "NaN", "-0", "00000000", "ffffffff"]
junk = st.one_of(st.sampled_from(JUNK), st.text(max_size=10),
                 st.binary(max_size=10).map(lambda b: b.decode("latin-1")))


@st.composite
def good_fields(draw) -> List[str]:
    return ([draw(st.sampled_from("01"))] + [draw(dense_ok) for _ in range(13)]
            + [draw(hex_ok) for _ in range(26)])


@st.composite
def a_line(draw) -> bytes:
    f = draw(good_fields())
    kind = draw(st.sampled_from(["good", "good", "field", "field", "count", "random", "empty"]))
    if kind == "field":
        for _ in range(draw(st.integers(1, 3))):
            f[draw(st.integers(0, 39))] = draw(junk)
    elif kind == "count":                               # 0 to 45 fields
        n = draw(st.integers(0, 45))
        f = (f + [draw(hex_ok) for _ in range(max(0, n - 40))])[:n]
    elif kind == "random":
        return draw(st.binary(max_size=80))
    elif kind == "empty":
        return draw(st.sampled_from([b"", b"\r", b" ", b"\t" * 39, b"\t" * 40]))
    enc = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "latin-1"]))
    return "\t".join(f).encode(enc, errors="replace")


@st.composite
def blocks(draw, max_lines: int = 12) -> Tuple[bytes, int]:
    lines = draw(st.lists(a_line(), min_size=0, max_size=max_lines))
    ends = [draw(st.sampled_from([b"\n", b"\n", b"\r\n"])) for _ in lines]
    data = b"".join(ln + e for ln, e in zip(lines, ends))
    if lines and draw(st.booleans()):
        data = data[: -len(ends[-1])]                   # no newline after the last line
    if draw(st.integers(0, 9)) == 0:
        data = BOM + data
    first_line = draw(st.sampled_from([1, 1, 2, 1001]))
    return data, first_line


GOOD = "\t".join(["1"] + ["5"] * 13 + ["0000abcd"] * 26).encode()
EXAMPLES = [
    (GOOD[:30] + b"\r" + GOOD[30:] + b"\n" + GOOD + b"\n", 1),       # a lone \r: Arrow ended a row there
    (GOOD + b"\r" + GOOD + b"\n", 1),                                 # two rows kept from one line
    (b"\r\n\r\n" + GOOD[:-1] + b"g\n", 1),                            # the bad line is line 3
    (b"\r", 1),                                                       # an empty line to Arrow, unreported
    (b"", 1),                                                         # Arrow: "Empty CSV file"
    (BOM + GOOD + b"\n", 7),                                          # a BOM inside a file is a byte
    (BOM + GOOD + b"\n", 1),
    (GOOD + b"\n\x80\n" + GOOD[:-3] + b"\n", 1),                       # pyarrow: UnicodeDecodeError in the handler
]


# ----------------------------------------------------------------------------- the properties
def _check_skip(blk, data: bytes, first_line: int, max_examples: int) -> None:
    n, bad, good = oracle(data, first_line)
    assert blk.lines == n
    assert all(c >= 0 for c in blk.dropped.values()), blk.dropped
    assert len(blk.label) + sum(blk.dropped.values()) == blk.lines, "rows kept + rows skipped != lines read"
    assert blk.dropped == {r: sum(1 for _, why, _ in bad if why == r) for r in REASONS}
    assert [(e.line, e.reason) for e in blk.examples] == [(ln, why) for ln, why, _ in bad[:max_examples]]
    for e, (_, _, fld) in zip(blk.examples, bad):
        assert fld is None or f"field {fld} = " in e.detail, e.detail
    assert blk.label.tolist() == [g[0] for g in good]
    np.testing.assert_array_equal(blk.dense, np.array([g[1] for g in good], np.float32).reshape(-1, 13))
    np.testing.assert_array_equal(blk.cats, np.array([g[2] for g in good], np.int64).reshape(-1, 26).T)
    assert blk.dense.shape == (len(good), 13) and blk.cats.shape == (26, len(good))


@given(blocks(), st.integers(1, 6))
@example(EXAMPLES[0], 5)
@example(EXAMPLES[1], 5)
@example(EXAMPLES[2], 5)
@example(EXAMPLES[3], 5)
@example(EXAMPLES[4], 5)
@example(EXAMPLES[5], 5)
@example(EXAMPLES[6], 5)
@example(EXAMPLES[7], 5)
def test_skip_policy_counts_every_line_once(block, max_examples):
    data, first_line = block
    blk = parse_block(data, first_line, "day_0", "skip", max_examples)
    _check_skip(blk, data, first_line, max_examples)


@given(blocks())
@example(EXAMPLES[0])
@example(EXAMPLES[1])
@example(EXAMPLES[2])
@example(EXAMPLES[3])
@example(EXAMPLES[5])
@example(EXAMPLES[7])
def test_error_policy_names_the_first_bad_line_and_field(block):
    data, first_line = block
    _, bad, _ = oracle(data, first_line)
    if not bad:
        _check_skip(parse_block(data, first_line, "day_0", "error"), data, first_line, 5)
        return
    line, reason, fld = bad[0]
    with pytest.raises(MalformedLineError) as info:
        parse_block(data, first_line, "day_0", "error")
    e = info.value
    assert (e.path, e.line, e.reason) == ("day_0", line, reason)
    assert str(e).startswith(f"day_0:{line}: {reason}: ")
    assert fld is None or f"field {fld} = " in e.detail, e.detail


@settings(max_examples=max(8, settings.default.max_examples // 4))
@given(st.lists(blocks(max_lines=8), min_size=1, max_size=3), st.integers(40, 700), st.booleans(),
       st.sampled_from(["skip", "error"]))
@example(files=[(b"\x1f\x8b\n", 1)], block_bytes=40, gz=False, policy="skip")   # plain, but starts as gzip
@example(files=[(GOOD[:-1] + b"g\n", 1), (b"\x1f\x8b\n", 1)], block_bytes=40, gz=False, policy="error")
def test_preprocess_reconciles_over_files_and_blocks(tmp_path_factory, files, block_bytes, gz, policy):
    """``preprocess_criteo`` (what ``neo-data criteo-preprocess`` runs) over files cut into blocks."""
    tmp = tmp_path_factory.mktemp("criteo")
    inputs, expect_lines, expect_bad, expect_good = [], 0, [], []
    for k, (data, _) in enumerate(files):
        path = tmp / (f"day_{k}.gz" if gz else f"day_{k}")
        path.write_bytes(gzip.compress(data) if gz else data)
        inputs.append(str(path))
        n, bad, good = oracle(data, 1)
        expect_lines += n
        expect_bad += [(str(path), ln, why) for ln, why, _ in bad]
        expect_good += good
    opts = CriteoOptions(inputs=inputs, output=str(tmp / "out"), policy=policy, workers=1, block_bytes=block_bytes,
                         writer=WriterOptions(rows_per_file=1000, row_group_rows=1000))
    # a file is read as gzip by its first bytes, whatever its name: one that starts as gzip and is not
    # stops the run naming it (unless a bad line of an earlier file stopped it first)
    sniffed = [p for (data, _), p in zip(files, inputs) if not gz and data.startswith(b"\x1f\x8b")]
    if sniffed and not (policy == "error" and expect_bad and inputs.index(expect_bad[0][0]) < inputs.index(sniffed[0])):
        with pytest.raises(CorruptInputError, match=re.escape(sniffed[0])):
            preprocess_criteo(opts, log=lambda m: None)
        return
    if policy == "error" and expect_bad:
        with pytest.raises(MalformedLineError) as info:
            preprocess_criteo(opts, log=lambda m: None)
        assert (info.value.path, info.value.line, info.value.reason) == expect_bad[0]
        return
    s = preprocess_criteo(opts, log=lambda m: None)
    assert s["lines_read"] == expect_lines
    assert s["rows_written"] + sum(s["dropped"].values()) == s["lines_read"]
    assert s["dropped"] == {r: sum(1 for _, _, why in expect_bad if why == r) for r in REASONS}
    t = pq.read_table(str(tmp / "out" / "train"))
    assert t.column("label").to_pylist() == [g[0] for g in expect_good]
    cats = np.stack([t.column(f"cat_{i}").to_numpy() for i in range(26)], 1) if t.num_rows else np.zeros((0, 26))
    np.testing.assert_array_equal(cats.reshape(-1, 26), np.array([g[2] for g in expect_good]).reshape(-1, 26))


def test_cli_reports_a_malformed_line_and_exits_2(tmp_path):
    from data_pipeline.cli import main

    path = tmp_path / "day_0"
    path.write_bytes(GOOD + b"\n" + GOOD.replace(b"\t5\t", b"\t5x\t", 1) + b"\n")
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        rc = main(["criteo-preprocess", str(path), "-o", str(tmp_path / "out"), "--policy", "error",
                   "--workers", "1", "--no-progress"])
    assert rc == 2
    assert f"{path}:2: bad_dense: field I1 = '5x'" in err.getvalue()
