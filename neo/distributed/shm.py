"""AlltoAll and AllGather between the ranks of one host, through shared memory.

Gloo moves every byte of a CPU collective through TCP loopback sockets and its own I/O
threads: a kernel copy in, a kernel copy out, a thread hand-off and a wake-up per peer.
Between processes of one host a collective needs only two memory copies (into the
sender's segment, out of it into the receiver's tensor). On the 2-core CI machine, 2
ranks, AlltoAll of 0.5 / 2 / 8 MB per peer: 0.14 / 0.41 / 2.46 ms through shared memory
against 0.43 / 1.52 / 6.40 ms through gloo (``tools/bench_collectives.py``,
docs/benchmarks.md).

torch.distributed keeps rendezvous, control and everything that is not an AlltoAll or an
AllGather; this module only moves the payloads of those two, and only within a group whose
ranks share one ``/dev/shm`` with at least ``MIN_FREE_BYTES`` free (checked, not assumed:
see :meth:`ShmExchange.create`).

Protocol. Collectives on a group are issued in the same order on every rank, so the n-th
one is message ``q = n`` everywhere. Every rank owns ``SLOTS`` message slots, each a
``/dev/shm`` segment only it writes::

    slot segment:  [W x (offset, nbytes) int64 | payload chunks, 64-byte aligned]
    control (one segment for the group, one 256-byte block per rank, int64 words):
        PUBLISHED  last message this rank has written
        CONSUMED   last message this rank has read from every peer (receives complete in order)
        GEN + s    generation of slot s's segment (it grows by replacement)

- send (``_start``): wait until every peer has CONSUMED ``q - SLOTS`` (the slot's previous
  message), copy one chunk per peer into slot ``q % SLOTS`` (an AllGather's chunk once),
  write the header, then PUBLISHED = q;
- receive (``_progress``): once a peer has PUBLISHED q, copy its chunk for this rank out of
  its slot; when every peer's chunk is in, CONSUMED = q.

Every blocking point runs ``_progress`` first, so ranks that launch several collectives
before waiting on any never deadlock, whatever the number of slots. The payload is written
before the sequence number with ordinary stores, which x86-64 makes visible in program
order; the exchange is used on x86-64 Linux only.

Segments. At setup every rank creates its slot segments as sparse files of
``SEGMENT_BYTES`` (256 MiB of address space, no memory), every rank maps every peer's, and
the files are unlinked: no name is left in ``/dev/shm`` and the memory goes with the
processes. Pages are reserved (``posix_fallocate``) as messages first need them, so a full
``/dev/shm`` is a clear error rather than a SIGBUS. A message larger than its segment
replaces it with a bigger one (next generation, next power of two); the ``wait()`` of that
message returns once every peer has read it and unlinks the new file, so a file exists
only between such a growth and that wait (``close()``, garbage collection and normal exit
unlink the files of collectives never waited).

Waiting: spin briefly, then ``sched_yield`` for up to 1 ms (not when the ranks outnumber the
cores), then sleep in 50 us steps. A wait longer than the group's timeout raises
:class:`ShmTimeout`, naming the rank waited for (the runtime turns it into a
``CollectiveError``). A wait also looks every ``PEER_CHECK_S`` whether the peers' processes
still exist (their pids, exchanged at setup, where every rank sees the same pid namespace): a
peer that exited (gone, or a zombie) raises :class:`ShmPeerGone` at once, naming it, instead
of the timeout later. Before, the other ranks waited out ``train.collective_timeout_s`` (600 s
by default) unless a launcher killed them; a run stopping on a signal (``train.stop_signals``)
does not die of torchrun's SIGTERM, so it relies on this.
"""

from __future__ import annotations

import collections
import datetime
import mmap
import os
import platform
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Deque, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from neo.distributed.shm_segments import (ShmError, ShmPeerGone, ShmTimeout, _SHM_DIR, _Segment, _align, _at,
                                         _move, _pid_namespace, _process_exists, _release, _unlink_all)
from neo.machine import usable_cores

__all__ = ["ShmExchange", "ShmTimeout", "ShmPeerGone", "ShmError", "shm_supported"]

