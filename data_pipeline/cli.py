"""``neo-data``: Criteo preprocessing, synthetic data, MLPerf multi-hot, inspection.

    neo-data criteo-preprocess day_0.gz ... day_23.gz --output out/ --split mlperf --max-ids mlperf
    neo-data multihot --input out/train --output out_mh/train --cache-dir .cache/mh
    neo-data synth --output syn/ --samples 100000000 --preset production-2021
    neo-data inspect out/train
    neo-data mlperf-layout --from-synthetic --samples 1000000 --days 3 --output mlperf_syn/
    neo-data mlperf-layout --from-parquet out/train --eval-parquet out/validation out/test --days 23 -o mlperf/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from neo.commands.arg_types import positive_float

from .criteo_parse import MalformedLineError
from .schema import MLPERF_MULTI_HOT_SIZES, MLPERF_TABLE_SIZES
from .writer import WriterOptions

__all__ = ["main", "build_parser"]


class OptionError(ValueError):
    """Options that are each valid but do not fit together (e.g. --tables 3 with 2 --rows values)."""


def _ints(text: str, mlperf: Sequence[int]) -> List[int]:
    if text == "mlperf":
        return list(mlperf)
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x]


def _int_at_least(low: int):
    """argparse type: an integer >= ``low`` (argparse names the option in its message)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v
    parse.__name__ = f"integer >= {low}"
    return parse


def _int_list(mlperf: Sequence[int] = (), counts: Sequence[int] = ()):
    """argparse type: comma-separated integers >= 1 (or 'mlperf' where ``mlperf`` is given), and
    as many as one of ``counts`` where given."""
    def parse(text: str) -> List[int]:
        if text == "mlperf" and mlperf:
            return list(mlperf)
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers"
                                             + (" or 'mlperf'" if mlperf else "")) from None
        if not vals or min(vals) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: every value must be an integer >= 1")
        if counts and len(vals) not in counts:
            raise argparse.ArgumentTypeError(f"{text!r}: give {' or '.join(map(str, counts))} values, "
                                             f"got {len(vals)}")
        return vals
    parse.__name__ = "list of integers"
    return parse


