"""What a :class:`~neo.train.trainer.Trainer` run says when it ends: the figures of its final JSON
line (steps, throughput, recent loss, the plan's predicted step next to the measured one), the end
of a run stopped by a signal of ``train.stop_signals``, and the error naming the operation and the
ranks at fault when a collective fails.

``TrainerReport`` is a mixin of the trainer (the attributes it reads: ``cfg``, ``pg``, ``rank``,
``W``, ``B``, ``plan``, ``step``, ``step_stats``, ``losses``, ``timers``, ``heartbeat``,
``trace``, ``checkpointer``, ``_saved_step``, and its ``save()``).
"""

from __future__ import annotations

import os
from typing import Any, Dict

import torch
import torch.distributed as dist

from neo.distributed.comms import CollectiveError
from neo.train.run_log import RunLog
from neo.train.stop import signal_name
from neo.train.trace import write_trace

__all__ = ["TrainerReport"]


_PHASES = {
    "data": "reading the next batch",
    "input_dist": "the input distribution (ids and lengths AlltoAll)",
    "lookup": "the embedding lookup",
    "output_dist": "the pooled-embedding AlltoAll / ReduceScatter",
    "dense_fwd": "the dense forward",
    "backward": "the backward (dense-gradient AllReduce of DDP, embedding-gradient AlltoAll, fused update)",
    "embedding_bwd": "the embedding backward",
    "output_dist_bwd": "the embedding-gradient AlltoAll",
    "optimizer": "the dense optimizer step",
    "metrics": "the loss average AllReduce",
    "evaluate": "the evaluation",
    "checkpoint": "the checkpoint save",
    "state_digest": "the state digest's AllGather",
}
"""What each phase timer covers, for errors naming the operation that failed."""


class TrainerReport:
    """The final figures, a stopped run's end and a failed collective's error (see the module doc)."""

    def _predicted_vs_measured(self) -> Dict[str, Any]:
        """The plan's predicted step next to the steady-state measured one, component by component."""
        out: Dict[str, Any] = {}
        pred = self.plan.get("summary", {}).get("step")
        if pred:
            out["predicted_step_ms"] = pred["step_ms"]
            out["predicted_components_ms"] = pred["components_ms"]
        meas = self.step_stats.summary()
        if meas:
            out["measured_step_ms"] = meas["step_ms"]
            out["measured_components_ms"] = meas["components_ms"]
        if pred and meas and meas["step_ms"] > 0:
            out["prediction_ratio"] = round(pred["step_ms"] / meas["step_ms"], 3)
        if "cost_constants" in self.plan.get("summary", {}):
            out["cost_constants"] = self.plan["summary"]["cost_constants"]
        return out

    def _run_figures(self, steps_run: int, train_s: float) -> Dict[str, Any]:
        """What the final JSON line says of any run, finished or stopped: steps, throughput, the
        recent training loss (of the last 50 steps, over every rank's samples, as the run log's
        records; collective), the world."""
        recent = self.losses[-50:]
        loss = torch.tensor([sum(recent), float(len(recent))], dtype=torch.float64)
        if self.W > 1:
            dist.all_reduce(loss, group=self.pg.world)
        return {"steps": self.step, "samples_per_s": round(steps_run * self.B * self.W / max(train_s, 1e-9), 1),
                "train_loss": float(loss[0] / loss[1]) if float(loss[1]) > 0 else None,
                "world_size": self.W, "global_batch": self.B * self.W, "train_seconds": round(train_s, 2)}

    def _stopped(self, num: int, runlog: RunLog, steps_run: int, train_s: float) -> Dict[str, Any]:
        """The end of a run stopped by a signal of train.stop_signals after step ``self.step``: the
        checkpoint of this step (none without train.checkpoint_dir), no evaluation and no digest
        (a stop must fit in the time before the kill), a ``stopped`` record."""
        t = self.cfg.train
        checkpoint = None
        with self.timers("checkpoint"):
            if t.checkpoint_dir:
                if self._saved_step != self.step:
                    self.save()
                self.checkpointer.wait()                          # committed before the process ends
                checkpoint = os.path.join(t.checkpoint_dir, f"step-{self.step}")
        final = dict(self._run_figures(steps_run, train_s), stopped=signal_name(num), exit_status=128 + num,
                     checkpoint=checkpoint)
        if self.trace is not None:
            final["trace"] = write_trace(self.trace, t.trace, self.rank, self.W, self.pg.world)
        runlog.record("stopped", self.step, final)
        runlog.message(f"stopped by {final['stopped']} after step {self.step}: "
                       + (f"checkpoint {checkpoint}" if checkpoint else "no train.checkpoint_dir, nothing saved"))
        runlog.close()
        return final

    def _named_failure(self, e: BaseException) -> CollectiveError:
        from neo.distributed.shm import ShmPeerGone

        phase = self.timers.failed_in or "a collective"
        cause = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        gone, seen = e, set()
        while gone is not None and not isinstance(gone, ShmPeerGone) and id(gone) not in seen:
            seen.add(id(gone))
            gone = gone.__cause__ or gone.__context__
        if isinstance(gone, ShmPeerGone):             # a peer exited (its own error is in its output)
            return CollectiveError(f"rank {self.rank}: step {self.step + 1}: {_PHASES.get(phase, phase)} stopped: "
                                   f"{str(gone).strip().splitlines()[0]}; that rank's own error says why")
        return CollectiveError(
            f"rank {self.rank}: step {self.step + 1}: {_PHASES.get(phase, phase)} did not complete within "
            f"train.collective_timeout_s = {self.cfg.train.collective_timeout_s:g} s: {self.heartbeat.diagnose()}. "
            f"Cause: {cause}")
