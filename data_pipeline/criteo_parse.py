"""Vectorized parsing of raw Criteo TSV blocks (pyarrow's C++ CSV reader + numpy; no per-line Python).

A raw line: ``label \\t I1..I13 \\t C1..C26`` (40 fields). Rules, checked in this order, the
first failing rule names the drop reason of a line:

* ``column_count``  the line does not have exactly 40 tab-separated fields (empty lines included);
* ``bad_label``     the label is not exactly ``0`` or ``1``;
* ``bad_dense``     a non-empty integer field is not ``-?[0-9]{1,18}``;
* ``bad_category``  a non-empty categorical field is not 1 to 8 hex digits (either case).

Good lines become: label int8; dense float32 ``log(max(x, 0) + 1)``, missing = 0; categorical
ids int64, the hex value of the field, missing = 0 (the torchrec / MLPerf convention).

Lines end at ``\n`` only (``\r\n`` is read as ``\n``; a UTF-8 byte-order mark starting line 1 of
a file is skipped). Any other ``\r`` is a byte of its field, which makes the field bad: Arrow's
reader would end a row there, so those bytes are hidden from it (and shown as they are in the
messages), and a block always parses into exactly its lines, whatever bytes it holds.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from .schema import CRITEO_NUM_DENSE, CRITEO_NUM_SPARSE

__all__ = ["REASONS", "COLUMN_NAMES", "MalformedLineError", "BadLine", "ParsedBlock", "parse_block",
           "parse_hex_column", "parse_int_column"]

REASONS = ("column_count", "bad_label", "bad_dense", "bad_category")
COLUMN_NAMES = (["label"] + [f"I{i}" for i in range(1, CRITEO_NUM_DENSE + 1)]
                + [f"C{i}" for i in range(1, CRITEO_NUM_SPARSE + 1)])
_NCOLS = len(COLUMN_NAMES)

# byte -> nibble value, 255 = not a hex digit
_HEX_LUT = np.full(256, 255, np.uint8)
for _c in b"0123456789":
    _HEX_LUT[_c] = _c - 48
for _c in b"abcdef":
    _HEX_LUT[_c] = _c - 87
    _HEX_LUT[_c - 32] = _c - 87


class MalformedLineError(ValueError):
    """A malformed input line under policy ``error``: names the file, the 1-based line and the reason."""

    def __init__(self, path: str, line: int, reason: str, detail: str) -> None:
        super().__init__(f"{path}:{line}: {reason}: {detail}")
        self.path, self.line, self.reason, self.detail = path, line, reason, detail

    def __reduce__(self):  # picklable across worker processes
        return (MalformedLineError, (self.path, self.line, self.reason, self.detail))


@dataclass
class BadLine:
    """One dropped line, for the log and the error policy."""

    line: int
    """1-based line number in its file."""
    reason: str
    """One of :data:`REASONS`."""
    detail: str
    """Which field and what was wrong, plus the start of the line."""


@dataclass
class ParsedBlock:
    """The good rows of one block and the accounting of the others."""

    lines: int
    """Lines in the block (every ``\\n``-terminated line, and a last unterminated one)."""
    label: np.ndarray  # (n,) int8
    dense: np.ndarray  # (n, 13) float32, transformed
    cats: np.ndarray  # (26, n) int64, feature-major
    dropped: Dict[str, int] = field(default_factory=dict)
    """Dropped lines per reason."""
    examples: List[BadLine] = field(default_factory=list)
    """The first few dropped lines (at most ``max_examples`` per block)."""
    dense_missing: Optional[np.ndarray] = None  # (13,) int64 count of missing values among good rows
    cats_missing: Optional[np.ndarray] = None  # (26,) int64


Fields = Tuple[np.ndarray, np.ndarray, np.ndarray]  # (starts (n,), ends (n,), data uint8): field i = data[starts[i]:ends[i]]


def arrow_fields(arr: pa.Array) -> Fields:
    """(starts, ends, data) of an Arrow string array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    bufs = arr.buffers()
    n = len(arr)
    offs = np.frombuffer(bufs[1], np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(1, np.uint8)
    return offs[:-1], offs[1:], data


def _gather_right_aligned(starts: np.ndarray, ends: np.ndarray, data: np.ndarray, width: int
                          ) -> Tuple[np.ndarray, np.ndarray]:
    """Bytes of every field right-aligned in a (n, width) matrix with left padding 0; and the pad mask."""
    pos = ends[:, None] - width + np.arange(width)  # (n, width) source byte index
    pad = pos < starts[:, None]  # (n, width) True where left of the field
    np.clip(pos, 0, len(data) - 1, out=pos)
    chars = data[pos]  # (n, width) uint8
    chars[pad] = 0
    return chars, pad


def _rows_any(mask: np.ndarray) -> np.ndarray:
    """(n,) any over the 8 columns of a (n, 8) bool matrix (one 64-bit compare per row)."""
    return np.ascontiguousarray(mask).view(np.uint64).reshape(-1) != 0


def parse_hex_fields(f: Fields) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids int64 (n,), bad bool (n,), missing bool (n,)) of hex fields; missing and bad -> 0."""
    starts, ends, data = f
    lens = ends - starts
    missing = lens == 0
    if not (lens & ~8).any():  # fast path (Criteo): every field is empty or 8 characters
        rows = np.flatnonzero(~missing)
        st = starts[rows]
        if len(rows) and ends[rows[-1]] - st[0] == 8 * len(rows):  # contiguous (Arrow buffers)
            chars = data[st[0]:st[0] + 8 * len(rows)].reshape(-1, 8)
        else:
            chars = data[st[:, None] + np.arange(8)]  # (m, 8)
        nib = _HEX_LUT[chars]  # (m, 8), 255 for non-hex
        bad_m = _rows_any(nib == 255)
        packed = (nib[:, 0::2] << 4) | nib[:, 1::2]  # (m, 4) bytes, big-endian
        ids = np.zeros(len(lens), np.int64)
        ids[rows] = np.where(bad_m, 0, packed.view(">u4").reshape(-1))
        bad = np.zeros(len(lens), bool)
        bad[rows] = bad_m
        return ids, bad, missing
    chars, pad = _gather_right_aligned(starts, ends, data, 8)
    nib = _HEX_LUT[chars]  # (n, 8), 255 for non-hex
    nib[pad] = 0
    bad = _rows_any(nib == 255) | (lens > 8)
    nib[bad] = 0
    packed = (nib[:, 0::2] << 4) | nib[:, 1::2]  # (n, 4) bytes, big-endian
    ids = np.ascontiguousarray(packed).view(">u4").reshape(-1).astype(np.int64)
    return ids, bad, missing


_POW10 = 10 ** np.arange(18, -1, -1, dtype=np.int64)  # (19,) 10^18 .. 10^0
_POW10F = _POW10.astype(np.float64)


def parse_int_fields(f: Fields) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values int64 (n,), bad bool (n,), missing bool (n,)) of decimal integer fields ``-?[0-9]{1,18}``."""
    starts, ends, data = f
    lens = ends - starts
    width = int(min(max(int(lens.max(initial=0)), 1), 19))
    chars, pad = _gather_right_aligned(starts, ends, data, width)
    neg = (data[np.clip(starts, 0, len(data) - 1)] == 45) & (lens > 0)  # leading '-'
    rows = np.flatnonzero(neg)
    if len(rows):  # the sign position counts as a zero digit
        chars[rows, np.clip(width - lens[rows], 0, width - 1)] = 48
    chars[pad] = 48
    digits = chars - np.uint8(48)  # (n, width), wraps above 9 for non-digits
    bad = (digits > 9).any(axis=1) | (lens > 19) | (neg & (lens == 1)) | ((lens - neg) > 18)
    if bad.any():
        digits[bad] = 0
    if width <= 15:  # exact in float64 (< 2**53): a BLAS product
        vals = (digits.astype(np.float64) @ _POW10F[19 - width:]).astype(np.int64)
    else:
        vals = digits.astype(np.int64) @ _POW10[19 - width:]
    vals = np.where(neg, -vals, vals)
    return vals, bad, lens == 0


