"""The parameter-server role of WSP and the workers' link to it: wave pushes, the update log, pulls.

Rank 0 hosts the server on a thread of its own (:class:`ParameterServer`), besides its worker.
Traffic goes over torch.distributed point-to-point on a gloo group of its own (``ps_group``: no
collective of training or evaluation ever shares it); clocks and versions are keys of a c10d
store (:class:`WaveClock`), on which workers wait.

A worker's **push** of wave c holds the sum of its wave's dense gradients and, per local step,
its batch's sparse ids with the gradient of its pooled embeddings ``(B, F * D)``. When all W
workers have pushed wave c the server **aggregates** it, in worker order::

    dense   = sum_k  g_k * (1 / (W * n_k))                  n_k: worker k's local steps in the wave
    sparse  = every worker's bags, feature-major, worker 0's first (a batch of M = sum_k n_k B bags)
    grads   = the matching rows of the pooled gradients, each scaled by 1 / (W * n_k)   (M, F * D)

(with one step per wave exactly what DDP's AllReduce and the sharded collection's 1/W scale give
a synchronous step), appends it to the **log** as version c + 1 and sets the store keys
``wsp/applied/<c>`` and ``wsp/version``. A worker **pulls** the log entries it has not applied
and applies them in order (:mod:`neo.async_train.wsp`); an entry is dropped once every worker has
pulled it, so the log holds at most ``staleness + 1`` waves.

Wire format, ``ps_group``, worker k -> rank 0: a header ``int64[4] = [kind, a, b, nbytes]`` (tag 1),
then for a push ``nbytes`` of ``torch.save`` output (tag 2); kinds PUSH (a = wave), PULL
(versions [a, b)), DONE. Rank 0 answers a pull with ``int64[4] = [0, a, b, nbytes]`` (tag 3) and
the bytes (tag 4). Rank 0's own worker calls the server directly.
"""

from __future__ import annotations

import datetime
import io
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["WaveClock", "WaveStop", "ParameterServer", "ServerLink", "RemoteLink", "make_stores", "aggregate"]

PUSH, PULL, DONE = 1, 2, 3
_HDR, _PUSH_DATA, _REPLY_HDR, _REPLY_DATA = 1, 2, 3, 4


def make_stores(rank: int, world_size: int, group, timeout: datetime.timedelta):
    """(this worker's store, the server's store or None): clients of one c10d store that every
    rank shares, a TCPStore on rank 0 (a free port, told to the others over ``group``; host
    ``MASTER_ADDR``), or a HashStore in one process. Rank 0's server thread gets a client of its
    own: a client's requests are serialized, so one blocked in ``wait`` would hold back the
    server's ``set`` of the very key it waits for."""
    if world_size == 1:
        store = dist.HashStore()
        return store, store
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    server = dist.TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False) if rank == 0 else None
    port = [server.port if server is not None else None]
    dist.broadcast_object_list(port, src=0, group=group)
    return dist.TCPStore(host, int(port[0]), world_size, False, timeout=timeout), server