SLOTS = 4
PEER_CHECK_S = 0.1              # how often a waiting rank looks whether its peers' processes exist
SEGMENT_BYTES = 256 << 20       # virtual size of a slot segment (sparse: pages are reserved as used)
MIN_FREE_BYTES = 256 << 20      # free /dev/shm below which a rank does not offer shared memory
_BLOCK = 32                     # int64 words of control per rank (256 bytes: own cache lines)
_PUBLISHED, _CONSUMED, _GEN = 0, 8, 16


def shm_supported() -> bool:
    """Linux on x86-64 (stores seen in program order) with a writable /dev/shm of at least
    ``MIN_FREE_BYTES`` free (Docker's default 64 MiB is not: such ranks use gloo)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64") \
            or not os.access(_SHM_DIR, os.W_OK):
        return False
    st = os.statvfs(_SHM_DIR)
    return st.f_bavail * st.f_frsize >= MIN_FREE_BYTES


@dataclass
class _Receive:
    """A launched collective's receives: per peer, where its chunk goes (address, bytes) in
    ``out``, which this record keeps alive until the chunks are in; or, with ``apply``, what
    reads each peer's chunk where it lies (:meth:`ShmExchange.all_gather_apply`)."""

    q: int
    slot: int
    into: List[Tuple[int, int]]
    missing: List[int]
    out: torch.Tensor
    apply: Optional[Callable[[int, int], None]] = None


class _Work:
    """What :meth:`ShmExchange.all_to_all_single` returns: ``wait()`` like a torch Work."""

    def __init__(self, ex: "ShmExchange", q: int):
        self.ex, self.q = ex, q

    def wait(self) -> bool:
        ex, q = self.ex, self.q
        if ex._consumed < q:
            ex._block(lambda: ex._consumed >= q, ex._missing)
        if ex._unlink and ex._unlink[0][0] <= q:
            # this message brought a bigger segment: once every peer has read it (so mapped
            # the file), unlink it; no segment file outlives the wait() of its first message
            ex._block(lambda: ex._peers_consumed() >= q, lambda: f"the peers to read message {q}")
            ex._unlink_mapped()
        return True