def parse_hex_column(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`parse_hex_fields` of an Arrow string array."""
    return parse_hex_fields(arrow_fields(arr))


def parse_int_column(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`parse_int_fields` of an Arrow string array."""
    return parse_int_fields(arrow_fields(arr))


def _line_starts(data: bytes) -> np.ndarray:
    """Offset of every line of a block (0, and one past each ``\n`` that is not the last byte)."""
    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    return np.concatenate([[0], nl[nl + 1 < len(data)] + 1])


def _line_numbers(data: bytes, first_line: int) -> np.ndarray:
    """1-based line numbers of the non-empty lines of a block (the rows pyarrow sees)."""
    buf = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [len(buf)]])
    nonempty = np.flatnonzero(ends > starts)
    return first_line + nonempty


_BOM = b"\xef\xbb\xbf"
_HIDDEN = 0x00  # stands for a lone \r (or a BOM's first byte) in what Arrow reads: bad in every field


def _arrow_safe(data: bytes, first_line: int) -> Tuple[bytes, bytes]:
    """(the block as parsed: CRLF as LF, a file's leading BOM dropped; the bytes Arrow reads).

    Arrow's CSV reader also ends rows at a lone ``\r`` and drops a BOM at the start of its
    input; the bytes it reads have those replaced by a byte that no field accepts, one for one,
    so rows stay lines and positions stay those of the first."""
    if first_line == 1 and data.startswith(_BOM):
        data = data[len(_BOM):]
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    if b"\r" not in data and not data.startswith(_BOM):
        return data, data
    hidden = bytearray(data.replace(b"\r", bytes([_HIDDEN])))
    if hidden.startswith(_BOM):
        hidden[0] = _HIDDEN
    return data, bytes(hidden)


