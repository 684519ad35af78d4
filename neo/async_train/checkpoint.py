"""Checkpoints of WSP training: one replica at a version, written by rank 0, resumed by all.

Every worker applies every version, in order, to identical replicas (neo/async_train/wsp.py), so
the state at version v (waves 0 .. v-1 aggregated and applied) is any one replica's. Rank 0
writes it as it applies version v, when v * ``wave_steps`` is a multiple of
``train.checkpoint_every`` and at the last version: the model's state dict (the dense model and
every table with its optimizer state and step counts), the dense optimizer's, and v.

Resuming from version v: every rank loads that file, its loader moves to step v * wave_steps of
its own shard (where it was when it started wave v: the order of a rank's batches depends only
on the seed, the epoch and the position), the parameter server starts its log at v, and the
workers start wave v. The waves that were in flight when the run stopped (computed, maybe
pushed, on versions <= v + staleness) are computed again. At ``staleness: 0`` the resumed run is
the uninterrupted one bit for bit (tests/async_train/test_wsp_checkpoint.py); above 0 the
versions a wave computes on depend on timing in any run.

Layout: ``DIR/wsp-<version, 8 digits>.pt`` (``torch.save`` to ``.tmp``, fsynced, then
``os.replace``: a reader finds a whole file or none), the newest ``train.checkpoint_keep`` kept,
and rank 0's lease on ``DIR`` for the run (neo/train/checkpoint/lease.py). A run that starts at
version 0 (nothing to resume, or ``train.resume: false``) replaces the directory's earlier WSP
checkpoints at its first save. A synchronous run's ``step-*`` checkpoints are neither read nor
removed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

import torch

from neo.train.checkpoint.layout import CheckpointError

__all__ = ["WSPCheckpoints", "WSP_FORMAT"]

WSP_FORMAT = "neo-wsp-1"
_NAME = re.compile(r"^wsp-(\d{8})\.pt$")


@dataclass
class WSPCheckpoints:
    """The checkpoints of one WSP run in ``root`` (rank 0 writes; every rank reads)."""

    root: str
    keep: int
    every_waves: int          # a checkpoint when version % every_waves == 0 (0: only the last version)
    last_version: int
    replace_existing: bool = False
    """A run that did not resume: the directory's earlier checkpoints go at its first save (else a
    resume could pick an older run's later version)."""
    saved: Set[int] = field(default_factory=set)
    """Versions this run wrote."""

    def due(self, version: int) -> bool:
        return version == self.last_version or (self.every_waves > 0 and version % self.every_waves == 0)

    def path(self, version: int) -> str:
        return os.path.join(self.root, f"wsp-{version:08d}.pt")

    def versions(self) -> List[int]:
        """Versions of the complete checkpoints in ``root``, oldest first."""
        if not os.path.isdir(self.root):
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(self.root)) if m)

    def latest(self) -> Optional[int]:
        """The newest complete checkpoint's version, or None."""
        versions = self.versions()
        return versions[-1] if versions else None

    def save(self, version: int, state: Dict[str, Any]) -> str:
        os.makedirs(self.root, exist_ok=True)
        if self.replace_existing and not self.saved:
            for old in self.versions():
                os.remove(self.path(old))
        path = self.path(version)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            torch.save({"format": WSP_FORMAT, "version": version, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.saved.add(version)
        for old in self.versions()[:-self.keep]:
            os.remove(self.path(old))
        return path

    def load(self, version: int, expect: Dict[str, Any]) -> Dict[str, Any]:
        """The checkpoint of ``version``; ``expect``: fields that must equal this run's (named if not)."""
        path = self.path(version)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot be read as a WSP checkpoint ({type(e).__name__}: {e})") from None
        if not isinstance(state, dict) or state.get("format") != WSP_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"{path}: format {got!r}, expected {WSP_FORMAT!r}")
        missing = [k for k in ("model", "optimizer") if not isinstance(state.get(k), dict)]
        if missing:
            raise CheckpointError(f"{path}: no {' or '.join(missing)} state in it (cut short or not written by this run)")
        for field, mine in expect.items():
            if state.get(field) != mine:
                raise CheckpointError(f"{path}: written with {field} = {state.get(field)!r}, this run has {mine!r}; "
                                      f"resume with the same {field} or give another train.checkpoint_dir")
        return state
