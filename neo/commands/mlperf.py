"""``neo mlperf CONFIG --results-dir DIR [--seeds N] [--division open|closed] [key=value ...]``.

    neo mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir runs/mlperf_tiny --seeds 3
    torchrun --standalone --nproc-per-node 2 -m neo.mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir DIR
    neo mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir DIR mlperf.target_auc=0.74 train.batch_size=256

Runs the MLPerf Training DLRM-DCNv2 benchmark (neo/mlperf/harness.py): one timed run per seed
(``train.seed`` + i), each logged to ``DIR/result_<seed>.txt`` in MLPerf's ``:::MLLOG`` format,
then prints the runs and their olympic-mean score and writes ``DIR/summary.json``.
Check a result with MLPerf's own checker (docs/mlperf.md)::

    python -m mlperf_logging.compliance_checker --usage training --ruleset 6.0.0 DIR/result_0.txt

Exit status: 0 when every run reached the target; 1 when one did not (status ``aborted``);
2 for a bad config or argument (``--division closed`` with a config the rules do not allow, a
results dir that is a file or holds an earlier run's results without ``--overwrite``,
``--seeds 0``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from neo.config import ConfigError, load_config

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo mlperf",
                                description="Run the MLPerf DLRM-DCNv2 benchmark (time to target AUC).")
    p.add_argument("config", help="Neo YAML config with an mlperf section (e.g. configs/mlperf_dcnv2_tiny.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. mlperf.target_auc=0.75 train.batch_size=256")
    p.add_argument("--results-dir", required=True, help="result_<seed>.txt per run and summary.json go here")
    p.add_argument("--seeds", type=int, default=1, help="runs, with seeds train.seed + 0 .. N-1 (MLPerf: 10)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results an earlier run left in --results-dir (otherwise refused)")
    p.add_argument("--division", default="open", choices=["open", "closed"],
                   help="closed: refuse a config the rules do not allow (model, optimizer, batch/lr, target, cadence)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        from neo.mlperf.harness import check_request, prepare_results_dir
        from neo.train.build import validate_training_config

        check_request(cfg, args.division, args.seeds)
        validate_training_config(cfg, outputs=False)   # its runs write under --results-dir
        prepare_results_dir(args.results_dir, overwrite=args.overwrite,
                            first_rank=int(os.environ.get("RANK", "0")) == 0)
        from neo.mlperf.log import import_mllog

        import_mllog()
    except (ConfigError, ImportError) as e:
        print(f"neo mlperf: error: {e}", file=sys.stderr)
        return 2
    from neo.mlperf.harness import run_benchmark

    try:
        summary = run_benchmark(cfg, args.results_dir, seeds=args.seeds, division=args.division,
                                config_name=args.config)
    except ConfigError as e:                    # a rule only checkable once the ranks or the data exist
        print(f"neo mlperf: error: {e}", file=sys.stderr)
        return 2
    return 0 if summary["converged"] == len(summary["runs"]) else 1
