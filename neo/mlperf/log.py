"""One run's MLPerf log: ``:::MLLOG {...}`` lines written with the ``mlperf-logging`` package.

Example of the lines (one JSON object each, as ``mlperf_logging.compliance_checker`` reads them)::

    :::MLLOG {"namespace": "", "time_ms": 1732420000123, "event_type": "INTERVAL_START", "key": "run_start",
              "value": null, "metadata": {"file": "neo/mlperf/hook.py", "lineno": 80}}
    :::MLLOG {"namespace": "", "time_ms": 1732420004567, "event_type": "POINT_IN_TIME", "key": "eval_accuracy",
              "value": 0.7481, "metadata": {"file": "...", "lineno": 95, "epoch_num": 0.25}}

Only rank 0 writes (``enabled``); every rank keeps the time of each key it would have written, so
``time_ms(RUN_START)`` is known everywhere. ``mlperf_logging`` is imported here, lazily: ``import
neo`` does not need it. Its logger is process-wide (``mllog.config``); each :class:`MLPerfLog`
points it at a fresh :class:`logging.Logger` of its own whose only handler is the result file.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Dict, Optional

__all__ = ["MLPerfLog", "import_mllog"]

_instances = itertools.count()
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_mllog():
    """``mlperf_logging.mllog``, or an ImportError saying how to install it."""
    try:
        from mlperf_logging import mllog
    except ImportError as e:
        raise ImportError("neo mlperf needs the mlperf-logging package: pip install mlperf-logging==4.1.68") from e
    return mllog


class MLPerfLog:
    """The ``:::MLLOG`` lines of one run, into ``path`` (rank 0 only).

    Args:
        path: the result file (truncated).
        enabled: False on ranks other than 0: nothing is written, times are still kept.
    """

    def __init__(self, path: Optional[str], enabled: bool = True):
        self.mllog = import_mllog()
        self.constants = self.mllog.constants
        self.path = path if enabled else None
        self.times_ms: Dict[str, int] = {}
        """Time of the last line of every key (rank 0's clock; set on every rank)."""
        self._handler = None
        self._logger = None
        if self.path is not None:
            logger = logging.Logger(f"neo.mlperf.{next(_instances)}", logging.INFO)   # not in logging's registry
            self._handler = logging.FileHandler(self.path, mode="w")
            self._handler.setLevel(logging.INFO)
            logger.addHandler(self._handler)
            # stack offset 3: the file/lineno metadata of a line names the caller of event/start/end
            self.mllog.config(logger=logger, default_stack_offset=3, root_dir=_ROOT)
            self._logger = self.mllog.get_mllogger()

    def _log(self, kind: str, key: str, value: Any = None, metadata: Optional[Dict[str, Any]] = None) -> int:
        now = int(time.time() * 1e3)
        self.times_ms[key] = now
        if self._logger is not None:
            getattr(self._logger, kind)(key=key, value=value, metadata=metadata, time_ms=now)
        return now

    def event(self, key: str, value: Any = None, metadata: Optional[Dict[str, Any]] = None) -> int:
        """A POINT_IN_TIME line; returns its time (ms since the epoch)."""
        return self._log("event", key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: Optional[Dict[str, Any]] = None) -> int:
        """An INTERVAL_START line (``run_start``, ``epoch_start``, ``eval_start``...)."""
        return self._log("start", key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: Optional[Dict[str, Any]] = None) -> int:
        """An INTERVAL_END line (``run_stop``, ``epoch_stop``, ``eval_stop``...)."""
        return self._log("end", key, value, metadata)

    def close(self) -> None:
        """Flush and close the result file."""
        if self._handler is not None:
            self._handler.close()
            self._logger.logger.removeHandler(self._handler)
            self._handler = None
