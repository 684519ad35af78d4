"""Ordered, bounded parallel map over worker threads or processes (Criteo parser, generator)."""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

__all__ = ["ordered_map", "EXECUTORS"]

EXECUTORS = ("thread", "process")


def ordered_map(fn: Callable[[Any], Any], tasks: Iterable[Tuple[Any, Any]], workers: int,
                initializer: Optional[Callable[..., None]] = None, initargs: tuple = (),
                executor: str = "thread") -> Iterator[Tuple[Any, Any]]:
    """Yield ``(tag, fn(task))`` for ``(tag, task)`` in input order.

    ``workers <= 1`` runs in this thread. Otherwise ``workers`` threads (``executor="thread"``: the
    heavy work, Arrow's CSV reader and numpy, releases the GIL, and nothing is copied between
    processes) or spawned processes (``"process"``: ``fn`` and ``initializer`` must be importable
    module-level functions), with at most ``2 * workers`` tasks in flight, so memory stays bounded
    whatever the length of ``tasks``.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        for tag, task in tasks:
            yield tag, fn(task)
        return
    pool: Executor
    if executor == "thread":
        if initializer is not None:
            initializer(*initargs)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neo-data")
    else:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                   initializer=initializer, initargs=initargs)
    with pool:
        inflight: deque = deque()
        try:
            for tag, task in tasks:
                inflight.append((tag, pool.submit(fn, task)))
                if len(inflight) >= 2 * workers:
                    t, fut = inflight.popleft()
                    yield t, fut.result()
            while inflight:
                t, fut = inflight.popleft()
                yield t, fut.result()
        finally:
            for _, fut in inflight:
                fut.cancel()
