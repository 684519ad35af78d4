"""Checksums of a checkpoint's files: written with it, verified before it is resumed from.

``manifest.json`` lists every file of a checkpoint (``{"files": {name: {"bytes": n,
"sha256": hex}}}``); it is written last, after every rank's files are complete, and is itself
the proof that the save finished. Verification finds the four ways a checkpoint gets damaged:
a missing file (a shard lost or never copied), a wrong size (truncated: a crash or a full disk
while copying), a wrong digest (a flipped byte), or a missing or unreadable manifest (a save
that never finished). The ranks verify disjoint slices of the files and agree on the result.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist

from neo.train.checkpoint.layout import write_atomic

__all__ = ["MANIFEST", "file_digest", "write_manifest", "verify_files", "verify_checkpoint"]

MANIFEST = "manifest.json"
_CHUNK = 8 << 20


def file_digest(path: str) -> Tuple[int, str]:
    """(bytes, sha256 hex) of one file, read in 8 MiB pieces."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            buf = f.read(_CHUNK)
            if not buf:
                break
            h.update(buf)
            n += len(buf)
    return n, h.hexdigest()


def write_manifest(path: str, files: Dict[str, Tuple[int, str]]) -> None:
    """Write ``path/manifest.json`` (fsynced) for ``files``: name -> (bytes, sha256)."""
    body = {"files": {k: {"bytes": int(n), "sha256": h} for k, (n, h) in sorted(files.items())}}
    write_atomic(os.path.join(path, MANIFEST), json.dumps(body, indent=1))


def _manifest(path: str) -> Dict[str, Dict[str, object]]:
    with open(os.path.join(path, MANIFEST)) as f:
        files = json.load(f)["files"]
    if not isinstance(files, dict):
        raise ValueError("'files' is not a mapping")
    return files


def verify_files(path: str, names: Sequence[str], files: Dict[str, Dict[str, object]]) -> List[str]:
    """Problems of ``names`` (a slice of the manifest ``files``) under ``path``; empty when intact."""
    problems = []
    for name in names:
        want = files[name]
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            problems.append(f"{full}: missing")
            continue
        size = os.path.getsize(full)
        if size != want["bytes"]:
            problems.append(f"{full}: {size} bytes, the manifest says {want['bytes']} (truncated or overwritten)")
            continue
        _, digest = file_digest(full)
        if digest != want["sha256"]:
            problems.append(f"{full}: sha256 {digest[:16]}..., the manifest says {str(want['sha256'])[:16]}... "
                            "(damaged)")
    return problems


def verify_checkpoint(path: str, pg=None) -> Optional[str]:
    """None when every file of the checkpoint matches its manifest, else what is wrong (names
    the files). Collective over ``pg.world`` when given: rank r checks files r, r + W, ..."""
    rank, W = (pg.rank, pg.world_size) if pg is not None else (0, 1)
    try:
        files = _manifest(path)
        problems = verify_files(path, sorted(files)[rank::W], files)
    except (OSError, ValueError, KeyError, TypeError) as e:
        problems = [f"{os.path.join(path, MANIFEST)}: missing or unreadable ({e.__class__.__name__}: {e}): "
                    "the save did not finish"]
    if W > 1:
        everyone: List[Optional[List[str]]] = [None] * W
        dist.all_gather_object(everyone, problems, group=pg.world)
        problems = sorted({p for ps in everyone for p in (ps or [])})
    return "; ".join(problems) if problems else None
