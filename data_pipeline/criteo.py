"""Criteo raw TSV (Kaggle ``train.txt`` or 1TB ``day_0 .. day_23``, plain or gzip) to Parquet shards.

Streaming with bounded memory: files are cut into blocks of whole lines (``block_bytes``), blocks
are parsed by ``workers`` threads or processes (at most ``2 * workers`` blocks in flight), results
are written in input order. See :mod:`data_pipeline.criteo_parse` for the per-line rules and
``docs/data_pipeline.md`` for the output layout.
"""

from __future__ import annotations

import gzip
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .parallel import ordered_map
from .criteo_parse import REASONS, ParsedBlock, parse_block
from .schema import CRITEO_NUM_DENSE, CRITEO_NUM_SPARSE, DatasetMeta, sparse_names
from .vocab import VocabCounter, apply_vocab, load_vocab, save_vocab
from .writer import (Columns, OutputExistsError, ShardWriter, WriterOptions, check_output_dir, remove_staged,
                     staging_path, write_json_replacing)

__all__ = ["CriteoOptions", "preprocess_criteo", "iter_blocks", "count_lines", "CorruptInputError",
           "CriteoOptionError", "SPLITS"]

SPLITS = ("train", "validation", "test")
"""Every split folder a run may write; a rerun checks (and with overwrite clears) all of them, so
that no split of an earlier run stays next to this run's."""


class CriteoOptionError(ValueError):
    """Options of the preprocessing that are wrong or do not fit together (an unknown split or
    policy, one day file for the MLPerf split, an input given twice, ...): ``neo-data`` prints
    them as one line and exits 2."""


class CorruptInputError(ValueError):
    """An input file that cannot be read to its end (a truncated or corrupt gzip stream): names the
    file and the last line read whole."""

    def __init__(self, path: str, lines_read: int, detail: str) -> None:
        super().__init__(f"{path}: unreadable after line {lines_read} (truncated or corrupt gzip data: {detail})")
        self.path, self.lines_read, self.detail = path, lines_read, detail

    def __reduce__(self):  # picklable across worker processes
        return (CorruptInputError, (self.path, self.lines_read, self.detail))


@dataclass
class CriteoOptions:
    """Options of ``neo-data criteo-preprocess``."""

    inputs: List[str]
    """Raw files in day order (``day_0 .. day_23`` or one ``train.txt``); ``.gz`` or plain."""
    output: str
    """Output directory; splits go to ``<output>/<split>/part-*.parquet``."""
    split: str = "none"
    """``none``: every file to ``train``. ``mlperf``: all files but the last to ``train``; the last
    file's first ceil(L/2) lines to ``validation``, the remaining lines to ``test``."""
    policy: str = "skip"
    """Malformed lines: ``skip`` (count per reason, log the first ones) or ``error`` (stop)."""
    max_ids: Optional[List[int]] = None
    """Per-table maximum: ids are folded ``id % max_ids[t]`` (one value, or 26). None: no folding."""
    vocab_min_count: int = 0
    """If > 0: remap ids to contiguous ids through a vocabulary of the ids seen at least this
    often in the training files (0 = missing, 1 = rare/unseen, 2.. = frequent ids in id order)."""
    workers: int = 2
    """Parser threads or processes (1 = parse in the calling thread)."""
    executor: str = "thread"
    """``thread`` (default: Arrow and numpy release the GIL, nothing is copied) or ``process``."""
    block_bytes: int = 8 << 20
    """Bytes of raw text per block (whole lines; about 35k lines at 8 MiB)."""
    writer: WriterOptions = field(default_factory=WriterOptions)
    """Parquet sharding and codec."""
    max_examples: int = 5
    """Dropped lines logged per reason (over the whole run; see docs/data_pipeline.md for the one limit)."""


