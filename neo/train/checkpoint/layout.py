"""Where checkpoints live, which format a directory holds, and how one becomes the latest.

Layout of ``ROOT`` (``train.checkpoint_dir``)::

    ROOT/step-<N>/     one complete checkpoint per directory (the newest ``keep`` are kept; a
                       commit removes those of later steps, from a line the run left)
    ROOT/tmp-<N>/      a checkpoint being written (never read; removed by the next save)
    ROOT/latest        text: the name of the newest complete checkpoint directory

A checkpoint is written into ``tmp-<N>`` by every rank; only once every rank has finished
and the checksums are in its ``manifest.json`` does rank 0 rename it to ``step-<N>`` and
replace ``latest`` (``os.replace`` of a small fsynced file): a crash at any point before
leaves ``latest`` on the previous complete checkpoint. Multi-node runs need ``ROOT`` on a
shared file system.

Formats: ``dcp`` (``torch.distributed.checkpoint``: ``.metadata`` and ``__<rank>_<i>.distcp``
files, see :mod:`.dcp_state`) is what Neo writes; ``neo1`` (``meta.json`` and
``shards-<rank>.pt``, see :mod:`.legacy`) is the format of earlier versions, still read.
"""

from __future__ import annotations

import os
import shutil
from typing import List, Optional

__all__ = ["CheckpointError", "error_summary", "checkpoint_format", "latest_checkpoint", "candidates", "step_of",
           "tmp_dir", "step_dir", "commit", "clear_stale"]

FORMAT_DCP = "dcp"
FORMAT_NEO1 = "neo1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, is damaged, or does not fit the model."""


def error_summary(e: BaseException) -> str:
    """One line for an exception of a checkpoint save or load: for torch.distributed.checkpoint's
    ``CheckpointException`` (whose text holds every failed rank's traceback) each failed rank's
    exception alone, e.g. ``rank 0: OSError: [Errno 28] No space left on device: '...'``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        parts = []
        for rank, pair in sorted(failures.items()):
            exc = pair[0] if isinstance(pair, tuple) and pair else pair
            parts.append(f"rank {rank}: {type(exc).__name__}: {exc}" if isinstance(exc, BaseException)
                         else f"rank {rank}: {exc}")
        return "; ".join(parts)
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step}")


def tmp_dir(root: str, step: int) -> str:
    return os.path.join(root, f"tmp-{step}")


def step_of(path: str) -> int:
    """N of ``.../step-<N>`` (-1 when the name is not of that form)."""
    name = os.path.basename(os.path.normpath(path))
    try:
        return int(name.split("-", 1)[1]) if name.startswith("step-") else -1
    except ValueError:
        return -1


def checkpoint_format(path: str) -> Optional[str]:
    """``dcp``, ``neo1``, or None when ``path`` holds neither (missing, or an unfinished write)."""
    if os.path.isfile(os.path.join(path, ".metadata")):
        return FORMAT_DCP
    if os.path.isfile(os.path.join(path, "meta.json")) and os.path.isfile(os.path.join(path, "shards-0.pt")):
        return FORMAT_NEO1
    return None


def _latest_name(root: str) -> Optional[str]:
    """The directory name ``ROOT/latest`` holds; None where it is missing, unreadable or damaged
    (not UTF-8, a NUL byte, a path separator: not a name this module writes)."""
    try:
        with open(os.path.join(root, "latest"), "rb") as f:
            name = f.read(4096).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if name and "\0" not in name and os.sep not in name else None


def latest_checkpoint(root: str) -> Optional[str]:
    """The checkpoint ``ROOT/latest`` names, if it exists in a known format (no checksums read)."""
    name = _latest_name(root)
    path = os.path.join(root, name) if name else None
    return path if path and checkpoint_format(path) is not None else None


def candidates(root: str) -> List[str]:
    """Checkpoints to resume from, best first: the one ``latest`` names, then every other
    ``step-<N>`` directory, newest first (``tmp-*`` directories are unfinished: never)."""
    out: List[str] = []
    name = _latest_name(root)
    first = os.path.join(root, name) if name else None
    if first is not None and os.path.isdir(first):
        out.append(first)
    try:
        names = os.listdir(root)
    except OSError:
        return out
    steps = sorted((d for d in names if step_of(d) >= 0 and os.path.isdir(os.path.join(root, d))),
                   key=step_of, reverse=True)
    out += [os.path.join(root, d) for d in steps if os.path.join(root, d) != first]
    return out


def clear_stale(root: str) -> None:
    """Remove the ``tmp-*`` directories of saves that never finished (rank 0, no save in flight)."""
    os.makedirs(root, exist_ok=True)
    for d in os.listdir(root):
        if d.startswith("tmp-"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def write_atomic(path: str, text: str, tmp: Optional[str] = None) -> None:
    """Replace ``path`` by ``text`` at once: written and fsynced under ``tmp`` (default
    ``path.tmp``; a writer racing others names its own), then ``os.replace``: a reader finds the
    old text or the new one, never part of it."""
    tmp = tmp or f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(root: str, step: int, keep: int) -> str:
    """Rank 0, once every file of ``tmp-<step>`` is written: rename it to ``step-<step>``, point
    ``latest`` at it, keep the newest ``keep`` checkpoints. Returns the checkpoint's path."""
    tmp, final = tmp_dir(root, step), step_dir(root, step)
    old = None
    if os.path.exists(final):                         # re-saving a step: move the old one aside first
        old = f"{final}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    write_atomic(os.path.join(root, "latest"), f"step-{step}\n")
    _fsync_dir(root)
    # A directory holds one line of checkpoints whose steps grow. Those of a later step than this
    # one belong to a line this run left (it resumed from before them: they were damaged; or it
    # started afresh, train.resume=false): kept, they would outrank this run's own in retention
    # and in a later resume.
    names = [d for d in os.listdir(root) if step_of(d) >= 0 and d != f"step-{step}"]
    for d in names:
        if step_of(d) > step:
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    olds = sorted((d for d in names if step_of(d) < step), key=step_of)
    for d in olds[: max(0, len(olds) - (keep - 1))]:
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    return final