def _field_text(data: bytes, line_starts: np.ndarray, k: int, col: int) -> str:
    """Field ``col`` of line ``k`` (0-based in the block) as it is in ``data``."""
    lo = int(line_starts[k])
    hi = data.find(b"\n", lo)
    fields = data[lo: hi if hi >= 0 else len(data)].split(b"\t")
    return fields[col].decode("utf-8", "replace") if col < len(fields) else ""


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _read_tsv(data: bytes, on_invalid) -> pa.Table:
    """Arrow's CSV reader on tab-separated lines, every field a string (no quoting, no escapes)."""
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=COLUMN_NAMES, use_threads=False,
                                       block_size=max(len(data) + 1, 1 << 20)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                         double_quote=False, newlines_in_values=False,
                                         ignore_empty_lines=True, invalid_row_handler=on_invalid),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in COLUMN_NAMES},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False,
                                             check_utf8=False),
    )


def _split_by_field_count(data: bytes, arrow_data: bytes) -> Tuple[List[Tuple[int, str]], bytes]:
    """(the non-empty lines without 40 fields as on_invalid lists them; the other lines, for Arrow).

    The slow path of a block with such a line that is not UTF-8 (``data`` and ``arrow_data``
    differ by single hidden bytes only, see :func:`_arrow_safe`)."""
    buf = np.frombuffer(arrow_data, np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [len(buf)]])
    nonempty = ends > starts
    st, en = starts[nonempty], ends[nonempty]
    tabs = np.concatenate([[0], np.cumsum(buf == 9)])
    ok = tabs[en] - tabs[st] == _NCOLS - 1
    invalid = [(int(k) + 1, data[st[k]:en[k]].decode("utf-8", "replace")) for k in np.flatnonzero(~ok)]
    kept = b"\n".join(arrow_data[a:b] for a, b in zip(st[ok], en[ok])) + b"\n"
    return invalid, kept