def _open(path: str):
    raw = open(path, "rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    return raw, raw


def iter_blocks(path: str, block_bytes: int, progress: Optional[Callable[[int], None]] = None
                ) -> Iterator[Tuple[int, bytes]]:
    """(first 1-based line number, bytes of whole lines) blocks of a plain or gzip text file."""
    raw, f = _open(path)
    try:
        line, rest, pos = 1, b"", 0
        while True:
            chunk = _read(f, block_bytes, path, line - 1)
            if progress is not None:
                now = raw.tell()
                progress(now - pos)
                pos = now
            if not chunk:
                if rest:
                    yield line, rest
                return
            buf = rest + chunk if rest else chunk
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                rest = buf
                continue
            block, rest = buf[:cut], buf[cut:]
            yield line, block
            line += block.count(b"\n")
    finally:
        f.close()
        raw.close()


def _read(f, size: int, path: str, lines_done: int) -> bytes:
    """``f.read(size)``, a gzip stream's EOFError / BadGzipFile / zlib error as a
    :class:`CorruptInputError` naming the file and the line reached (not a traceback)."""
    try:
        return f.read(size)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise CorruptInputError(path, lines_done, str(exc)) from exc


def count_lines(path: str, block_bytes: int = 8 << 20) -> int:
    """Lines of a text file (a last line without ``\\n`` counts)."""
    n, last = 0, b"\n"
    for _, block in iter_blocks(path, block_bytes):
        n += block.count(b"\n")
        last = block[-1:]
    return n + (0 if last == b"\n" else 1)


def _split_at_line(block: bytes, k: int) -> Tuple[bytes, bytes]:
    """(first k lines, rest) of a block."""
    if k <= 0:
        return b"", block
    nl = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
    if k > len(nl):
        return block, b""
    cut = int(nl[k - 1]) + 1
    return block[:cut], block[cut:]


# ----------------------------------------------------------------------------- worker side
_WORKER_STATE: Dict[str, Any] = {}  # per process: the loaded vocabulary (set by _init_worker), read-only


def _init_worker(vocab_dir: Optional[str]) -> None:
    _WORKER_STATE["vocab"] = load_vocab(vocab_dir, CRITEO_NUM_SPARSE) if vocab_dir else None


def _work(task: Tuple[str, bytes, int, str, str, Optional[List[int]], int]) -> Tuple[ParsedBlock, Any]:
    mode, data, first_line, path, policy, max_ids, max_examples = task
    # parse_block keeps at most its limit of examples per block in all (per reason, then in total):
    # room for every reason's share, so that the driver can keep max_examples of each reason
    blk = parse_block(data, first_line, path, policy, max_examples * len(REASONS))
    if max_ids is not None:
        blk.cats %= np.asarray(max_ids, np.int64)[:, None]
    if mode == "count":
        uniq = [np.unique(c, return_counts=True) for c in blk.cats]
        blk.label = blk.label[:0]
        blk.dense = blk.dense[:0]
        blk.cats = blk.cats[:, :0]
        return blk, uniq
    vocab = _WORKER_STATE.get("vocab")
    if vocab is not None:
        blk.cats = np.stack([apply_vocab(vocab[t], blk.cats[t]) for t in range(CRITEO_NUM_SPARSE)])
    return blk, None


def _run_tasks(tasks: Iterator[Tuple[Any, tuple]], workers: int, vocab_dir: Optional[str], executor: str
               ) -> Iterator[Tuple[Any, Tuple[ParsedBlock, Any]]]:
    """(tag, result) in task order; at most 2 * workers tasks in flight."""
    return ordered_map(_work, tasks, workers, _init_worker, (vocab_dir,), executor)


# ----------------------------------------------------------------------------- driver
def _plan(opts: CriteoOptions) -> List[Tuple[str, str, Optional[int], Optional[int]]]:
    """(split, path, first line, last line) ranges, 1-based inclusive; None = open end."""
    if opts.split == "none":
        return [("train", p, None, None) for p in opts.inputs]
    if opts.split == "mlperf":
        if len(opts.inputs) < 2:
            raise CriteoOptionError(f"split 'mlperf' needs at least two day files (training days, then the last "
                                    f"day); {len(opts.inputs)} given")
        last = opts.inputs[-1]
        n = count_lines(last, opts.block_bytes)
        half = math.ceil(n / 2)
        return ([("train", p, None, None) for p in opts.inputs[:-1]]
                + [("validation", last, 1, half), ("test", last, half + 1, None)])
    raise CriteoOptionError(f"unknown split {opts.split!r} (none or mlperf)")


def _blocks_of_range(path: str, lo: Optional[int], hi: Optional[int], block_bytes: int,
                     progress: Optional[Callable[[int], None]]) -> Iterator[Tuple[int, bytes]]:
    for first, block in iter_blocks(path, block_bytes, progress):
        nl = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        last = first + nl - 1
        if hi is not None and first > hi:
            return
        if lo is not None and last < lo:
            continue
        if lo is not None and first < lo:
            _, block = _split_at_line(block, lo - first)
            first = lo
        if hi is not None and last > hi:
            block, _ = _split_at_line(block, hi - first + 1)
        yield first, block


def _max_ids(opts: CriteoOptions) -> Optional[List[int]]:
    if opts.max_ids is None:
        return None
    m = list(opts.max_ids)
    if len(m) == 1:
        m = m * CRITEO_NUM_SPARSE
    if len(m) != CRITEO_NUM_SPARSE or min(m) <= 0:
        raise CriteoOptionError(f"max_ids needs 1 or {CRITEO_NUM_SPARSE} positive values, got {len(m)}")
    return m


def _check_inputs(paths: List[str]) -> None:
    """Every input is an existing regular file (a clear error before any work, not a traceback)."""
    if not paths:
        raise FileNotFoundError("no input files given")
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"input file {p} does not exist")
        if os.path.isdir(p):
            raise IsADirectoryError(f"input {p} is a directory; give the raw files (day_0 .. day_23 or train.txt)")
    seen: Dict[str, str] = {}
    for p in paths:                       # the same file twice: its rows twice (or a day in two splits)
        real = os.path.realpath(p)
        if real in seen:
            raise CriteoOptionError(f"input {p} is given twice (as {seen[real]} before); each day file once")
        seen[real] = p


