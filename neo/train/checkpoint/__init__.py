"""Checkpoints: atomic, checksummed, resharding, written by ``torch.distributed.checkpoint``.

- :mod:`.layout`: directories, formats, the atomic commit (``tmp-<N>`` -> ``step-<N>``, ``latest``);
- :mod:`.dcp_state`: the DCP state dict of a job (sharded tables with global offsets);
- :mod:`.writer`: :class:`Checkpointer`, background saves with checksums and agreement;
- :mod:`.reader`: the newest intact checkpoint, loading into any plan or world size;
- :mod:`.integrity`: ``manifest.json`` checksums and their verification;
- :mod:`.digest`: ``state_sha256`` of a job's whole state;
- :mod:`.legacy`: the earlier ``neo1`` format (read; written only by tests);
- :mod:`.lease`: :class:`CheckpointLease`, one run at a time writing a directory (``lease.json``).

See docs/reliability.md for the guarantees and how they are tested.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from neo.train.checkpoint.dcp_state import dense_state, embedding_state, meta_text, rank_state
from neo.train.checkpoint.digest import state_sha256
from neo.train.checkpoint.layout import CheckpointError, latest_checkpoint, step_dir
from neo.train.checkpoint.lease import CheckpointLease
from neo.train.checkpoint.reader import find_resumable, load_checkpoint
from neo.train.checkpoint.writer import Checkpointer

__all__ = ["Checkpointer", "CheckpointError", "CheckpointLease", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "find_resumable", "job_state", "state_sha256"]


def job_state(sharded, dense_model, optimizer, loader_state: Dict[str, Any], optimizer_steps: int,
              meta: Dict[str, Any]) -> Dict[str, Any]:
    """The DCP state dict of this rank (views of the live tensors: DCP stages or writes them)."""
    emb, _ = embedding_state(sharded, for_load=False)
    return {"embedding": emb, "dense": dense_state(dense_model, optimizer),
            "embedding_optimizer_step": int(optimizer_steps),
            "ranks": {str(sharded.pg.rank): rank_state(loader_state)}, "meta": meta_text(meta)}


def save_checkpoint(root: str, step: int, *, sharded, dense_model, optimizer, loader_state: Dict[str, Any],
                    pg, meta: Optional[Dict[str, Any]] = None, keep: int = 2, async_save: bool = False,
                    storage_writer: Optional[Callable[[str], Any]] = None) -> str:
    """Write ``root/step-<step>`` and wait for it (collective). Returns the checkpoint's path."""
    lookup = sharded.lookup
    steps = max(lookup.optimizer_steps().values(), default=0) if lookup is not None else 0
    info = dict(meta or {}, step=step, world_size=pg.world_size, local_world_size=pg.local_world_size,
                plan=sharded.plan.to_dict() if hasattr(sharded.plan, "to_dict") else None)
    ck = Checkpointer(root, pg, keep=keep, async_save=async_save, storage_writer=storage_writer)
    ck.save(step, job_state(sharded, dense_model, optimizer, loader_state, steps, info), info)
    ck.wait()
    return step_dir(root, step)
