"""The synthetic data cache: leases on the sets in use, and eviction of the least recently used.

Each synthetic set lives in ``cache_dir/synth-<hash>`` (:func:`neo.train.data.synthetic_dir`),
one per generator option set, so the cache grows with every new setting. A process that reads a
set holds a **lease** on it for as long as it may read: a shared ``flock`` on the set's
``.lease`` file, whose modification time also records when the set was last used. After
taking its own lease, rank 0 **evicts** the least recently used other sets until the cache is
within ``data.synthetic.cache_max_gb``: a set is removed only under an exclusive lock taken
without waiting (a set leased by any process, this one's or another run's, is skipped), and it
is first renamed out of its place (``synth-<hash>.evicted-<pid>``), so a reader finds either a
complete set or none (and then generates it again). The set of the run itself is never evicted,
however large. Staging copies (``.tmp-``) and other files are not counted or touched.

Where the file system has no ``flock`` (some network file systems), leases are not held and
nothing is evicted (a message says so): the cache then grows as before; so too where a set's
``.lease`` file cannot be made (a read-only cache). What an interrupted eviction left
(``.evicted-<pid>`` folders) is removed by the next one.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

__all__ = ["SetLease", "EvictedSet", "take_lease", "evict", "set_bytes"]

LEASE_FILE = ".lease"
_SET_NAME = re.compile(r"synth-[0-9a-f]{12}")
_EVICTED_NAME = re.compile(r"synth-[0-9a-f]{12}\.evicted-[0-9]+")

_held: Dict[str, int] = {}
"""Sets this process holds leases on (real path -> count). Where flock is emulated by fcntl
locks (NFS), locks belong to the process, so its own exclusive lock would not see its own
shared ones: its eviction skips these by name."""


class SetLease:
    """A shared lock on one set (its ``.lease`` file kept open); released by :meth:`release`
    or when the object is garbage collected."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd
        self._key = os.path.realpath(path)
        _held[self._key] = _held.get(self._key, 0) + 1

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)          # closing the descriptor drops the flock
            self._fd = None
            left = _held.get(self._key, 1) - 1
            if left > 0:
                _held[self._key] = left
            else:
                _held.pop(self._key, None)

    def __del__(self) -> None:
        try:
            self.release()
        except (TypeError, AttributeError):       # at interpreter exit module globals may be gone
            pass

    def __copy__(self) -> "SetLease":
        return self                               # one lease, shared: a copy must not close it twice

    def __deepcopy__(self, memo) -> "SetLease":
        return self

    def __reduce__(self):
        raise TypeError(f"a lease on {self.path} holds a lock of this process: it cannot be pickled")


def take_lease(path: str) -> Optional[SetLease]:
    """A lease on the complete set ``path`` (its last-used time set to now), or None if ``path``
    is not (or no longer) a complete set in place: evicted meanwhile, or never finished. Raises
    OSError where the lease file cannot be made (read-only cache: the caller reads without one)."""
    lease = os.path.join(path, LEASE_FILE)
    try:
        fd = os.open(lease, os.O_RDONLY | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)                     # waits while an eviction holds it
        # an eviction may have taken the set between our open and our lock: the file we hold
        # must still be the one in place, in a finished set
        if not (_same_file(fd, lease) and os.path.exists(os.path.join(path, "summary.json"))):
            os.close(fd)
            return None
        try:
            os.utime(lease)                                # last used: now
        except OSError:
            pass                                           # a read-only cache: leased, not stamped
    except BaseException:
        os.close(fd)
        raise
    return SetLease(path, fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def set_bytes(path: str) -> int:
    """Bytes of the files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def _last_used(path: str) -> float:
    for name in (LEASE_FILE, "summary.json"):
        try:
            return os.stat(os.path.join(path, name)).st_mtime
        except FileNotFoundError:
            pass
    return 0.0


@dataclass
class EvictedSet:
    path: str
    bytes: int
    last_used: float
    """Seconds since the epoch."""


def evict(cache_dir: str, keep: str, max_bytes: int) -> List[EvictedSet]:
    """Remove the least recently used complete sets of ``cache_dir`` other than ``keep`` until
    the sets' total is at most ``max_bytes`` (or nothing else can go: the rest are leased);
    returns what was removed, oldest first."""
    names = os.listdir(cache_dir)
    for n in names:                       # what an interrupted eviction left: nobody reads it any more
        if _EVICTED_NAME.fullmatch(n):
            shutil.rmtree(os.path.join(cache_dir, n), ignore_errors=True)
    sets = [os.path.join(cache_dir, n) for n in names if _SET_NAME.fullmatch(n)]
    sets = [p for p in sets if os.path.isdir(p) and os.path.exists(os.path.join(p, "summary.json"))]
    size = {p: set_bytes(p) for p in sets}
    total = sum(size.values())
    out: List[EvictedSet] = []
    skip = {os.path.realpath(keep)} | set(_held)
    for p in sorted((p for p in sets if os.path.realpath(p) not in skip), key=_last_used):
        if total <= max_bytes:
            break
        when = _last_used(p)
        if _remove_unleased(p):
            total -= size[p]
            out.append(EvictedSet(p, size[p], when))
    return out


def _remove_unleased(path: str) -> bool:
    """Remove the set ``path`` if no process holds a lease on it (True if removed)."""
    lease = os.path.join(path, LEASE_FILE)
    try:      # for writing: where flock is emulated by fcntl locks (NFS) an exclusive one needs it
        fd = os.open(lease, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:                                        # gone already, or not ours to change
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False                                   # in use (or no locks here): keep it
        if not _same_file(fd, lease):                      # evicted and made again since we opened it
            return False
        gone = f"{path}.evicted-{os.getpid()}"
        try:
            os.rename(path, gone)                          # readers now find no set, never half of one
        except OSError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def describe(evicted: List[EvictedSet], max_bytes: int, say: Callable[[str], None]) -> None:
    for e in evicted:
        age_h = (time.time() - e.last_used) / 3600
        say(f"neo train: removed synthetic set {e.path} ({e.bytes / 2**20:.1f} MiB, last used {age_h:.1f} h ago) "
            f"to keep the cache within data.synthetic.cache_max_gb ({max_bytes / 2**30:g} GiB)")