def _check_outputs(opts: CriteoOptions) -> None:
    """Refuse an output that holds an earlier run (any split, or its vocabulary) unless overwrite."""
    for split in SPLITS:
        check_output_dir(os.path.join(opts.output, split), opts.writer.overwrite)
    vocab = os.path.join(opts.output, "vocab")
    if os.path.exists(vocab) and not opts.writer.overwrite:
        raise OutputExistsError(f"output directory {opts.output} already holds a vocabulary ({vocab}) of an "
                                f"earlier run; pass --overwrite to replace it, or choose another --output")


def _commit_outputs(opts: CriteoOptions, writers: Dict[str, "ShardWriter"], staged_vocab: Optional[str]) -> None:
    """Put every split (and the vocabulary) of a successful run in place; with overwrite, the part
    files of splits this run does not write and an old vocabulary go, so no earlier run is left."""
    for w in writers.values():
        w.commit()
    for split in SPLITS:
        stale = os.path.join(opts.output, split)
        if split not in writers and os.path.isdir(stale):
            check_output_dir(stale, opts.writer.overwrite)
            for f in os.listdir(stale):
                if f.startswith("part-") and f.endswith(".parquet"):
                    os.remove(os.path.join(stale, f))
            if not os.listdir(stale):
                os.rmdir(stale)
    vocab = os.path.join(opts.output, "vocab")
    if os.path.exists(vocab):       # (refused at the start unless overwrite)
        remove_staged(vocab)
    if staged_vocab is not None:
        os.rename(staged_vocab, vocab)


def _abort_outputs(opts: CriteoOptions, writers: Dict[str, "ShardWriter"], staged_vocab: Optional[str],
                   made_root: bool) -> None:
    """Remove everything a failed run staged (and the output folder if this run made it and it is empty)."""
    for w in writers.values():
        w.abort()
    if staged_vocab is not None:
        remove_staged(staged_vocab)
    if made_root:
        try:
            os.rmdir(opts.output)
        except OSError:
            pass