class WaveClock:
    """Clocks and versions as store keys.

    ``wsp/clock/<rank>``: waves rank has pushed (its clock); ``wsp/applied/<c>``: set once wave c
    is aggregated; ``wsp/version``: waves aggregated so far. Worker k may start its wave c (having
    pushed c waves) once ``version >= c - staleness``: at most ``staleness`` waves ahead of the
    slowest worker, whose clock is the version. ``base``: the version a resumed run starts at
    (waves before it were aggregated by the run that wrote its checkpoint)."""

    def __init__(self, store, timeout: datetime.timedelta, base: int = 0):
        self.store, self.timeout, self.base = store, timeout, base

    def init(self) -> None:
        self.store.set("wsp/version", str(self.base))

    def set_clock(self, rank: int, clock: int) -> None:
        self.store.set(f"wsp/clock/{rank}", str(clock))

    def applied(self, wave: int) -> None:
        self.store.set(f"wsp/applied/{wave}", "1")
        self.store.set("wsp/version", str(wave + 1))

    def version(self) -> int:
        return int(self.store.get("wsp/version"))

    def wait_version(self, version: int, stop: Optional[Callable[[], bool]] = None) -> None:
        """Block until ``version`` waves are aggregated (the store's wait, bounded by the timeout).

        ``stop``: while waiting, asked every millisecond (the key polled instead of waited on);
        when it says yes, :class:`WaveStop` is raised: a worker signalled while it waits for the
        others stops at once, not after their next wave and one more of its own. (No worker waits
        for a wave that a stopping one never pushes: a worker stops at a wave's start, after
        pushing the wave in progress, and a waiter needs at most that one.)"""
        if version <= self.base:
            return
        key = f"wsp/applied/{version - 1}"
        if stop is None:
            self.store.wait([key], self.timeout)
            return
        deadline = time.monotonic() + self.timeout.total_seconds()
        while not self.store.check([key]):
            if stop():
                raise WaveStop()
            if time.monotonic() > deadline:
                from neo.distributed.comms import CollectiveError

                raise CollectiveError(f"wsp: version {version} was not aggregated within {self.timeout}: a "
                                      "worker stalled or died")
            time.sleep(0.001)

    # ------------------------------------------------------------------ stopping (train.stop_signals)
    def request_stop(self, signum: int) -> None:
        """Every worker stops at its next wave (or wait): a signal of train.stop_signals came."""
        if not self.store.check(["wsp/stop"]):
            self.store.set("wsp/stop", str(signum))

    def stop_requested(self) -> Optional[int]:
        return int(self.store.get("wsp/stop")) if self.store.check(["wsp/stop"]) else None

    def set_stopped(self, rank: int, clock: int) -> None:
        """``rank`` stopped after pushing ``clock`` waves."""
        self.store.set(f"wsp/stopped/{rank}", str(clock))

    def stopped_clocks(self, world_size: int) -> List[int]:
        """Every worker's clock once all have stopped (the store's wait, bounded by the timeout)."""
        keys = [f"wsp/stopped/{r}" for r in range(world_size)]
        self.store.wait(keys, self.timeout)
        return [int(self.store.get(k)) for k in keys]


