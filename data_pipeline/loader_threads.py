"""Producer-thread plumbing of the loaders (:mod:`.loader`, :mod:`.mlperf_layout`): the registry of
live producer threads, the exit hook that stops them, and per-thread nice values.

One registry per process (this module is imported once): every loader's producer thread is in
``_producers`` while it runs (``ParquetLoader`` registers it), and :func:`_stop_producers`
(registered with ``atexit``) stops and joins them all before the interpreter finalizes.
:mod:`.loader` re-exports these names.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Dict, Optional

_producers: Dict[threading.Thread, threading.Event] = {}
"""Producer threads alive (every loader's), with the event that stops each."""
_producers_lock = threading.Lock()


def thread_nice() -> Optional[int]:
    """The calling thread's nice value (Linux: each thread has its own), None where unknown."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except OSError:
        return None


def set_thread_nice(value: int) -> None:
    """Set the calling thread's nice value (Linux only: elsewhere ``PRIO_PROCESS`` would take the
    whole process). Raising it needs no privilege; a refusal leaves the thread as it was."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)
    except OSError:
        pass


@atexit.register
def _stop_producers() -> None:
    """At interpreter exit, stop every producer thread and wait for it. A daemon thread still
    inside pyarrow or torch when the interpreter finalizes is killed inside C++ code, which aborts
    the process ("terminate called without an active exception", exit status 134) after a run
    that stopped early (an error, a command that read a few batches)."""
    with _producers_lock:
        running = list(_producers.items())
    for _, stop in running:
        stop.set()
    for th, _ in running:
        th.join(timeout=60)
