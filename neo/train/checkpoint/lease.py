"""The lease on a checkpoint directory: one run writes ``train.checkpoint_dir`` at a time.

Two runs writing one directory would delete each other's work (rank 0's ``clear_stale``
removes the other's ``tmp-<N>`` in flight, a commit removes checkpoints of later steps and
prunes by retention), so the run that writes a directory holds ``ROOT/lease.json``::

    {"run_id": ..., "host": ..., "pid": ..., "started": ..., "renewed": ..., "timeout_s": ...,
     "token": ..., "pid_ns": ...}

(times: wall clock, seconds since the epoch; ``token``: this acquisition's, so that a holder
tells its own lease from a later one of the same run; ``pid_ns``: the holder's pid namespace,
so that containers sharing a host name do not judge each other's pids). Rank 0 acquires it when the trainer
sets up its checkpointer, renews it every ``timeout / 4`` from a daemon thread, and removes it
when the run ends.

Run identity: ``TORCHELASTIC_RUN_ID`` when torchrun set one (not ``none``): an elastic restart
of the same job, on this host or another, takes its lease over at once; otherwise the host and
pid of rank 0. A lease of another run is stale (taken over, and said) when its process is gone
(same host and pid namespace, ``os.kill(pid, 0)`` finds no process) or it was not renewed for
the timeout (the larger of this run's and the holder's); otherwise the new run is refused with a
:class:`CheckpointError`.

Acquiring: the file is created with ``O_CREAT | O_EXCL``, so of runs starting at the same
moment exactly one creates it. A stale one is taken over in three moves: a claim on that very
version of the file (``lease.json.claim-<digest of its text>``, created with ``O_EXCL``: one
contender per version, so none can move aside a newer lease another contender just made), a
move aside (``os.rename`` to a name of the contender's own, then checked to be the text judged
stale), and a new lease created with ``O_EXCL`` as above. A renewal replaces the file through a
temporary file and ``os.replace`` after checking that it is still this run's; a renewal that
finds another run's lease stops and reports the loss, and so does one that finds the file gone
with no contender's claim left (another run took it over and has released it since: the file is
only ever absent under a claim while a contender moves it aside). What remains unguarded is a holder that
acts in the instant its stale lease is taken over (it renews after pausing for longer than the
timeout): its next renewal finds the other lease and says so. Wall clocks of the hosts sharing
a directory must agree to well within the timeout.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from neo.train.checkpoint.layout import CheckpointError, write_atomic

__all__ = ["CheckpointLease", "LEASE_FILE", "LeaseRecord", "lease_path", "run_identity"]

LEASE_FILE = "lease.json"
"""The lease's name in the checkpoint directory (not ``step-*``/``tmp-*``: the layout ignores it)."""

_ATTEMPTS = 20
"""Acquisition rounds before giving up (each round is lost only to another contender's move)."""

_CLAIM_S = 10.0
"""A claim on a stale lease (``lease.json.claim-<digest>``: one contender at a time takes over one
version of the file) older than this was left by a contender that died during the takeover."""

_READ_RETRIES = 10
"""Reads of a lease file that is empty or partial (a contender between its ``O_EXCL`` create and
its write) before it is judged by its modification time alone."""


def lease_path(root: str) -> str:
    return os.path.join(root, LEASE_FILE)


