"""The end of a :class:`~neo.async_train.wsp.WSPTrainer` run: the evaluation of the final state
and the final JSON line, with every worker's clocks in the run log.

``WSPReport`` is a mixin of the trainer (the attributes it reads: ``cfg``, ``pg``, ``rank``, ``W``,
``B``, ``device``, ``data``, ``mapping``, ``val_loader``, ``model``, ``optimizer``, ``embedding``,
``timers``, ``losses``, ``waves_log``, ``server``, ``groups``, ``slowdown``, ``staleness``,
``wave_steps``, ``waves``, ``start_version``, ``total_steps``, ``step``, ``ckpt``).
"""

from __future__ import annotations

import math
from typing import Any, Dict

import torch
import torch.distributed as dist

from neo.train.checkpoint.digest import replica_sha256
from neo.train.data import rename_features
from neo.train.metrics import BinaryMetrics
from neo.train.run_log import RunLog

__all__ = ["WSPReport"]


class WSPReport:
    """Final evaluation and figures of a WSP run (see the module doc)."""

    # ------------------------------------------------------------------ the end
    @torch.no_grad()
    def evaluate(self) -> Dict[str, Any]:
        """AUC, log loss, accuracy of the final state over the validation set (every rank's share)."""
        loader = self.val_loader
        if loader is None:
            return {}
        loader.set_epoch(0)
        n = math.ceil(loader.shard_size / self.cfg.train.eval_batch)
        if self.cfg.train.eval_batches:
            n = min(n, self.cfg.train.eval_batches)
        metrics = BinaryMetrics()
        self.model.eval()
        it = iter(loader)
        try:
            for _, batch in zip(range(n), it):
                batch = rename_features(batch, self.mapping)
                metrics.update(self.model(batch.dense.to(self.device), batch.sparse.to(self.device)), batch.labels)
        finally:
            it.close()
            self.model.train()
        return metrics.compute(self.pg.world if self.W > 1 else None)

    def _final(self, runlog: RunLog, start: float, end: float, last_eval: Dict[str, Any]) -> Dict[str, Any]:
        recent = self.losses[-50:]
        mine = {"rank": self.rank, "start": start, "end": end, "waves": self.waves_log,
                "max_staleness": max((w["staleness"] for w in self.waves_log), default=0),
                "phase_s": self.timers.snapshot(), "loss_sum": float(sum(recent)), "loss_n": len(recent)}
        infos = [mine]
        if self.W > 1:
            infos = [None] * self.W
            dist.all_gather_object(infos, mine, group=self.pg.world)
        t0 = min(i["start"] for i in infos)
        for i in infos:                                            # every worker's clock over time
            for w in i["waves"]:
                runlog.record("wsp_wave", w["wave"], {"worker": i["rank"], "wave": w["wave"], "t_s": round(w["t"] - t0, 6),
                                                      "version": w["version"], "staleness": w["staleness"]})
        if self.server is not None:
            for when, worker, wave, clocks in self.server.events:
                runlog.record("wsp_clock", wave, {"worker": worker, "wave": wave, "t_s": round(when - t0, 6),
                                                  "clocks": clocks})
        seconds = max(i["end"] for i in infos) - t0
        # resumed at or past the configured end (a checkpoint of a longer run): nothing trained
        done = max(self.waves, self.start_version)
        trained_steps = max(0, self.total_steps - self.start_version * self.wave_steps)
        out = {
            "mode": "wsp", "staleness_bound": self.staleness, "wave_steps": self.wave_steps, "waves": done,
            "start_version": self.start_version,
            "checkpoint": self.ckpt.path(done) if self.ckpt is not None else None,
            "virtual_workers": self.groups, "steps": self.step, "world_size": self.W,
            "global_batch": self.B * self.W,
            "samples_per_s": round(trained_steps * self.B * self.W / max(seconds, 1e-9), 1),
            "train_seconds": round(seconds, 3),
            "max_staleness_observed": max(i["max_staleness"] for i in infos),
            "auc": last_eval.get("auc"), "logloss": last_eval.get("logloss"), "ne": last_eval.get("ne"),
            "calibration": last_eval.get("calibration"),
            "accuracy": last_eval.get("accuracy"), "eval_samples": last_eval.get("count"),
            "best_auc": self.data.best_auc,
            # the last (up to) 50 steps of every worker, as the synchronous trainer's train_loss
            "train_loss": (sum(i["loss_sum"] for i in infos) / sum(i["loss_n"] for i in infos))
            if sum(i["loss_n"] for i in infos) else None,
            "phase_ms_per_step": {k: round(1e3 * v / max(self.step, 1), 3) for k, v in mine["phase_s"].items()
                                  if k != "evaluate"},
            "slowdown": {"rank": self.slowdown.rank, "factor": self.slowdown.factor,
                         "probability": self.slowdown.probability},
        }
        if self.cfg.train.state_digest and self.rank == 0:    # the replicas are equal once every wave is in
            with self.timers("state_digest"):
                out["state_sha256"] = replica_sha256(self.embedding, self.model, self.optimizer)
        if self.start_version >= self.waves:
            out["note"] = (f"nothing left to train: resumed at version {self.start_version}, the config ends at "
                           f"wave {self.waves}")
        return out