def _float_list(text: str) -> List[float]:
    """argparse type: comma-separated finite numbers >= 0 (Zipf skews)."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if not vals or not all(0 <= v < float("inf") for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be a finite number >= 0")
    return vals


def _progress(args: argparse.Namespace):
    if args.no_progress:
        return None
    from tqdm import tqdm
    return lambda **kw: tqdm(file=sys.stderr, **kw)


def _emit(summary: Dict[str, Any], path: Optional[str], quiet: bool = False) -> None:
    from .writer import json_ready

    text = json.dumps(json_ready(summary), indent=2, default=float, allow_nan=False)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    if not path or not quiet:
        print(text if not path else f"summary written to {path}")


def _writer_args(p: argparse.ArgumentParser) -> None:
    d = WriterOptions()
    p.add_argument("--rows-per-file", type=_int_at_least(1), default=d.rows_per_file, help="rows per Parquet file")
    p.add_argument("--row-group-rows", type=_int_at_least(1), default=d.row_group_rows, help="rows per row group")
    p.add_argument("--compression", default=d.compression, choices=["lz4", "snappy", "zstd", "none"])
    p.add_argument("--overwrite", action="store_true",
                   help="replace the Parquet files (and summary) of an earlier run in the output; "
                        "without it such an output is refused")


def _writer(args: argparse.Namespace) -> WriterOptions:
    return WriterOptions(rows_per_file=args.rows_per_file, row_group_rows=args.row_group_rows,
                         compression=args.compression, overwrite=args.overwrite)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="neo-data", description="Criteo preprocessing, synthetic data, "
                                 "MLPerf multi-hot and inspection of Neo's Parquet data sets.")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("criteo-preprocess", help="raw Criteo TSV (plain or gzip) to Parquet shards")
    c.add_argument("inputs", nargs="+", help="raw files in day order (day_0 .. day_23, or train.txt)")
    c.add_argument("--output", "-o", required=True, help="output directory (<output>/<split>/part-*.parquet)")
    c.add_argument("--split", default="none", choices=["none", "mlperf"],
                   help="none: all to train; mlperf: last file halved into validation and test")
    c.add_argument("--policy", default="skip", choices=["skip", "error"], help="malformed lines")
    c.add_argument("--max-ids", default=None, type=_int_list(MLPERF_TABLE_SIZES, (1, 26)),
                   help="fold ids modulo: one number, 26 comma-separated, or 'mlperf'")
    c.add_argument("--vocab-min-count", type=_int_at_least(0), default=0,
                   help="remap ids to contiguous ids seen at least this often in training files (0: off)")
    c.add_argument("--workers", type=_int_at_least(1), default=2, help="parser threads / processes")
    c.add_argument("--executor", default="thread", choices=["thread", "process"])
    c.add_argument("--block-mb", type=positive_float, default=8.0, help="MiB of raw text per parsed block")
    _writer_args(c)

    m = sub.add_parser("multihot", help="MLPerf DLRM-DCNv2 multi-hot Parquet from one-hot Parquet")
    m.add_argument("--input", "-i", required=True, help="directory of one-hot Parquet files")
    m.add_argument("--output", "-o", required=True)
    m.add_argument("--sizes", default="mlperf", type=_int_list(MLPERF_MULTI_HOT_SIZES),
                   help="ids per bag per feature, comma-separated, or 'mlperf'")
    m.add_argument("--table-sizes", default="mlperf", type=_int_list(MLPERF_TABLE_SIZES),
                   help="rows per table, comma-separated, or 'mlperf'")
    m.add_argument("--seed", type=int, default=0, help="legacy NumPy seed (MLPerf: 0)")
    m.add_argument("--cache-dir", default=None, help="where large lookup tables are memory-mapped")
    m.add_argument("--memory-limit-gb", type=positive_float, default=1.0, help="tables above this go to --cache-dir")
    _writer_args(m)

    s = sub.add_parser("synth", help="synthetic data with a planted teacher model")
    s.add_argument("--output", "-o", required=True)
    s.add_argument("--samples", type=_int_at_least(0), required=True)
    s.add_argument("--preset", default=None, choices=["criteo", "production-2021", "production-2022"])
    s.add_argument("--locality-stats", default=None,
                   help="stats file of the production presets (default: the one shipped in data_pipeline/samples/)")
    s.add_argument("--dense", type=_int_at_least(1), default=13, help="dense features")
    s.add_argument("--tables", type=_int_at_least(1), default=None,
                   help="sparse features (tables); default: as many as --rows values, or 26")
    s.add_argument("--rows", default="100000", type=_int_list(),
                   help="rows per table: one value or one per table")
    s.add_argument("--ids-per-bag", default="1", type=_int_list(), help="one value or one per table")
    s.add_argument("--variable-bags", action="store_true", help="bag sizes uniform in [0, 2k]")
    s.add_argument("--distribution", default="zipf", choices=["zipf", "uniform"])
    s.add_argument("--skew", default="1.05", type=_float_list, help="Zipf skew: one value or one per table")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--workers", type=_int_at_least(1), default=2)
    s.add_argument("--executor", default="thread", choices=["thread", "process"])
    s.add_argument("--auc-samples", type=_int_at_least(0), default=1_000_000)
    _writer_args(s)

    ml = sub.add_parser("mlperf-layout", help="MLPerf / TorchRec Criteo day files (day_<N>_dense.npy, "
                        "day_<N>_sparse_multi_hot.npz or day_<N>_sparse.npy, day_<N>_labels.npy)")
    src = ml.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-synthetic", action="store_true", help="planted-teacher samples (options below)")
    src.add_argument("--from-parquet", nargs="+", metavar="DIR", help="Parquet written by neo-data (training days)")
    ml.add_argument("--eval-parquet", nargs="+", default=[], metavar="DIR",
                    help="Parquet of the eval day (its first half is validation, the rest test)")
    ml.add_argument("--output", "-o", required=True)
    ml.add_argument("--one-hot", action="store_true", help="day_<N>_sparse.npy (n, F) instead of multi-hot .npz")
    ml.add_argument("--days", type=_int_at_least(1), default=23,
                    help="training days the samples are cut into (the eval day is numbered --days)")
    ml.add_argument("--samples", type=_int_at_least(1), default=None, help="synthetic: training samples")
    ml.add_argument("--eval-samples", type=_int_at_least(0), default=None, help="synthetic: eval-day samples (default: one day's)")
    ml.add_argument("--dense", type=_int_at_least(1), default=13, help="synthetic: dense features")
    ml.add_argument("--rows", default="mlperf",
                    help="synthetic: rows per table, comma-separated, one value, or 'mlperf'")
    ml.add_argument("--sizes", default="mlperf", help="synthetic multi-hot: ids per bag per table, or 'mlperf'")
    ml.add_argument("--distribution", default="zipf", choices=["zipf", "uniform"])
    ml.add_argument("--skew", default="1.05", help="synthetic: Zipf skew, one value or one per table")
    ml.add_argument("--seed", type=int, default=0)
    ml.add_argument("--workers", type=_int_at_least(1), default=2)
    ml.add_argument("--auc-samples", type=_int_at_least(0), default=1_000_000)
    ml.add_argument("--overwrite", action="store_true",
                    help="replace the day files (and neo_layout.json) of an earlier run in the output; "
                         "without it such an output is refused")

    i = sub.add_parser("inspect", help="schema, row count and feature statistics")
    i.add_argument("paths", nargs="+", help="Parquet files or directories")
    i.add_argument("--max-rows", type=_int_at_least(0), default=1_000_000, help="rows scanned for statistics (0: all)")

    for p in (c, m, s, ml, i):
        p.add_argument("--summary", default=None, help="write the JSON summary to this file (else print it)")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _input_errors() -> tuple:
    """Errors of bad inputs, outputs or options: one line and exit status 2, not a traceback.
    (Evaluated only when an exception reaches ``main``, so pyarrow is not imported for --help.)"""
    from pyarrow import ArrowException

    from .criteo import CorruptInputError, CriteoOptionError
    from .schema import DataFileError
    return (OSError, MalformedLineError, CorruptInputError, CriteoOptionError, DataFileError, OptionError,
            ArrowException)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except _input_errors() as exc:      # MalformedLineError: file:line: ...; the others name the file
        print(f"neo-data {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    summary = getattr(args, "summary", None)
    if summary and (os.path.isdir(summary) or not os.path.isdir(os.path.dirname(os.path.abspath(summary)))):
        raise OptionError(f"--summary {summary}: not a file in an existing directory (checked before any work)")
    prog = _progress(args)
    if args.command == "criteo-preprocess":
        from .criteo import CriteoOptions, preprocess_criteo
        opts = CriteoOptions(inputs=args.inputs, output=args.output, split=args.split, policy=args.policy,
                             max_ids=args.max_ids, vocab_min_count=args.vocab_min_count, workers=args.workers,
                             executor=args.executor,
                             block_bytes=int(args.block_mb * (1 << 20)), writer=_writer(args))
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
        summary = preprocess_criteo(opts, log=log, progress_factory=prog)
        _emit(summary, args.summary)
    elif args.command == "multihot":
        from .multihot import MultiHotOptions, convert_to_multihot
        if len(args.sizes) != len(args.table_sizes):
            raise OptionError(f"--sizes has {len(args.sizes)} values, --table-sizes {len(args.table_sizes)}")
        opts = MultiHotOptions(sizes=args.sizes, table_sizes=args.table_sizes, seed=args.seed,
                               cache_dir=args.cache_dir, memory_limit_bytes=int(args.memory_limit_gb * 2**30))
        try:
            summary = convert_to_multihot(args.input, args.output, opts, _writer(args), prog)
        except ValueError as exc:   # sizes that do not fit the input's features, tables too large, ...
            print(f"neo-data multihot: error: {exc}", file=sys.stderr)
            return 2
        _emit(summary, args.summary)
    elif args.command == "synth":
        from .synthetic import SynthOptions, apply_preset, generate
        tables = _synth_tables(args)
        o = SynthOptions(num_samples=args.samples, output=args.output, num_dense=args.dense,
                         table_rows=args.rows * tables if len(args.rows) == 1 else args.rows,
                         ids_per_bag=args.ids_per_bag,
                         variable_bags=args.variable_bags, distribution=args.distribution,
                         skew=args.skew, seed=args.seed, workers=args.workers, executor=args.executor,
                         auc_samples=args.auc_samples, writer=_writer(args))
        if args.preset:
            stats = args.locality_stats
            if args.preset.startswith("production") and stats is None:
                from .samples import locality_stats_path
                stats = locality_stats_path(args.preset.split("-")[1])
            apply_preset(o, args.preset, stats, num_tables=tables)
        _emit(generate(o, prog), args.summary)
    elif args.command == "mlperf-layout":
        try:
            summary = _mlperf_layout(args, prog)
        except ValueError as exc:   # bad options or source data (days > samples, variable bags, ...)
            print(f"neo-data mlperf-layout: error: {exc}", file=sys.stderr)
            return 2
        _emit(summary, args.summary)
    elif args.command == "inspect":
        from .stats import inspect_dataset
        _emit(inspect_dataset(args.paths, args.max_rows or None, prog), args.summary)
    return 0


def _synth_tables(args: argparse.Namespace) -> int:
    """The table count of ``synth``: --tables, else the number of --rows values (one value: 26).
    Per-table lists of another length are refused: they used to be cut or padded silently."""
    tables = args.tables or (len(args.rows) if len(args.rows) > 1 else 26)
    if args.preset:                     # the preset sets rows, bags and skews itself
        return tables
    for name, vals in (("--rows", args.rows), ("--ids-per-bag", args.ids_per_bag), ("--skew", args.skew)):
        if len(vals) not in (1, tables):
            raise OptionError(f"{name} has {len(vals)} values for {tables} tables (--tables): "
                              f"give one value, or one per table")
    return tables


def _mlperf_layout(args: argparse.Namespace, prog) -> Dict[str, Any]:
    from .mlperf_write import layout_from_parquet, layout_from_synthetic
    layout = "one_hot" if args.one_hot else "multi_hot"
    if args.from_parquet:
        # the synthetic generator's options would do nothing here: an error, not a silent no-op
        synthetic_only = ("samples", "eval_samples", "dense", "rows", "sizes", "distribution", "skew", "seed",
                          "workers", "auc_samples")
        defaults = build_parser().parse_args(["mlperf-layout", "--from-synthetic", "-o", args.output])
        given = [f"--{n.replace('_', '-')}" for n in synthetic_only if getattr(args, n) != getattr(defaults, n)]
        if given:
            raise OptionError(f"{', '.join(given)}: options of --from-synthetic; --from-parquet takes the samples "
                              "as the Parquet holds them")
        return layout_from_parquet(args.from_parquet, args.output, layout, args.days, args.eval_parquet, prog,
                                   overwrite=args.overwrite)
    from .synthetic import SynthOptions
    if args.samples is None:
        raise ValueError("--from-synthetic needs --samples")
    rows = _ints(args.rows, MLPERF_TABLE_SIZES)
    sizes = [1] if args.one_hot else _ints(args.sizes, MLPERF_MULTI_HOT_SIZES)
    if len(rows) == 1:
        rows = rows * (len(sizes) if len(sizes) > 1 else 26)
    o = SynthOptions(num_samples=args.samples, num_dense=args.dense, table_rows=rows, ids_per_bag=sizes,
                     distribution=args.distribution, skew=_floats(args.skew), seed=args.seed, workers=args.workers,
                     auc_samples=args.auc_samples)
    ev = args.samples // args.days if args.eval_samples is None else args.eval_samples
    return layout_from_synthetic(o, args.output, layout, args.days, ev, prog, overwrite=args.overwrite)


if __name__ == "__main__":
    raise SystemExit(main())
