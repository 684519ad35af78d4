"""Writing a checkpoint: DCP save (in the background by default), checksums, atomic commit.

One save, on every rank::

    main thread   wait for the previous save | rank 0 clears stale tmp-* | barrier
                  dcp.async_save(state)  -> the state is staged (copied) now, training goes on
    background    the copy is written to tmp-<N>/__<rank>_*.distcp (DCP's thread; rank 0 also
                  writes .metadata once every rank's files are done)
                  each rank hashes its own files; the ranks exchange (ok, error, digests) on the
                  ``checkpoint`` process group
                  rank 0: all ok -> meta.json, manifest.json, rename to step-<N>, ``latest``
                          any failure -> tmp-<N> removed, ``latest`` untouched

The training loop calls :meth:`Checkpointer.poll` every step: a save that failed on any rank
(a full disk, a permission error) raises :class:`CheckpointError` there on every rank, naming
the rank and the cause. :meth:`Checkpointer.wait` blocks until the save in flight is
committed (before the next save, and at the end of training).

Memory: staging holds a copy of every tensor of this rank until its files are written.
``async_save=False`` writes from the live tensors in the calling thread instead (no copy;
cached tables on a disk-backed store are saved this way, see the trainer).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch.distributed as dist

from neo.train.checkpoint.integrity import file_digest, write_manifest
from neo.train.checkpoint.layout import (CheckpointError, clear_stale, commit, error_summary, latest_checkpoint,
                                        tmp_dir)

__all__ = ["Checkpointer"]


class Checkpointer:
    """Saves checkpoints of one job under ``root`` (collective: every rank owns one).

    Args:
        root: ``train.checkpoint_dir``.
        pg: :class:`neo.distributed.ProcessGroups` (``checkpoint`` carries the background collectives).
        keep: complete checkpoints kept.
        async_save: write in the background (``dcp.async_save``) or in the calling thread.
        storage_writer: ``fn(path) -> StorageWriter`` (default: DCP's ``FileSystemWriter``;
            tests inject failing writers here).
        guard: asked on rank 0 before a save clears unfinished saves and before it commits:
            None while this run may write ``root``, else why not (the run's lease on it was taken
            over, :meth:`neo.train.checkpoint.lease.CheckpointLease.check`): then nothing is
            cleared or committed, and the save fails on every rank.
    """

    def __init__(self, root: str, pg, keep: int = 2, async_save: bool = True,
                 storage_writer: Optional[Callable[[str], Any]] = None,
                 guard: Optional[Callable[[], Optional[str]]] = None):
        self.root, self.pg, self.keep, self.async_save = root, pg, keep, async_save
        self._writer = storage_writer
        self._guard = guard
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[str] = None
        self.committed: Optional[str] = None
        """Path of the last checkpoint this object committed (rank 0 knows it first)."""

    # ------------------------------------------------------------------ public
    def save(self, step: int, state: Dict[str, Any], meta: Dict[str, Any]) -> None:
        """Start saving ``state`` (a DCP state dict, see :mod:`.dcp_state`) as ``step-<step>``."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        tmp = tmp_dir(self.root, step)
        if self.pg.rank == 0 and self._may_write() is None:
            clear_stale(self.root)
        if self.pg.world_size > 1:
            dist.barrier(group=self.pg.world)
        writer = self._writer(tmp) if self._writer is not None else dcp.FileSystemWriter(tmp)
        if not self.async_save:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.pg.checkpoint)
                error = None
            except BaseException as e:  # noqa: BLE001 - every rank must learn of it
                error = _describe(e, self.pg.rank)
            self._finish(step, tmp, meta, error)
            self.raise_if_failed()
            return
        try:
            response = dcp.async_save(state, storage_writer=writer, process_group=self.pg.checkpoint)
            future = getattr(response, "upload_completion", response)
        except BaseException as e:  # noqa: BLE001 - staging failed here: the background agreement still runs
            future, staging_error = None, _describe(e, self.pg.rank)
        else:
            staging_error = None

        def finish() -> None:
            error = staging_error
            if future is not None:
                try:
                    future.result()
                except BaseException as e:  # noqa: BLE001
                    error = _describe(e, self.pg.rank)
            self._finish(step, tmp, meta, error)

        self._thread = threading.Thread(target=finish, name=f"neo-checkpoint-{step}", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Raise :class:`CheckpointError` if the last save has failed (cheap: call every step)."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
        self.raise_if_failed()

    def wait(self) -> None:
        """Block until the save in flight is committed (or raise its error)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(error)

    def _may_write(self) -> Optional[str]:
        """Rank 0: None while this run may clear and commit in ``root`` (see ``guard``)."""
        return self._guard() if self._guard is not None else None

    # ------------------------------------------------------------------ the agreement
    def _finish(self, step: int, tmp: str, meta: Dict[str, Any], error: Optional[str]) -> None:
        """Every rank: hash own files, agree, rank 0 commits. Never raises (records the error)."""
        pg = self.pg
        try:
            denied = self._may_write() if pg.rank == 0 else None
            if denied is not None:
                error = f"rank 0: {denied}"
            digests: Dict[str, Tuple[int, str]] = {}
            if error is None:
                try:
                    prefix = f"__{pg.rank}_"
                    for name in sorted(os.listdir(tmp)):
                        if name.startswith(prefix) and name.endswith(".distcp"):
                            digests[name] = file_digest(os.path.join(tmp, name))
                except OSError as e:
                    error = _describe(e, pg.rank)
            reports: List[Optional[Tuple[Optional[str], Dict[str, Tuple[int, str]]]]] = [(error, digests)]
            if pg.world_size > 1:
                reports = [None] * pg.world_size
                dist.all_gather_object(reports, (error, digests), group=pg.checkpoint)
            errors = [e for e, _ in reports if e is not None]
            if errors:
                if pg.rank == 0 and denied is None:          # a directory this run lost is not touched
                    import shutil

                    shutil.rmtree(tmp, ignore_errors=True)
                self._error = (f"checkpoint of step {step} failed ({'; '.join(errors)}); "
                               f"{latest_checkpoint(self.root) or 'no checkpoint'} is still the latest")
                return
            if pg.rank == 0:
                files = {k: v for _, d in reports for k, v in d.items()}
                with open(os.path.join(tmp, "meta.json"), "w") as f:
                    json.dump(dict(meta, step=step), f, indent=1, default=str)
                for name in (".metadata", "meta.json"):
                    files[name] = file_digest(os.path.join(tmp, name))
                write_manifest(tmp, files)
                self.committed = commit(self.root, step, self.keep)
        except BaseException as e:  # noqa: BLE001 - a background thread must not die silently
            self._error = f"checkpoint of step {step}: {_describe(e, pg.rank)}"


def _describe(e: BaseException, rank: int) -> str:
    """One line naming the rank, the exception and (for OS errors) the file; for DCP's
    CheckpointException, each failed rank's exception without its traceback."""
    if isinstance(getattr(e, "failures", None), dict):
        return error_summary(e)
    text = f"rank {rank}: {error_summary(e)}"
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) not in text:
        text += f" (cause: {error_summary(cause)})"
    return text
