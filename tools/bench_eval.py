"""Evaluation time by ``train.eval_batch_size``: one process, the same trained-from-scratch model,
the whole validation set at each size, with the metrics compared (they must not depend on it).

    python tools/bench_eval.py                                  # configs/main_job.yaml, 1024 / 4096 / 16384
    python tools/bench_eval.py --config configs/train_tiny.yaml --sizes 0,256 --json bench_out/eval.json

Each size builds a ``Trainer`` (the same seed: the same untrained weights) and times
``Trainer.evaluate()`` ``--reps`` times after one untimed pass (its loader warm); the best is
reported, with the AUC and log loss (``auc_matches_first``: equal to the first size's within 1e-6).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import (describe_machine, json_path, machine_info, nonneg_int_list, positive_int,  # noqa: E402
                          write_json)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=os.path.join(str(Path(__file__).resolve().parents[1]), "configs", "main_job.yaml"))
    p.add_argument("--sizes", type=nonneg_int_list, default=[0, 4096, 16384],
                   help="comma-separated train.eval_batch_size values (0: train.batch_size)")
    p.add_argument("--reps", type=positive_int, default=2, help="timed evaluations per size (the best is kept)")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--run-dir", default=None, help="the runs' train.run_dir (default: a temporary folder)")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")
    p.add_argument("--json", default=None, type=json_path)
    args = p.parse_args(argv)
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(describe_machine(machine))
    with tempfile.TemporaryDirectory(prefix="neo-bench-eval-") as tmp:      # removed at the end
        records = measure(args, args.run_dir or tmp, machine)
    if args.json:
        write_json(args.json, {"records": records})
    return 0 if all(r["auc_matches_first"] for r in records) else 1


def measure(args, run_dir: str, machine) -> List[dict]:
    """One record per ``--sizes`` value: the best of ``--reps`` evaluations, runs in ``run_dir``."""
    from neo.config import load_config
    from neo.train.trainer import Trainer

    records = []
    for size in args.sizes:
        cfg = load_config(args.config, [f"train.eval_batch_size={size}", "train.progress=false",
                                        f"train.run_dir={run_dir}", *args.overrides])
        tr = Trainer(cfg, log=lambda *a, **k: None)
        m = tr.evaluate()                                     # untimed: the loader's first pass
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            m = tr.evaluate()
            best = min(best, time.perf_counter() - t0)
        tr.release_checkpoint_dir()
        first = records[0] if records else None
        rec = {"eval_batch_size": cfg.train.eval_batch, "seconds": round(best, 4), "samples": m["count"],
               "auc": m["auc"], "logloss": m["logloss"],
               "auc_matches_first": first is None or abs(m["auc"] - first["auc"]) <= 1e-6, "machine": machine}
        records.append(rec)
        print(f"eval_batch_size {rec['eval_batch_size']:>6}: {best:.3f} s for {m['count']} samples "
              f"({m['count'] / best / 1e3:.0f}k samples/s), auc {m['auc']:.6f}")
    return records


if __name__ == "__main__":
    sys.exit(main())
