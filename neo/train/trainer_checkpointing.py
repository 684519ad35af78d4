"""Checkpoints of :class:`~neo.train.trainer.Trainer`: the lease on ``train.checkpoint_dir``,
opening the checkpointer and resuming from the newest checkpoint, saving a step, the state digest.

``TrainerCheckpointing`` is a mixin of the trainer (the attributes it reads: ``cfg``, ``pg``,
``rank``, ``W``, ``B``, ``say``, ``tables``, ``mapping``, ``plan``, ``sharded``, ``model``,
``optimizer``, ``train_loader``, ``total_steps``, ``step``, ``_last_loader_state``; it sets
``checkpointer``, ``lease``, ``_lease_held``, ``_saved_step`` and, when it loads a checkpoint,
``step`` and ``resumed_from``). The checkpoint format, writer and reader are
:mod:`neo.train.checkpoint`'s.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from neo.distributed.process_groups import on_rank0
from neo.train.checkpoint import (CheckpointError, CheckpointLease, Checkpointer, find_resumable, job_state,
                                  load_checkpoint, state_sha256)
from neo.train.checkpoint.layout import step_of

__all__ = ["TrainerCheckpointing"]


class TrainerCheckpointing:
    """The lease, resuming, saving and digest of a run's checkpoints (see the module doc)."""

    def _open_checkpoints(self, cached) -> None:
        """The checkpointer, and the checkpoint resumed from (if any) loaded."""
        t = self.cfg.train
        # disk-backed cached tables are written from their stores, not staged in memory
        self.checkpointer = Checkpointer(t.checkpoint_dir, self.pg, keep=t.checkpoint_keep,
                                         async_save=t.checkpoint_async and not cached, guard=self._lease_check)
        path = find_resumable(t.checkpoint_dir, self.pg, say=self.say) if t.resume else None
        if path is not None:
            self.load(path)
        else:
            earlier = sorted((d for d in os.listdir(t.checkpoint_dir) if step_of(d) >= 0), key=step_of)
            self.say(f"neo train: starting at step 0; checkpoints go to {t.checkpoint_dir}" +
                     (f" (its earlier checkpoints {earlier} are replaced from this run's first save: "
                      "train.resume=false)" if earlier else " (none there to resume from)"))

    def _take_lease(self) -> None:
        """Rank 0 takes the lease on ``train.checkpoint_dir`` (saying so when it takes over a stale
        one); a refusal (:class:`CheckpointError`: another run writes there) is raised on every
        rank, not left for the others to wait out in the next collective."""
        t = self.cfg.train

        def acquire() -> Optional[str]:
            lease = self.lease or CheckpointLease(t.checkpoint_dir, t.checkpoint_lease_s, on_lost=self.say)
            note = lease.acquire()
            self.lease = lease
            return note

        note = on_rank0(acquire, self.pg)
        if note:
            self.say(note)
        self._lease_held = True

    def _lease_check(self) -> Optional[str]:
        """Rank 0, before a save clears or commits: None while the run holds its lease."""
        return self.lease.check() if self.lease is not None else None

    def release_checkpoint_dir(self) -> None:
        """Give up the lease on ``train.checkpoint_dir`` (every rank may call it; idempotent). fit()
        calls it when it ends, however it ends; a later fit() takes the lease again. A Trainer that
        is never fit should call it when done (else the lease goes at the process's exit)."""
        self._lease_held = False
        if self.lease is not None:
            self.lease.release()

    # ------------------------------------------------------------------ checkpoints
    def _data_identity(self) -> Optional[Dict[str, Any]]:
        """What the training data is, cheaply: its sample count and its files (the last two folders
        of each path, e.g. ``synth-<hash>/train/part-00000.parquet``, and the size), None for a
        loader without files."""
        files = getattr(self.train_loader, "files", None)
        if files is None:
            return None
        tail = lambda f: "/".join(os.path.normpath(f).split(os.sep)[-3:])  # noqa: E731
        return {"samples": int(self.train_loader.num_samples),
                "files": [[tail(f), os.path.getsize(f)] for f in files]}

    def _table_inputs(self) -> Dict[str, List[str]]:
        """Each table's data columns (the sparse features of the data that it looks up)."""
        by_feature = {f: d for d, f in self.mapping.items()} if self.mapping else {}
        return {t.name: [by_feature.get(f, f) for f in t.feature_names] for t in self.tables}

    def load(self, path: str) -> None:
        meta = load_checkpoint(path, sharded=self.sharded, dense_model=self.model, optimizer=self.optimizer,
                               loader=self.train_loader, pg=self.pg)
        saved, now = meta.get("table_inputs"), self._table_inputs()
        if saved is not None and saved != now:
            moved = sorted(t for t in now if saved.get(t) != now[t])
            raise CheckpointError(f"{path}: tables {moved} read other data columns than when the checkpoint was "
                                  f"written ({ {t: saved.get(t) for t in moved} } then, { {t: now[t] for t in moved} } "
                                  "now: the tables' order or features changed); resuming would train each on "
                                  "another feature's ids")
        self.step = int(meta["step"])
        self.resumed_from = path
        self.say(f"neo train: resumed from {path} at step {self.step}")
        data = meta.get("train_data")
        if data is not None and data != self._data_identity():
            now = self._data_identity() or {}
            self.say(f"neo train: the checkpoint was trained on other data ({data.get('samples')} samples in "
                     f"{len(data.get('files', []))} files, e.g. {(data.get('files') or [['?']])[0][0]}); this run reads "
                     f"{now.get('samples')} samples in {len(now.get('files', []))} files, e.g. "
                     f"{(now.get('files') or [['?']])[0][0]}: it continues at the checkpoint's position in this data")
        batch = meta.get("global_batch")
        if batch is not None and int(batch) != self.B * self.W:
            self.say(f"neo train: the checkpoint was trained at a global batch of {batch}, this run's is "
                     f"{self.B * self.W}: its step {self.step} counts batches of the old size (the schedule "
                     "and train.steps count steps)")
        if self.step >= self.total_steps:
            self.say(f"neo train: the checkpoint is at step {self.step}, this run ends at step {self.total_steps}: "
                     "nothing left to train (raise train.steps or train.epochs)")

    def save(self) -> None:
        """Start a checkpoint of the current step (written in the background unless configured not to)."""
        lookup = self.sharded.lookup
        steps = max(lookup.optimizer_steps().values(), default=0) if lookup is not None else 0
        meta = {"step": self.step, "world_size": self.W, "local_world_size": self.pg.local_world_size,
                "global_batch": self.B * self.W, "seed": self.cfg.train.seed, "plan": self.plan,
                "table_inputs": self._table_inputs(), "train_data": self._data_identity(),
                "dense_optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None}
        state = job_state(self.sharded, self.model, self.optimizer, self._last_loader_state, steps, meta)
        self.checkpointer.save(self.step, state, meta)
        self._saved_step = self.step

    def state_sha256(self) -> str:
        """Digest of every parameter and optimizer state (collective; see neo/train/checkpoint/digest.py)."""
        return state_sha256(self.sharded, self.model, self.optimizer, self.pg)