def parse_block(data: bytes, first_line: int, path: str, policy: str = "skip",
                max_examples: int = 5) -> ParsedBlock:
    """Parse a block of whole lines that starts at 1-based line ``first_line`` of ``path``.

    Raises :class:`MalformedLineError` at the first bad line when ``policy == "error"``.
    """
    if policy not in ("skip", "error"):
        raise ValueError(f"unknown malformed-line policy {policy!r} (skip or error)")
    data, arrow_data = _arrow_safe(data, first_line)
    nlines = data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
    if nlines == 0:
        return ParsedBlock(0, np.zeros(0, np.int8), np.zeros((0, CRITEO_NUM_DENSE), np.float32),
                           np.zeros((CRITEO_NUM_SPARSE, 0), np.int64), {r: 0 for r in REASONS}, [],
                           np.zeros(CRITEO_NUM_DENSE, np.int64), np.zeros(CRITEO_NUM_SPARSE, np.int64))
    invalid: List[Tuple[int, str]] = []  # (row number among non-empty lines, 1-based; text)
    # Arrow's C++ reader splits the fields; lines with another field count go to on_invalid
    def on_invalid(row: "pacsv.InvalidRow") -> str:
        invalid.append((row.number, row.text))
        return "skip"

    if arrow_data.isascii() or _is_utf8(arrow_data):
        table = _read_tsv(arrow_data, on_invalid)
    else:   # pyarrow decodes an invalid row's text as UTF-8 before it calls the handler, and fails
        # on other bytes: count the fields here instead, and give Arrow only the 40-field lines
        invalid, kept = _split_by_field_count(data, arrow_data)
        table = _read_tsv(kept, None)
    fields = [arrow_fields(table.column(j)) for j in range(_NCOLS)]
    n = len(fields[0][0])
    n_nonempty = n + len(invalid)
    n_empty = nlines - n_nonempty
    linenos: Optional[np.ndarray] = None

    def lines_of_rows() -> np.ndarray:  # (n,) line number of every parsed row (lazy: only for bad lines)
        nonlocal linenos
        if linenos is None:
            all_lines = _line_numbers(data, first_line)
            keep = np.ones(len(all_lines), bool)
            keep[[num - 1 for num, _ in invalid]] = False
            linenos = all_lines[keep]
        return linenos

    dropped = {r: 0 for r in REASONS}
    dropped["column_count"] = len(invalid) + n_empty
    examples: List[BadLine] = []
    if dropped["column_count"]:
        all_lines = _line_numbers(data, first_line)
        first_bad: List[BadLine] = []
        for num, text in invalid[:max_examples]:
            line = int(all_lines[num - 1])
            if arrow_data is not data:              # the line as it is, not as Arrow read it
                lo = _line_starts(data)[line - first_line]
                hi = data.find(b"\n", lo)
                text = data[lo: hi if hi >= 0 else len(data)].decode("utf-8", "replace")
            ncol = text.count("\t") + 1
            first_bad.append(BadLine(line, "column_count", f"{ncol} fields, expected {_NCOLS}: {text[:80]!r}"))
        if n_empty:
            buf = np.frombuffer(data, np.uint8)
            nl = np.flatnonzero(buf == 10)
            starts = np.concatenate([[0], nl + 1])[:nlines]
            ends = np.concatenate([nl, [len(buf)]])[:nlines]
            for e in np.flatnonzero(ends == starts)[:max_examples]:
                first_bad.append(BadLine(first_line + int(e), "column_count", f"empty line, expected {_NCOLS} fields"))
        first_bad.sort(key=lambda b: b.line)
        examples.extend(first_bad[:max_examples])

    # label
    lst, len_, ldata = fields[0]
    llen = len_ - lst
    lchar = ldata[np.clip(lst, 0, len(ldata) - 1)]
    bad_label = (llen != 1) | ((lchar != 48) & (lchar != 49))
    label = (lchar == 49).astype(np.int8)

    dense_raw = np.empty((n, CRITEO_NUM_DENSE), np.int64)
    bad_dense = np.zeros(n, bool)
    dense_missing = np.zeros(CRITEO_NUM_DENSE, np.int64)
    dense_missing_rows: List[np.ndarray] = []
    bad_dense_col = np.full(n, -1, np.int64)
    for j in range(CRITEO_NUM_DENSE):
        v, b, m = parse_int_fields(fields[1 + j])
        dense_raw[:, j] = v
        dense_missing_rows.append(m)
        if b.any():
            bad_dense_col[(bad_dense_col < 0) & b] = j
            bad_dense |= b
    cats = np.empty((CRITEO_NUM_SPARSE, n), np.int64)
    bad_cat = np.zeros(n, bool)
    cats_missing_rows: List[np.ndarray] = []
    bad_cat_col = np.full(n, -1, np.int64)
    for j in range(CRITEO_NUM_SPARSE):
        v, b, m = parse_hex_fields(fields[1 + CRITEO_NUM_DENSE + j])
        cats[j] = v
        cats_missing_rows.append(m)
        if b.any():
            bad_cat_col[(bad_cat_col < 0) & b] = j
            bad_cat |= b

    reason_of = np.zeros(n, np.int8)  # 0 good, 1 label, 2 dense, 3 category (first failing rule)
    reason_of[bad_cat] = 3
    reason_of[bad_dense] = 2
    reason_of[bad_label] = 1
    for code, reason in ((1, "bad_label"), (2, "bad_dense"), (3, "bad_category")):
        rows = np.flatnonzero(reason_of == code)
        dropped[reason] = int(len(rows))
        for r in rows[:max_examples]:
            if code == 1:
                col, what = 0, "label must be 0 or 1"
            elif code == 2:
                col, what = 1 + int(bad_dense_col[r]), "not an integer"
            else:
                col, what = 1 + CRITEO_NUM_DENSE + int(bad_cat_col[r]), "not 1 to 8 hex digits"
            line = int(lines_of_rows()[r])
            if arrow_data is data:
                fs, fe, fd = fields[col]
                value = fd[fs[r]:fe[r]].tobytes().decode("utf-8", "replace")
            else:                                   # the field as it is, not as Arrow read it
                value = _field_text(data, _line_starts(data), line - first_line, col)
            examples.append(BadLine(line, reason, f"field {COLUMN_NAMES[col]} = {value[:40]!r}: {what}"))
    examples.sort(key=lambda b: b.line)
    if policy == "error" and examples:
        e = examples[0]
        raise MalformedLineError(path, e.line, e.reason, e.detail)

    all_good = not (bad_label.any() or bad_dense.any() or bad_cat.any())
    good = slice(None) if all_good else reason_of == 0
    dense = np.log1p(np.maximum(dense_raw[good], 0).astype(np.float64)).astype(np.float32)  # (n_good, 13)
    dense_missing = np.array([int(m[good].sum()) for m in dense_missing_rows], np.int64)
    cats_missing = np.array([int(m[good].sum()) for m in cats_missing_rows], np.int64)
    return ParsedBlock(
        lines=nlines,
        label=label[good],
        dense=dense,
        cats=cats[:, good],
        dropped=dropped,
        examples=examples[:max_examples],
        dense_missing=dense_missing,
        cats_missing=cats_missing,
    )
