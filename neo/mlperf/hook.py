"""The trainer hook of an MLPerf run: evaluation cadence, epoch and eval log lines, stop at the target.

:class:`MLPerfHook` plugs into :meth:`neo.train.trainer.Trainer.fit` (a
:class:`neo.train.trainer.FitHook`). After every step it says whether this step is an evaluation
point (every ``eval_every_steps`` steps, and at ``max_steps``); at an evaluation point it logs
``eval_start``, runs the trainer's exact-AUROC evaluation over the whole validation set (every
rank's predictions gathered), logs ``eval_accuracy`` and ``eval_stop`` and stops the run, with
``epoch_stop`` and ``run_stop``, when the AUROC reaches the target (status ``success``) or the
step is ``max_steps`` (status ``aborted``).

``epoch_num`` is the fraction of the training set seen: samples seen / training samples, where
samples seen = steps x global batch (DLRM-DCNv2 evaluates 20 times an epoch, so it is fractional).
Example: 65,536 training samples, global batch 512: 128 steps an epoch; ``eval_every_epochs``
0.05 gives an evaluation every floor(0.05 x 128) = 6 steps, at epoch_num 0.046875, 0.09375, ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from neo.train.trainer import FitHook

__all__ = ["Cadence", "EvalPoint", "MLPerfHook"]


@dataclass(frozen=True)
class Cadence:
    """Steps of one run: an epoch, between evaluations, at most (all ranks alike)."""

    steps_per_epoch: int
    eval_every_steps: int
    max_steps: int
    global_batch: int
    train_samples: int

    @classmethod
    def of(cls, eval_every_epochs: float, max_epochs: float, steps_per_epoch: int, global_batch: int,
           train_samples: int) -> "Cadence":
        every = max(1, math.floor(eval_every_epochs * steps_per_epoch + 1e-9))
        limit = max(1, math.ceil(max_epochs * steps_per_epoch - 1e-9))
        return cls(steps_per_epoch, every, limit, global_batch, train_samples)

    def epoch_num(self, step: int) -> float:
        """Fraction of the training samples seen after ``step`` steps."""
        return step * self.global_batch / self.train_samples


@dataclass
class EvalPoint:
    """One evaluation of the run (the AUC-against-samples curve)."""

    step: int
    samples: int
    epoch_num: float
    auc: float
    seconds: float
    """Since run_start (training and the evaluations before this one)."""


@dataclass
class MLPerfHook(FitHook):
    """Evaluation points and the stop rule of one run; writes its lines to ``log`` (see module doc)."""

    log: Any
    """:class:`neo.mlperf.log.MLPerfLog` of the run."""
    cadence: Cadence
    target_auc: float
    status: Optional[str] = None
    """``success`` or ``aborted`` once the run stopped; None while it trains."""
    curve: List[EvalPoint] = field(default_factory=list)

    def run_start(self) -> None:
        """``run_start`` and the first ``epoch_start`` (just before :meth:`Trainer.fit`)."""
        c = self.log.constants
        self.log.start(c.RUN_START)
        self.log.start(c.EPOCH_START, metadata={c.EPOCH_NUM: 0.0})

    def _next_epoch(self, step: int) -> None:
        c = self.log.constants
        self.log.end(c.EPOCH_STOP, metadata={c.EPOCH_NUM: self.cadence.epoch_num(step)})
        self.log.start(c.EPOCH_START, metadata={c.EPOCH_NUM: self.cadence.epoch_num(step)})

    def after_step(self, step: int) -> bool:
        cad = self.cadence
        evaluate = step % cad.eval_every_steps == 0 or step >= cad.max_steps
        if step % cad.steps_per_epoch == 0 and not evaluate:
            self._next_epoch(step)                  # at an evaluation point: after it, unless the run stops
        return evaluate

    def evaluate(self, step: int, run_eval: Callable[[], Dict[str, Any]]) -> Tuple[Dict[str, Any], bool]:
        c, cad = self.log.constants, self.cadence
        epoch = {c.EPOCH_NUM: cad.epoch_num(step)}
        self.log.start(c.EVAL_START, metadata=epoch)
        metrics = run_eval()
        auc = float(metrics.get("auc", float("nan")))
        self.log.event(c.EVAL_ACCURACY, value=auc, metadata=epoch)
        now = self.log.end(c.EVAL_STOP, metadata=epoch)
        self.curve.append(EvalPoint(step, step * cad.global_batch, cad.epoch_num(step), auc,
                                    (now - self.log.times_ms[c.RUN_START]) / 1e3))
        if auc >= self.target_auc or step >= cad.max_steps:
            self.status = c.SUCCESS if auc >= self.target_auc else c.ABORTED
            self.log.end(c.EPOCH_STOP, metadata=epoch)
            self.log.end(c.RUN_STOP, metadata={c.STATUS: self.status, **epoch})
            return metrics, True
        if step % cad.steps_per_epoch == 0:
            self._next_epoch(step)
        return metrics, False

    @property
    def time_to_train_s(self) -> Optional[float]:
        """run_start .. run_stop, in seconds (None before the run stopped)."""
        t = self.log.times_ms
        c = self.log.constants
        if c.RUN_STOP not in t:
            return None
        return (t[c.RUN_STOP] - t[c.RUN_START]) / 1e3

    def stop_unfinished(self, step: int) -> None:
        """``run_stop`` aborted when training ended without reaching an evaluation that stops it."""
        if self.status is None:
            c = self.log.constants
            self.status = c.ABORTED
            self.log.end(c.EPOCH_STOP, metadata={c.EPOCH_NUM: self.cadence.epoch_num(step)})
            self.log.end(c.RUN_STOP, metadata={c.STATUS: self.status, c.EPOCH_NUM: self.cadence.epoch_num(step)})
