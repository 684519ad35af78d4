"""Heartbeats in the rendezvous store: which rank stopped, when a collective times out.

A collective that times out only knows it waited too long (gloo's message names no peer). So
that the error can name the rank at fault, every rank runs a small daemon thread that writes
``neo/heartbeat/<rank> = {"t": wall time, "step": N, "phase": name}`` into the job's
rendezvous store once a second. When a collective fails, :meth:`Heartbeat.diagnose` reads every
rank's last beat: a rank whose beat is older than a few intervals has stopped (killed,
SIGSTOPped, swapped out, its node gone); a rank still beating is named with the step and
phase it is in (e.g. waiting in another collective). Reading uses a store client of its own
with a short timeout, so a store that no longer answers (its host rank stopped) is reported,
not waited on.

The beat costs one small store write per second per rank; the training loop only sets two
attributes per step.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from typing import Callable, List, Optional

import torch.distributed as dist

__all__ = ["Heartbeat"]

_KEY = "neo/heartbeat/{}"


class Heartbeat:
    """This rank's beat, and the diagnosis of everyone's (see module doc).

    Args:
        store: the rendezvous store (``None``: the default process group's).
        rank, world_size: this rank and W.
        interval_s: seconds between beats.
        phase: returns the name of what the rank is doing now (e.g. the innermost phase timer).
    """

    def __init__(self, store, rank: int, world_size: int, interval_s: float = 1.0,
                 phase: Optional[Callable[[], str]] = None):
        self.rank, self.world_size, self.interval_s = rank, world_size, interval_s
        self.step = 0
        """Set by the training loop every step."""
        self._phase = phase or (lambda: "")
        self._store = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if world_size <= 1:
            return
        try:
            base = store if store is not None else dist.distributed_c10d._get_default_store()
            self._store = base.clone()
            self._store.set_timeout(datetime.timedelta(seconds=max(2.0, 2 * interval_s)))
        except Exception:  # noqa: BLE001 - no store (e.g. a HashStore job): no heartbeats, plain errors
            self._store = None
            return
        self._beat()
        self._thread = threading.Thread(target=self._run, name="neo-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self._store.set(_KEY.format(self.rank), json.dumps({"t": time.time(), "step": self.step,
                                                            "phase": self._phase()}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store is gone (job ending): stop beating
                return

    def close(self) -> None:
        """Stop beating and wait for a beat in progress (bounded by the store's timeout): a daemon
        thread left inside the store's C++ client while the process exits can abort it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 3 * self.interval_s))
            self._thread = None

    def diagnose(self) -> str:
        """One sentence per other rank that looks at fault (stopped, or elsewhere), for an error message."""
        if self._store is None:
            return "no heartbeats to tell which rank stopped"
        now = time.time()
        stale, elsewhere, ok = [], [], []
        try:
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                key = _KEY.format(r)
                if not self._store.check([key]):
                    stale.append(f"rank {r} never sent a heartbeat")
                    continue
                beat = json.loads(self._store.get(key))
                age = now - float(beat["t"])
                where = f"step {beat['step']}" + (f", {beat['phase']}" if beat.get("phase") else "")
                if age > 3 * self.interval_s + 1.0:
                    stale.append(f"rank {r} has sent no heartbeat for {age:.0f} s (it has stopped or died; "
                                 f"last at {where})")
                elif int(beat["step"]) != self.step:
                    elsewhere.append(f"rank {r} is alive at {where}")
                else:
                    ok.append(r)
        except Exception as e:  # noqa: BLE001 - the store's host has stopped
            return (f"the rendezvous store does not answer ({e.__class__.__name__}): the rank or agent hosting "
                    "it (rank 0, or torchrun's agent) has probably stopped")
        parts: List[str] = stale + elsewhere
        if not parts:
            return f"ranks {ok} are alive at the same step (a collective issued in a different order?)"
        return "; ".join(parts)
