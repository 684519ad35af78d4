"""Where a run's numbers go: ``RUN_DIR/metrics.jsonl``, TensorBoard, a progress bar (rank 0 only).

Every record is one JSON object per line: ``{"kind": "train" | "eval" | "final", "step": N, ...}``.
TensorBoard events go to ``RUN_DIR/tensorboard`` when ``tensorboard`` is importable (otherwise a
warning, once, and the JSONL file alone).
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from typing import Any, Dict, Optional

__all__ = ["RunLog"]


class RunLog:
    """Metrics sink of one rank; only rank 0 writes."""

    def __init__(self, run_dir: str, rank: int, total_steps: int, initial_step: int = 0, progress: bool = True,
                 tensorboard: bool = True):
        self.active = rank == 0
        self.run_dir = run_dir
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not self.active:
            return
        os.makedirs(run_dir, exist_ok=True)
        self._jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", file=sys.stderr,
                             dynamic_ncols=True, mininterval=1.0, desc="train")

    def message(self, text: str) -> None:
        """A line for the user (through the progress bar, so it is not garbled)."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def advance(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                      refresh=False)

    def record(self, kind: str, step: int, values: Dict[str, Any]) -> None:
        if not self.active:
            return
        rec = {"kind": kind, "step": step, **values}
        self._jsonl.write(json.dumps(rec, default=_jsonable) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def _jsonable(x: Any) -> Optional[Any]:
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)