class WaveStop(Exception):
    """Raised in a worker's wait when the run is stopping (train.stop_signals)."""


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def aggregate(wave: int, pushes: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Wave ``wave``'s update from every worker's push, in worker order (module docstring)."""
    W = len(pushes)
    dense: Optional[torch.Tensor] = None
    keys = tuple(pushes[0]["keys"])
    F = len(keys)
    values: List[List[torch.Tensor]] = [[] for _ in range(F)]
    lengths: List[List[torch.Tensor]] = [[] for _ in range(F)]
    weights: List[List[torch.Tensor]] = [[] for _ in range(F)]
    rows, bags = [], 0
    for p in pushes:
        scale = 1.0 / (W * p["steps"])
        g = torch.mul(p["dense"], scale)
        dense = g if dense is None else dense.add_(g)
        for (v, ln, w, B), grad in zip(p["batches"], p["grads"]):
            per = ln.view(F, B)                                          # (F, B) bag lengths
            counts = per.sum(1).tolist()
            for f, (vf, wf) in enumerate(zip(torch.split(v, counts), torch.split(w, counts) if w is not None
                                             else [None] * F)):
                values[f].append(vf)
                lengths[f].append(per[f])
                if wf is not None:
                    weights[f].append(wf)
            rows.append(torch.mul(grad, scale))                          # (B, F * D)
            bags += B
    has_w = any(weights)
    return {"wave": wave, "dense": dense, "keys": keys, "batch_size": bags,
            "values": torch.cat([x for f in values for x in f]),
            "lengths": torch.cat([x for f in lengths for x in f]),
            "weights": torch.cat([x for f in weights for x in f]) if has_w else None,
            "grads": torch.cat(rows)}


class ParameterServer:
    """The server's state (rank 0): pushes of waves not yet complete, the log, the clocks.

    ``record``: each push is noted as ``(unix time, worker, wave, clocks after it)`` in
    :attr:`events` (the run log's ``wsp_clock`` records)."""

    def __init__(self, world_size: int, clock: WaveClock, group=None, trace=None):
        self.W, self.clock, self.group, self.trace = world_size, clock, group, trace
        self.clocks = [clock.base] * world_size              # a resumed run starts every worker at its base
        self.pulled = [clock.base] * world_size              # next version each worker needs
        self.version = clock.base
        self.events: List[tuple] = []
        self.error: Optional[BaseException] = None
        self._pending: Dict[int, Dict[int, Dict[str, Any]]] = {}
        self._log: Dict[int, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ state
    def push(self, worker: int, wave: int, payload: Dict[str, Any]) -> None:
        with self._lock:
            if wave != self.clocks[worker]:
                raise RuntimeError(f"wsp: worker {worker} pushed wave {wave}, expected {self.clocks[worker]}")
            self.clocks[worker] = wave + 1
            self.events.append((time.time(), worker, wave, list(self.clocks)))
            got = self._pending.setdefault(wave, {})
            got[worker] = payload
            if len(got) < self.W:
                return
            del self._pending[wave]
            self._log[wave] = aggregate(wave, [got[k] for k in range(self.W)])
            self.version = wave + 1
            self.clock.applied(wave)                         # under the lock: versions never go back

    def pull(self, worker: int, first: int, last: int) -> List[Dict[str, Any]]:
        """Log entries ``first .. last - 1`` (wave numbers), in order; forgets what all have pulled."""
        with self._lock:
            if last > self.version:
                raise RuntimeError(f"wsp: worker {worker} pulled up to version {last}, only {self.version} exist")
            out = [self._log[w] for w in range(first, last)]
            self.pulled[worker] = max(self.pulled[worker], last)
            for w in [w for w in self._log if w < min(self.pulled)]:
                del self._log[w]
        return out

    @property
    def log_size(self) -> int:
        return len(self._log)

    # ------------------------------------------------------------------ serving remote workers
    def start(self) -> None:
        """Serve ranks 1 .. W-1 on a thread until each has said DONE."""
        if self.W > 1:
            self._thread = threading.Thread(target=self._serve, name="neo-wsp-server", daemon=True)
            self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"wsp: the parameter server failed: {self.error!r}") from self.error

    def _serve(self) -> None:
        done = 0
        try:
            while done < self.W - 1:
                hdr = torch.zeros(4, dtype=torch.int64)
                src = dist.recv(hdr, src=None, group=self.group, tag=_HDR)
                kind, a, b, n = (int(x) for x in hdr)
                span = self.trace.span if self.trace is not None else None
                if kind == PUSH:
                    data = torch.empty(n, dtype=torch.uint8)
                    dist.recv(data, src=src, group=self.group, tag=_PUSH_DATA)
                    if span is None:
                        self.push(src, a, _from_bytes(data))
                    else:
                        with span("ps_push", "ps", worker=src, wave=a):
                            self.push(src, a, _from_bytes(data))
                elif kind == PULL:
                    data = _to_bytes(self.pull(src, a, b))
                    dist.send(torch.tensor([0, a, b, data.numel()], dtype=torch.int64), dst=src, group=self.group,
                              tag=_REPLY_HDR)
                    dist.send(data, dst=src, group=self.group, tag=_REPLY_DATA)
                elif kind == DONE:
                    done += 1
                else:
                    raise RuntimeError(f"wsp: unknown message kind {kind} from rank {src}")
        except BaseException as e:  # noqa: BLE001 - reported by join() and by the workers' timeouts
            self.error = e


class ServerLink:
    """Rank 0's worker: the server in this process."""

    def __init__(self, server: ParameterServer, rank: int = 0):
        self.server, self.rank = server, rank

    def push(self, wave: int, payload: Dict[str, Any]) -> None:
        if self.server.error is not None:
            raise RuntimeError(f"wsp: the parameter server failed: {self.server.error!r}")
        self.server.push(self.rank, wave, payload)

    def pull(self, first: int, last: int) -> List[Dict[str, Any]]:
        return self.server.pull(self.rank, first, last)

    def done(self) -> None:
        pass


class RemoteLink:
    """Ranks 1 .. W-1: point-to-point messages to rank 0 (module docstring)."""

    def __init__(self, group=None):
        self.group = group

    def _header(self, kind: int, a: int, b: int, n: int) -> None:
        dist.send(torch.tensor([kind, a, b, n], dtype=torch.int64), dst=0, group=self.group, tag=_HDR)

    def push(self, wave: int, payload: Dict[str, Any]) -> None:
        data = _to_bytes(payload)
        self._header(PUSH, wave, 0, data.numel())
        dist.send(data, dst=0, group=self.group, tag=_PUSH_DATA)

    def pull(self, first: int, last: int) -> List[Dict[str, Any]]:
        self._header(PULL, first, last, 0)
        hdr = torch.zeros(4, dtype=torch.int64)
        dist.recv(hdr, src=0, group=self.group, tag=_REPLY_HDR)
        data = torch.empty(int(hdr[3]), dtype=torch.uint8)
        dist.recv(data, src=0, group=self.group, tag=_REPLY_DATA)
        return _from_bytes(data)

    def done(self) -> None:
        self._header(DONE, 0, 0, 0)