def preprocess_criteo(opts: CriteoOptions, log: Callable[[str], None] = print,
                      progress_factory: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Run the preprocessing; returns the JSON summary (also written to ``<output>/summary.json``).

    Outputs appear only when the whole run succeeds: splits (and the vocabulary) are written to
    hidden staging folders and moved into place at the end; a failure removes them."""
    if opts.policy not in ("skip", "error"):
        raise CriteoOptionError(f"unknown malformed-line policy {opts.policy!r} (skip or error)")
    if not opts.block_bytes > 0:          # f.read(0) reads nothing: every file would look empty
        raise CriteoOptionError(f"block_bytes must be > 0, got {opts.block_bytes}")
    _check_inputs(opts.inputs)
    _check_outputs(opts)
    made_root = not os.path.isdir(opts.output)
    os.makedirs(opts.output, exist_ok=True)
    writers: Dict[str, ShardWriter] = {}
    staged: Dict[str, Optional[str]] = {"vocab": None}
    try:
        summary = _preprocess(opts, log, progress_factory, writers, staged)
        _commit_outputs(opts, writers, staged["vocab"])
    except BaseException:
        _abort_outputs(opts, writers, staged["vocab"], made_root)
        raise
    write_json_replacing(os.path.join(opts.output, "summary.json"), summary)
    return summary


def _preprocess(opts: CriteoOptions, log: Callable[[str], None], progress_factory: Optional[Callable[..., Any]],
                writers: Dict[str, ShardWriter], staged: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """The run proper: fills ``writers`` (closed, not committed) and ``staged['vocab']`` as it goes,
    so that the caller can commit or remove them; returns the summary."""
    t0 = time.time()
    max_ids = _max_ids(opts)
    plan = _plan(opts)
    total_bytes = sum(os.path.getsize(p) for _, p, _, _ in plan)
    bar = progress_factory(total=total_bytes, unit="B", unit_scale=True, desc="criteo") if progress_factory else None
    tick = bar.update if bar is not None else None

    vocab_dir = None
    vocab_info: Optional[Dict[str, Any]] = None
    if opts.vocab_min_count > 0:
        counter = VocabCounter(CRITEO_NUM_SPARSE)
        tasks = ((None, ("count", b, first, p, opts.policy, max_ids, opts.max_examples))
                 for split, p, lo, hi in plan if split == "train"
                 for first, b in _blocks_of_range(p, lo, hi, opts.block_bytes, None))
        for _, (_, uniq) in _run_tasks(tasks, opts.workers, None, opts.executor):
            counter.add(uniq)
        vocabs = counter.finish(opts.vocab_min_count)
        vocab_dir = staged["vocab"] = staging_path(os.path.join(opts.output, "vocab"))
        remove_staged(vocab_dir)
        save_vocab(vocab_dir, vocabs)
        vocab_info = {"min_count": opts.vocab_min_count, "directory": os.path.join(opts.output, "vocab"),
                      "sizes": [len(v) + 2 for v in vocabs]}
        log(f"vocabulary: {sum(len(v) for v in vocabs)} ids kept (count >= {opts.vocab_min_count})")

    table_sizes = vocab_info["sizes"] if vocab_info else max_ids
    meta_extra = {"transform": "dense = log(max(x, 0) + 1), missing = 0; ids = hex value, missing = 0",
                  "max_ids": max_ids, "vocab_min_count": opts.vocab_min_count, "split": opts.split}
    per_split: Dict[str, Dict[str, Any]] = {}
    per_file: Dict[Tuple[str, str], Dict[str, Any]] = {}
    examples: List[Dict[str, Any]] = []

    def rec(d: Dict[str, Any]) -> Dict[str, Any]:
        d.setdefault("lines_read", 0)
        d.setdefault("rows_written", 0)
        d.setdefault("dropped", {r: 0 for r in REASONS})
        return d

    tasks = (((split, p), ("write", b, first, p, opts.policy, max_ids, opts.max_examples))
             for split, p, lo, hi in plan for first, b in _blocks_of_range(p, lo, hi, opts.block_bytes, tick))
    dense_missing = np.zeros(CRITEO_NUM_DENSE, np.int64)
    cats_missing = np.zeros(CRITEO_NUM_SPARSE, np.int64)
    for (split, path), (blk, _) in _run_tasks(tasks, opts.workers, vocab_dir, opts.executor):
        if split not in writers:
            meta = DatasetMeta(num_dense=CRITEO_NUM_DENSE, sparse_names=sparse_names(CRITEO_NUM_SPARSE),
                               source="criteo", table_sizes=table_sizes, extra=dict(meta_extra, split_name=split))
            writers[split] = ShardWriter(os.path.join(opts.output, split), meta, "onehot", opts.writer)
        writers[split].write(Columns(blk.label, blk.dense, list(blk.cats)))
        for d in (rec(per_split.setdefault(split, {})), rec(per_file.setdefault((split, path), {}))):
            d["lines_read"] += blk.lines
            d["rows_written"] += len(blk.label)
            for r, c in blk.dropped.items():
                d["dropped"][r] += c
        dense_missing += blk.dense_missing
        cats_missing += blk.cats_missing
        for e in blk.examples:
            if sum(1 for x in examples if x["reason"] == e.reason) < opts.max_examples:
                examples.append({"file": path, **asdict(e)})
                log(f"dropped {path}:{e.line}: {e.reason}: {e.detail}")
    for split in {s for s, _, _, _ in plan}:  # a split with no good rows still gets a (empty) file
        if split not in writers:
            meta = DatasetMeta(num_dense=CRITEO_NUM_DENSE, sparse_names=sparse_names(CRITEO_NUM_SPARSE),
                               source="criteo", table_sizes=table_sizes, extra=dict(meta_extra, split_name=split))
            writers[split] = ShardWriter(os.path.join(opts.output, split), meta, "onehot", opts.writer)
            rec(per_split.setdefault(split, {}))
    for split, w in writers.items():
        per_split[split]["files"] = w.close(commit=False)
    if bar is not None:
        bar.close()

    seconds = time.time() - t0
    lines = sum(d["lines_read"] for d in per_split.values())
    rows = sum(d["rows_written"] for d in per_split.values())
    dropped = {r: sum(d["dropped"][r] for d in per_split.values()) for r in REASONS}
    assert lines == rows + sum(dropped.values()), "accounting error: lines != rows + dropped"
    summary = {
        "lines_read": lines, "rows_written": rows, "dropped": dropped,
        "splits": per_split,
        "files": [{"split": s, "path": p, **d} for (s, p), d in per_file.items()],
        "missing_values": {"dense": dense_missing.tolist(), "categorical": cats_missing.tolist()},
        "examples": examples, "vocab": vocab_info, "seconds": round(seconds, 3),
        "lines_per_second": round(lines / seconds, 1) if seconds > 0 else None,
        "options": {k: v for k, v in asdict(opts).items()},
    }
    return summary