def run_identity() -> str:
    """This run's id: torchrun's ``TORCHELASTIC_RUN_ID`` (shared by every restart of the job),
    else ``host:pid`` of this process (rank 0)."""
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if rid and rid.lower() != "none":
        return rid
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_namespace() -> Optional[str]:
    """This process's pid namespace (Linux), so that two containers sharing a host name do not
    judge each other's pids; None where unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
    if pid <= 0:                                          # kill(0 or -1) would signal groups: unknown
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                                       # EPERM: it exists, someone else's
        return True
    return True


@dataclass
class LeaseRecord:
    """The contents of ``lease.json``."""

    run_id: str
    host: str
    pid: int
    started: float
    renewed: float
    timeout_s: float = 0.0
    token: str = ""
    pid_ns: Optional[str] = None

    @classmethod
    def from_text(cls, text: str) -> Optional["LeaseRecord"]:
        """The record of a lease file's text, None when it is not one (empty, partial, foreign)."""
        try:
            d = json.loads(text)
            record = cls(run_id=str(d["run_id"]), host=str(d["host"]), pid=int(d["pid"]),
                         started=float(d.get("started", d["renewed"])), renewed=float(d["renewed"]),
                         timeout_s=float(d.get("timeout_s") or 0.0), token=str(d.get("token", "")),
                         pid_ns=d.get("pid_ns"))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        finite = math.isfinite(record.renewed) and math.isfinite(record.timeout_s)
        return record if finite else None

    def to_text(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    def describe(self) -> str:
        return f"run {self.run_id} (host {self.host}, pid {self.pid})"


def _read_text(path: str) -> Optional[str]:
    """The file's text, None when it does not exist."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _read_settled(path: str) -> Optional[str]:
    """The lease file's text (None: no file), waiting briefly while it is empty or partial (just
    created by a contender, or put back by one)."""
    text = None
    for i in range(_READ_RETRIES):
        text = _read_text(path)
        if text is None or LeaseRecord.from_text(text) is not None:
            return text
        time.sleep(0.02 * (i + 1))
    return text


def _claim(path: str) -> bool:
    """Create the claim file ``path`` (``O_EXCL``): True for the one contender that creates it.
    Another contender waits for it to go (a claim is held for milliseconds), then gets False and
    judges the lease again; a claim older than ``_CLAIM_S`` (its contender died) is removed."""
    deadline = time.monotonic() + _CLAIM_S
    while True:
        try:
            _create_exclusive(path, "")
            return True
        except FileExistsError:
            pass
        try:
            if time.time() - os.stat(path).st_mtime > _CLAIM_S:
                _remove(path)
                continue
        except FileNotFoundError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _create_exclusive(path: str, text: str) -> None:
    """Create ``path`` holding ``text``; FileExistsError when it exists (``O_EXCL``: atomic)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointLease:
    """The lease of one run on ``root`` (see the module doc). Rank 0 only.

    Args:
        root: the checkpoint directory (created if missing).
        timeout_s: ``train.checkpoint_lease_s``: a lease not renewed for this long is stale;
            renewed every quarter of it.
        run_id: this run's id (default :func:`run_identity`).
        on_lost: called once, from the renewal thread, with a message if another run took the
            lease over while this one held it (this run was stopped or cut off for the timeout).
    """

    def __init__(self, root: str, timeout_s: float = 60.0, run_id: Optional[str] = None,
                 on_lost: Optional[Callable[[str], None]] = None):
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        self.root, self.path, self.timeout_s = root, lease_path(root), float(timeout_s)
        self.run_id = run_id or run_identity()
        self.host, self.pid, self.pid_ns = socket.gethostname(), os.getpid(), _pid_namespace()
        self.on_lost = on_lost
        self._record: Optional[LeaseRecord] = None
        self._lost: Optional[str] = None              # why the lease was lost, once it was
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lease (acquired, neither released nor lost)."""
        return self._record is not None

    # ------------------------------------------------------------------ acquire
    def acquire(self) -> Optional[str]:
        """Take the lease and start renewing it. Returns None, or one line saying whose stale
        lease was taken over and why. Raises :class:`CheckpointError` while another run holds it."""
        if self.held:
            return None
        os.makedirs(self.root, exist_ok=True)
        note = None
        for _ in range(_ATTEMPTS):
            now = time.time()
            record = LeaseRecord(self.run_id, self.host, self.pid, now, now, self.timeout_s, uuid.uuid4().hex,
                                 self.pid_ns)
            try:
                try:
                    _create_exclusive(self.path, record.to_text())
                except FileExistsError:
                    note = self._take_over_stale() or note
                    continue
            except OSError as e:
                raise CheckpointError(f"{self.path}: the lease on the checkpoint directory cannot be written "
                                      f"({e.strerror or e})") from None
            self._hold(record)
            return note
        raise CheckpointError(f"{self.root}: the lease on the checkpoint directory changed hands {_ATTEMPTS} times "
                              "while this run tried to take it: other runs are starting on it; give each run "
                              "its own train.checkpoint_dir")

    def _take_over_stale(self) -> Optional[str]:
        """The lease file exists: move it aside if it is stale (returning what is said), raise
        :class:`CheckpointError` if it is live. None: it changed meanwhile (try again)."""
        text = _read_settled(self.path)
        if text is None:
            return None                                    # released meanwhile: create it
        holder = LeaseRecord.from_text(text)
        try:
            why = self._why_stale(holder)
            if why is None:
                raise CheckpointError(self._refusal(holder))
        except FileNotFoundError:
            return None                                    # released meanwhile: create it
        claim = f"{self.path}.claim-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        if not _claim(claim):
            return None                                    # another contender is taking this one over
        try:
            if _read_text(self.path) != text:
                return None                                # taken over (or renewed) before the claim
            aside = f"{self.path}.stale-{uuid.uuid4().hex}"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return None
            moved = _read_text(aside)
            if moved != text:        # its holder renewed it just now (it was late, not gone): put it back
                try:
                    _create_exclusive(self.path, moved or "")
                except FileExistsError:
                    pass
                _remove(aside)
                return None
            _remove(aside)
        finally:
            _remove(claim)
        who = holder.describe() if holder is not None else "an unreadable lease"
        return f"neo train: took over the lease on {self.root} of {who}: {why}"

    def _why_stale(self, holder: Optional[LeaseRecord]) -> Optional[str]:
        """Why the lease ``holder`` (None: unreadable file) may be taken over; None when it may not."""
        now = time.time()
        if holder is None:
            age = now - os.stat(self.path).st_mtime
            return f"unreadable and not written for {age:.0f} s" if age > self.timeout_s else None
        if holder.run_id == self.run_id:
            return f"it is this run's own (run id {self.run_id}): restarted"
        same_host = holder.host == self.host and (holder.pid_ns is None or self.pid_ns is None
                                                  or holder.pid_ns == self.pid_ns)
        if same_host and not _pid_alive(holder.pid):
            return f"its process {holder.pid} no longer exists on {holder.host}"
        timeout = max(self.timeout_s, holder.timeout_s)
        age = now - holder.renewed
        if age > timeout:
            return f"not renewed for {age:.0f} s (timeout {timeout:g} s)"
        return None

    def _refusal(self, holder: Optional[LeaseRecord]) -> str:
        """The message of a refused run."""
        if holder is None:
            age = time.time() - os.stat(self.path).st_mtime
            who = f"an unreadable lease file written {max(age, 0.0):.0f} s ago"
        else:
            who = f"{holder.describe()}, renewed {max(time.time() - holder.renewed, 0.0):.0f} s ago"
        timeout = max(self.timeout_s, holder.timeout_s if holder is not None else 0.0)
        return (f"{self.root} is in use by another run: {self.path} is held by {who}. Two runs writing "
                "one checkpoint directory delete each other's checkpoints: give this run another "
                "train.checkpoint_dir, or stop that run (a lease not renewed for "
                f"train.checkpoint_lease_s = {timeout:g} s is taken over)")

    # ------------------------------------------------------------------ hold, renew, release
    def _hold(self, record: LeaseRecord) -> None:
        self._record, self._lost = record, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="neo-checkpoint-lease", daemon=True)
        self._thread.start()
        atexit.register(self.release)                 # a run that never reaches its end still frees it

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.timeout_s / 4):
            try:
                if not self.renew():
                    return
            except OSError:
                pass                                  # a passing file-system error: the next renewal retries

    def check(self) -> Optional[str]:
        """None while this run holds the lease (the file still carries its token), else why not:
        what a checkpoint save asks before it clears or commits anything in the directory."""
        with self._lock:
            if self._record is None:
                return self._lost or f"this run does not hold the lease on {self.root}"
            return None if self._read_own() is not False else self._lost

    def _read_own(self):
        """(Under the lock, while held.) The lease file's text if it still carries this run's
        token; False, the loss recorded and said, if another run's lease is there, or if the file
        is gone with no contender at work (a run that took it over while this one was stopped, and
        released it since, removed it); None if it stays absent while a contender's claim stays
        (a contender that died with the file moved aside: still ours, put back by the renewal).

        A contender moves a stale-looking lease aside only while holding its claim file
        (``lease.json.claim-*``), and puts it back before dropping the claim if the holder
        renewed it meanwhile: an absent file with no claim left is not a move in progress."""
        deadline = time.monotonic() + _CLAIM_S
        while True:
            text = _read_settled(self.path)
            if text is not None:
                break
            claims = _live_claims(self.root)
            if not claims:
                text = _read_settled(self.path)          # put back just before its claim went?
                if text is not None:
                    break
                self._lose(None, absent=True)
                return False
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        current = LeaseRecord.from_text(text)
        if current is None or current.token != self._record.token:
            self._lose(current)
            return False
        return text

    def _lose(self, current: Optional[LeaseRecord], absent: bool = False) -> None:
        """Another run holds the lease now (``current``; None: unreadable, or with ``absent``,
        removed by a run that held it since): stop holding it, say so."""
        self._record = None
        if absent:
            self._lost = (f"{self.path} was removed while this run held the lease (taken over and released by "
                          f"another run while this one's renewals were stopped for longer than "
                          f"train.checkpoint_lease_s = {self.timeout_s:g} s?)")
            if self.on_lost is not None:
                self.on_lost(f"neo train: warning: {self._lost}: this run commits no more checkpoints there")
            return
        holder = current.describe() if current is not None else "an unreadable lease file"
        self._lost = (f"the lease on {self.root} was taken over by {holder} while this run held it (were its "
                      f"renewals stopped for longer than train.checkpoint_lease_s = {self.timeout_s:g} s?)")
        if self.on_lost is not None:
            self.on_lost(f"neo train: warning: {self._lost}: this run commits no more checkpoints there")

    def renew(self) -> bool:
        """Write a new renewal time into the lease if it is still this run's; False (and
        ``on_lost`` told) when another run holds it now."""
        with self._lock:
            record = self._record
            if record is None or self._stop.is_set():
                return False
            text = self._read_own()
            if text is False:
                return False
            record.renewed = time.time()
            if text is None:        # moved aside by a contender and not yet put back: it is still ours
                try:
                    _create_exclusive(self.path, record.to_text())
                except FileExistsError:
                    pass                              # put back, or taken: judged at the next renewal
            else:
                write_atomic(self.path, record.to_text(), tmp=f"{self.path}.{record.token}.tmp")
            return True

    def release(self) -> None:
        """Stop renewing and remove the lease file if it is still this run's (idempotent; a no-op
        in a process forked from the holder, whose exit must not free its parent's lease)."""
        if os.getpid() != self.pid:
            return
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        atexit.unregister(self.release)
        with self._lock:
            record, self._record = self._record, None
            if record is None:
                return
            try:
                current = LeaseRecord.from_text(_read_text(self.path) or "")
                if current is not None and current.token == record.token:
                    _remove(self.path)
            except OSError as e:     # (a directory made read-only meanwhile): said, never raised over the
                print(f"neo train: warning: the lease {self.path} could not be removed ({e.strerror or e}); "
                      f"it goes stale after train.checkpoint_lease_s = {self.timeout_s:g} s",   # run's own error
                      file=sys.stderr, flush=True)


def _live_claims(root: str) -> list:
    """The claim files of contenders at work in ``root``; a claim older than ``_CLAIM_S`` (its
    contender died during a takeover) is removed, not counted (it would hold every check)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        if not name.startswith(f"{LEASE_FILE}.claim-"):
            continue
        path = os.path.join(root, name)
        try:
            if time.time() - os.stat(path).st_mtime > _CLAIM_S:
                _remove(path)
                continue
        except FileNotFoundError:
            continue
        live.append(name)
    return live


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