class ShmExchange:
    """AlltoAll / AllGather among the ranks of ``group``, which share one host (module doc).

    Build with :meth:`create` (collective over ``group``), which returns None where the
    ranks do not share ``/dev/shm``. Call collectives in the same order on every rank, from
    one thread per rank (the exchange holds no lock).
    """

    def __init__(self, group, base: str, ctrl: mmap.mmap, own: List[_Segment], peer: List[List[Optional[_Segment]]],
                 timeout_s: float, pids: Optional[List[Optional[int]]] = None):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.global_rank = dist.get_rank()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.timeout_s = timeout_s
        self._pids = pids or [None] * self.size   # each rank's pid where this rank can see it
        # yield for up to 1 ms before sleeping, unless the ranks outnumber the cores (then a
        # yielding rank keeps stealing the core a working rank needs)
        self._yield_s = 1e-3 if self.size <= usable_cores() else 0.0
        self._base = base
        self._ctrl_mm = ctrl
        self._ctrl = memoryview(ctrl).cast("B").cast("q")
        self._header_bytes = _align(16 * self.size)
        self._own = own
        self._peer = peer
        for slot, seg in enumerate(own):   # before any message: peers read it after a PUBLISHED
            self._ctrl[self.rank * _BLOCK + _GEN + slot] = seg.gen
        self._seq = 0                      # messages started
        self._consumed = 0                 # messages fully received (mirror of my CONSUMED word)
        self._pending: Deque[_Receive] = collections.deque()
        self._unlink: List[tuple] = []     # (q, path) of grown segments: unlink once every peer consumed q
        self.close = weakref.finalize(self, _release, self._unlink, self._own)
        """Unlink this rank's remaining grown-segment files (those of collectives never
        waited); also runs when the exchange is collected, or at exit."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, group, timeout: Optional[datetime.timedelta] = None,
               segment_bytes: int = SEGMENT_BYTES) -> Optional["ShmExchange"]:
        """Collective over ``group``: an exchange if every rank can map every other rank's
        segments (same host, same /dev/shm), else None on every rank.

        Every rank creates its ``SLOTS`` segments (sparse files of ``segment_bytes``), every
        rank maps all of them, then every file is unlinked: in the steady state no file of
        the exchange exists, and the memory goes away with the processes."""
        W = dist.get_world_size(group)
        rank = dist.get_rank(group)
        root = dist.get_global_rank(group, 0)
        msg = [f"neo-{os.getpid()}-{secrets.token_hex(6)}", secrets.randbits(62), shm_supported()]
        dist.broadcast_object_list(msg, src=root, group=group)
        base, token, ok = msg
        ok = ok and shm_supported()
        path = lambda r, slot: os.path.join(_SHM_DIR, f"{base}-{r}-{slot}-1")  # noqa: E731
        ctrl_path = os.path.join(_SHM_DIR, f"{base}-ctrl")
        ctrl, own, mine = None, [], []
        try:
            if ok:
                try:
                    if rank == 0:
                        mine.append(ctrl_path)
                        ctrl = _Segment.open(ctrl_path, 0, W * _BLOCK * 8)
                        ctrl.reserve(W * _BLOCK * 8)
                        ctrl.header[_BLOCK - 1] = token
                        ctrl.release()
                    for slot in range(SLOTS):
                        mine.append(path(rank, slot))
                        own.append(_Segment.open(mine[-1], 1, segment_bytes))
                except OSError:
                    ok = False
            dist.barrier(group=group)
            peer: List[List[Optional[_Segment]]] = [[None] * SLOTS for _ in range(W)]
            if ok:
                try:
                    if rank != 0:
                        ctrl = _Segment.open(ctrl_path, 0)
                        ok = len(ctrl.mm) == W * _BLOCK * 8 and ctrl.header[_BLOCK - 1] == token
                    for r in range(W):
                        if r != rank:
                            peer[r] = [_Segment.open(path(r, slot), 1) for slot in range(SLOTS)]
                except OSError:
                    ok = False
            me = (ok, os.getpid(), _pid_namespace())
            infos: List[Optional[tuple]] = [None] * W
            dist.all_gather_object(infos, me, group=group)
        finally:
            # every rank that could map them has; or a peer died mid-setup (the barrier or the
            # gather raised): no file of this rank is left in /dev/shm either way
            _unlink_all([(0, p) for p in mine])
        if not all(i[0] for i in infos):
            for seg in own:
                seg.release()
            return None
        timeout_s = (timeout or datetime.timedelta(minutes=30)).total_seconds()
        pids = [pid if ns is not None and ns == me[2] else None for _, pid, ns in infos]
        return cls(group, base, ctrl.mm, own, peer, timeout_s, pids)

    # ------------------------------------------------------------------ collectives
    def all_to_all_single(self, out: torch.Tensor, send: torch.Tensor, out_splits: Sequence[int],
                          in_splits: Sequence[int]) -> _Work:
        """Like ``dist.all_to_all_single``: ``in_splits[r]`` rows of ``send`` go to rank r,
        ``out_splits[s]`` rows of ``out`` come from rank s. Both contiguous CPU tensors of one dtype.

        ``out`` may lie in ``send``'s memory, with this rank's block where it is in ``send``
        (``comms._in_place_output``): the blocks for the peers are copied into this rank's slot
        before any peer's block is received, and this rank's own block is not copied."""
        row = _row_bytes(send)
        send = send.contiguous()
        send_at = _offsets(in_splits, row)
        recv_at = _offsets(out_splits, row)
        if out.dtype != send.dtype or send_at[-1] != send.nbytes or recv_at[-1] != out.nbytes \
                or len(in_splits) != self.size or len(out_splits) != self.size or not out.is_contiguous() \
                or send.device.type != "cpu" or out.device.type != "cpu":
            raise ShmError(f"all_to_all: {self.size} splits each summing to the tensors' rows and one dtype "
                           f"expected, CPU tensors, the output contiguous; got send {tuple(send.shape)} {send.dtype} "
                           f"{send.device} split {list(in_splits)}, out {tuple(out.shape)} {out.dtype} {out.device} "
                           f"split {list(out_splits)}")
        me, sa, oa = self.rank, send.data_ptr(), out.data_ptr()
        if oa + recv_at[me] != sa + send_at[me]:                              # not in place
            _move(oa + recv_at[me], sa + send_at[me], send_at[me + 1] - send_at[me])
        chunks = [(sa + a, b - a) for a, b in zip(send_at, send_at[1:])]
        into = [(oa + a, b - a) for a, b in zip(recv_at, recv_at[1:])]
        return self._start(chunks, into, out, gather=False)

    def all_gather_single(self, out: torch.Tensor, send: torch.Tensor) -> _Work:
        """Like ``dist.all_gather_into_tensor``: ``out`` is W copies' worth, rank r's ``send`` at block r."""
        send = send.contiguous()
        n = send.nbytes
        if out.nbytes != n * self.size or not out.is_contiguous() or send.device.type != "cpu" \
                or out.device.type != "cpu":
            raise ShmError(f"all_gather: the output holds {out.nbytes} bytes on {out.device}, expected "
                           f"{self.size} x {n}, contiguous, on the CPU")
        oa, sa = out.data_ptr(), send.data_ptr()
        _move(oa + self.rank * n, sa, n)
        return self._start([(sa, n)] * self.size, [(oa + s * n, n) for s in range(self.size)], out, gather=True)

    def all_gather_apply(self, send: torch.Tensor, apply: Callable[[int, torch.Tensor], None]) -> _Work:
        """An AllGather without an output: every peer's ``send`` (of one shape and dtype on every
        rank) is handed to ``apply(peer, block)`` in rank order, ``block`` a tensor over the peer's
        slot, valid only during the call (the peer cannot reuse the slot before it returns). A
        reduction reads the peers' blocks where they lie instead of copying them out first. ``send``
        is copied into this rank's slot before this returns: ``apply`` may then overwrite it. The
        calls happen as the blocks arrive, inside this exchange's later launches and waits (the
        returned work's ``wait()`` returns once every peer's has run)."""
        send = send.contiguous()
        n = send.nbytes
        if send.device.type != "cpu":
            raise ShmError(f"all_gather_apply: a CPU tensor expected, got one on {send.device}")
        shape, dtype = send.shape, send.dtype

        def at(peer: int, addr: int) -> None:
            apply(peer, _at(addr, n).view(dtype).view(shape) if n else torch.empty(shape, dtype=dtype))
        return self._start([(send.data_ptr(), n)] * self.size, [(0, n)] * self.size, send, gather=True, apply=at)

    # ------------------------------------------------------------------ protocol
    def _word(self, rank: int, field: int) -> int:
        return self._ctrl[rank * _BLOCK + field]

    def _start(self, chunks: List[Tuple[int, int]], into: List[Tuple[int, int]], out: torch.Tensor,
               gather: bool, apply: Optional[Callable[[int, int], None]] = None) -> _Work:
        """Number the message, copy its chunks for the peers (address, bytes) into this rank's
        slot and publish it; the receives into ``into`` (within ``out``), or ``apply``'s calls
        (:class:`_Receive`), progress later."""
        self._seq += 1
        q, slot = self._seq, self._seq % SLOTS
        if self._pending:                  # receives progress at every launch (frees the peers' slots)
            self._progress()
        for r in self.peers:               # the slot's previous message has been read by everyone
            if self._word(r, _CONSUMED) < q - SLOTS:
                self._block(lambda r=r: self._word(r, _CONSUMED) >= q - SLOTS,
                            lambda r=r: f"rank {self._global(r)} to read message {q - SLOTS}")
        self._unlink_mapped()
        payload = chunks[self.rank][1] if gather else sum(_align(chunks[r][1]) for r in self.peers)
        seg = self._own_segment(slot, q, self._header_bytes + _align(payload))
        base, header, off = seg.addr, seg.header, self._header_bytes
        for r in self.peers:
            src, n = chunks[r]
            if n and (not gather or r == self.peers[0]):
                _move(base + off, src, n)
            header[2 * r], header[2 * r + 1] = off, n
            if not gather:
                off += _align(n)
        self._ctrl[self.rank * _BLOCK + _PUBLISHED] = q
        self._pending.append(_Receive(q, slot, into, list(self.peers), out, apply))
        return _Work(self, q)

    def _own_segment(self, slot: int, q: int, need: int) -> _Segment:
        seg = self._own[slot]
        if len(seg.mm) < need:            # past the sparse segment: a bigger one, announced by generation
            gen = seg.gen + 1
            seg.release()
            path = self._path(self.rank, slot, gen)
            seg = self._own[slot] = _Segment.open(path, gen, 1 << (need - 1).bit_length())
            self._ctrl[self.rank * _BLOCK + _GEN + slot] = gen
            self._unlink.append((q, path))
        seg.reserve(need)
        return seg

    def _peer_segment(self, src: int, slot: int) -> _Segment:
        gen = self._word(src, _GEN + slot)
        seg = self._peer[src][slot]
        if seg is None or seg.gen != gen:
            seg = self._peer[src][slot] = _Segment.open(self._path(src, slot, gen), gen)
        return seg

    def _progress(self) -> None:
        """Copy out every chunk that has arrived, in message order; never blocks."""
        pending, me = self._pending, self.rank
        while pending:
            rx = pending[0]
            left = []
            for s in rx.missing:
                if self._word(s, _PUBLISHED) < rx.q or (left and rx.apply is not None):   # apply: rank order
                    left.append(s)
                    continue
                seg = self._peer_segment(s, rx.slot)
                off, n = seg.header[2 * me], seg.header[2 * me + 1]
                dst, want = rx.into[s]
                if n != want:
                    raise ShmError(f"rank {self.global_rank}: message {rx.q} from rank {self._global(s)} holds {n} "
                                   f"bytes, this rank expected {want}: the ranks disagree on the splits")
                if rx.apply is not None:
                    rx.apply(s, seg.addr + off)
                elif n:
                    _move(dst, seg.addr + off, n)
            rx.missing = left
            if left:
                return
            pending.popleft()
            self._consumed = rx.q
            self._ctrl[me * _BLOCK + _CONSUMED] = rx.q

    def _block(self, done: Callable[[], bool], what: Callable[[], str]) -> None:
        """Progress receives until ``done()``; spin, then yield, then sleep; raise on timeout or
        when a peer's process is gone."""
        spins, t0, check = 0, 0.0, 0.0
        while True:
            self._progress()
            if done():
                return
            spins += 1
            if spins < 50:
                continue
            now = time.monotonic()
            if spins == 50:
                t0, check = now, now + PEER_CHECK_S
            waited = now - t0
            if waited > self.timeout_s:
                raise ShmTimeout(f"rank {self.global_rank}: shared-memory collective timed out after {waited:.0f} s "
                                 f"waiting for {what()}: that rank has probably failed or stalled")
            if now >= check:
                check = now + PEER_CHECK_S
                gone = [f"{self._global(r)} (pid {self._pids[r]})" for r in self.peers
                        if self._pids[r] is not None and not _process_exists(self._pids[r])]
                if gone:
                    raise ShmPeerGone(f"rank {self.global_rank}: shared-memory collective waiting for {what()}: "
                                      f"rank(s) {', '.join(gone)} exited")
            if waited < self._yield_s:
                os.sched_yield()
            else:
                time.sleep(5e-5)

    def _peers_consumed(self) -> int:
        return min(self._word(r, _CONSUMED) for r in self.peers)

    def _missing(self) -> str:
        """Who the oldest unfinished receive waits for (timeout messages)."""
        rx = self._pending[0]
        return f"rank(s) {[self._global(s) for s in sorted(rx.missing)]} to send message {rx.q}"

    def _unlink_mapped(self) -> None:
        if not self._unlink:
            return
        low = self._peers_consumed()
        for q, path in [u for u in self._unlink if u[0] <= low]:
            os.unlink(path)
        self._unlink[:] = [u for u in self._unlink if u[0] > low]

    def _path(self, rank: int, slot: int, gen: int) -> str:
        return os.path.join(_SHM_DIR, f"{self._base}-{rank}-{slot}-{gen}")

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.group, r)


def _row_bytes(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= int(s)
    return n * t.element_size()


def _offsets(splits: Sequence[int], row: int) -> List[int]:
    out = [0]
    for s in splits:
        out.append(out[-1] + int(s) * row)
    return out
