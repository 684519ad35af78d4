"""A run stopped cleanly by a signal (``train.stop_signals``): the handlers, and the ranks'
agreement on the step to stop at.

A signal's default action kills the process wherever it is: no checkpoint of the steps since
the last one, the checkpoint lease left to time out. Under :class:`StopSignals` the listed
signals only record themselves; the trainer looks at the record between steps. With one rank
it stops after the step in progress. With several, each rank may get the signal at another
step (or only some ranks get it), so the ranks exchange it at the steps where they already
exchange the loss, every ``train.log_every`` steps (:func:`agreed_signal`, one more small
AllReduce there, only when the setting lists signals): all stop after the same step,
write one checkpoint there and exit with 128 + the signal's number, the status the signal would
have given. A second signal while stopping kills at once (the default action), as a second
Ctrl-C does.

Handlers run in the main thread between Python operations: a rank inside a long call reacts
when it returns. A collective with a rank that died fails at once (gloo's sockets close; the
shared-memory exchange checks its peers' pids, neo/distributed/shm.py), so when torchrun
restarts a job after a worker died, the others end without waiting for its kill. torchrun waits
``--shutdown-timeout`` seconds (30 by default) after its SIGTERM before it kills the workers.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

__all__ = ["StopSignals", "agreed_signal", "signal_name"]


class StopSignals:
    """While entered, the signals named (``SIGTERM``...) set :attr:`received` instead of acting;
    on exit the previous handlers are back. Nothing is installed for an empty list. Handlers can
    only be set from the main thread: a list given elsewhere is a RuntimeError."""

    def __init__(self, names: List[str]):
        self.names = list(names)
        self.received: Optional[int] = None
        """The number of the first signal received, None before one came."""
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if not self.names:
            return self
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"train.stop_signals {self.names}: signal handlers can only be set in the main "
                               "thread; run fit() there or leave train.stop_signals empty")
        for name in self.names:
            num = int(getattr(signal, name))
            self._previous[num] = signal.signal(num, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for num, handler in self._previous.items():
            signal.signal(num, handler)
        self._previous.clear()

    def _handle(self, num: int, frame) -> None:
        if self.received is not None:            # the second: act as the signal's default action
            signal.signal(num, signal.SIG_DFL)
            os.kill(os.getpid(), num)
            return
        self.received = num


def agreed_signal(local: Optional[int], group) -> Optional[int]:
    """The signal every rank stops for: the largest number received by any rank of ``group``
    (None if none did; ``group`` None: this process alone). Collective."""
    if group is None:
        return local
    t = torch.tensor([local or 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t) or None


def signal_name(num: int) -> str:
    return signal.Signals(num).name
