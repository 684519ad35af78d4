"""Checkpoints of :class:`~neo.async_train.wsp.WSPTrainer`: the lease on ``train.checkpoint_dir``,
resuming from the newest version there, and rank 0's saves as it applies a version.

``WSPCheckpointing`` is a mixin of the trainer (the attributes it reads: ``cfg``, ``pg``, ``rank``,
``W``, ``B``, ``say``, ``wave_steps``, ``waves``, ``model``, ``optimizer``, ``embedding``, ``timers``;
it sets ``ckpt``, ``lease`` and, when it resumes, ``start_version``). The checkpoints themselves
(files, versions, what a replica's state holds) are :mod:`neo.async_train.checkpoint`'s.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from neo.async_train.checkpoint import WSPCheckpoints
from neo.distributed.process_groups import on_rank0
from neo.train.checkpoint import CheckpointError, CheckpointLease

__all__ = ["WSPCheckpointing"]


class WSPCheckpointing:
    """The lease, resuming and saving of a WSP run's checkpoints (see the module doc)."""

    # ------------------------------------------------------------------ checkpoints
    def _open_checkpoints(self) -> None:
        """Rank 0 takes the lease on ``train.checkpoint_dir`` (a refusal raised on every rank); with
        ``train.resume`` every rank loads the newest checkpoint rank 0 finds there."""
        t = self.cfg.train
        self.ckpt = WSPCheckpoints(t.checkpoint_dir, t.checkpoint_keep, t.checkpoint_every // self.wave_steps,
                                   self.waves)

        def acquire() -> Optional[str]:
            self.lease = CheckpointLease(t.checkpoint_dir, t.checkpoint_lease_s, on_lost=self.say)
            return self.lease.acquire()

        note = on_rank0(acquire, self.pg)
        if note:
            self.say(note)
        version = on_rank0(lambda: self.ckpt.latest() if t.resume else None, self.pg)
        if version is None:
            earlier = self.ckpt.versions() if self.rank == 0 else []
            self.ckpt.replace_existing = True
            self.say(f"neo wsp: starting at version 0; checkpoints go to {t.checkpoint_dir}" +
                     (f" (its earlier WSP checkpoints of versions {earlier} are replaced from this run's first save)"
                      if earlier else ""))
            return
        state = self.ckpt.load(version, self._identity())
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:       # shapes or parameters of another model
            from neo.train.checkpoint import CheckpointError

            first = str(e).strip().splitlines()
            raise CheckpointError(f"{self.ckpt.path(version)}: does not fit this run's model, tables or optimizer "
                                  f"({first[0] if first else type(e).__name__} ...); resume with the config it was "
                                  "written with, or give another train.checkpoint_dir") from None
        self.start_version = version
        self.say(f"neo wsp: resuming at version {version} (step {version * self.wave_steps}) from "
                 f"{self.ckpt.path(version)}")

    def _identity(self) -> Dict[str, Any]:
        """What a checkpoint must share with the run that resumes it."""
        return {"world_size": self.W, "wave_steps": self.wave_steps, "batch_size": self.B,
                "tables": [tb.name for tb in self.embedding.tables]}

    def _save(self, version: int) -> None:
        """Rank 0, as it applies ``version``: its replica (module doc of neo.async_train.checkpoint)."""
        lost = self.lease.check() if self.lease is not None else None
        if lost:
            raise CheckpointError(f"neo wsp: not writing the checkpoint of version {version}: {lost}")
        with self.timers("checkpoint"):
            self.ckpt.save(version, {**self._identity(), "step": version * self.wave_steps,
                                     "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()
