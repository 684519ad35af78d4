"""The ``mlperf`` section of Neo's YAML config: what ``neo mlperf`` times and when it stops.

Example (the MLPerf Training DLRM-DCNv2 benchmark)::

    mlperf:
      target_auc: 0.80275        # eval_accuracy (exact AUROC, whole validation set) that ends the run
      eval_every_epochs: 0.05    # evaluate every 0.05 epoch of training samples
      max_epochs: 1.0            # not reached by then: run_stop with status aborted
      submission_org: Neo
      submission_status: research

The section only matters to ``neo mlperf`` (neo/mlperf/); ``neo train`` ignores it. Which
values a closed-division run may use is checked by :mod:`neo.mlperf.rules`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional

from neo.config.embedding import ConfigError, choice

__all__ = ["MLPerfConfig", "SubmissionStatus"]


class SubmissionStatus(str, enum.Enum):
    """``submission_status`` of the MLPerf log (mlperf_logging.mllog.constants)."""

    ONPREM = "onprem"
    CLOUD = "cloud"
    RESEARCH = "research"


@dataclass
class MLPerfConfig:
    """Target, evaluation cadence, length limit and submission fields of an MLPerf run."""

    target_auc: Optional[float] = None
    """Stop at the first evaluation whose AUROC is >= this (0.80275 for the full benchmark; a
    scaled config sets what its data can reach). Required by ``neo mlperf``."""
    eval_every_epochs: float = 0.05
    """Evaluate every this fraction of an epoch (floor(fraction x steps per epoch) steps, at least 1)."""
    max_epochs: float = 1.0
    """Epochs allowed before the run stops with status ``aborted`` (evaluated at that point too)."""
    submission_org: str = "Neo"
    """``submission_org`` of the log."""
    submission_platform: str = ""
    """``submission_platform`` of the log; empty: ``<W>x<device model>`` of the machine that ran it."""
    submission_status: str = "research"
    """``submission_status``: onprem, cloud or research."""
    drop_caches: bool = False
    """Before every run, write 3 to /proc/sys/vm/drop_caches (needs root) and log ``cache_clear``
    true; false logs ``cache_clear`` false (nothing was cleared)."""

    def validate(self, where: str = "mlperf") -> None:
        """Raise :class:`ConfigError` naming the field and the valid values."""
        if self.target_auc is not None and not 0.5 <= self.target_auc <= 1.0:
            raise ConfigError(f"{where}.target_auc: must be in [0.5, 1], got {self.target_auc}")
        for name in ("eval_every_epochs", "max_epochs"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{where}.{name}: must be a finite number > 0, got {v}")
        if not str(self.submission_org).strip():
            raise ConfigError(f"{where}.submission_org: must not be empty")
        self.submission_status = choice(self.submission_status, [m.value for m in SubmissionStatus],
                                        f"{where}.submission_status")
