"""Run a function in W gloo processes on CPU: the one helper every multi-process test of Neo uses.

Example::

    from tests.multiprocess import run_multiprocess

    def _body(rank, world_size, scale):          # module level: spawn pickles it by name
        t = torch.ones(1) * rank * scale
        torch.distributed.all_reduce(t)
        return float(t)

    def test_all_reduce():
        assert run_multiprocess(_body, 2, 10.0) == [10.0, 10.0]

Each process: a fork of a server process that has imported torch and Neo once for the
whole session (multiprocessing's "forkserver": a rank starts in ~0.05 s where a spawned
interpreter takes 1.5-2.5 s to import them, and the suite starts ~150 of them), one torch
thread (``threads``), ``init_process_group``
on gloo with a short collective ``timeout`` (so a rank waiting on a dead peer fails instead of
hanging; ``fn`` starts once every rank is set up), its rendezvous a TCP store that the calling
process hosts on a port of 127.0.0.1 it binds itself (as torchrun's agent hosts its workers'
store: no rank's exit takes the store with it, and no port is chosen and released before a rank
binds it), environment
RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set as
torchrun would. A rank's environment is the caller's at the time of the call plus ``env`` (as a
spawned process's would be), its working directory and ``sys.path`` the caller's too. What the
server read at import stays the server's: a call whose environment changes a variable read at
import (``IMPORT_TIME_ENV``: Neo's and ATen's ISA, the thread pools' sizes) spawns fresh
interpreters instead. ``fn(rank, world_size, *args, **kwargs)`` runs; its return value
(anything ``torch.save`` can write) comes back in rank order.

Failures: if any rank raises, the test fails with an AssertionError that holds every
failing rank's traceback (ranks are named). After the first failure the other ranks get
``grace_s`` to finish or fail (their collectives time out); then they are terminated. The
whole run is bounded by ``timeout_s``.
"""

from __future__ import annotations

import datetime
import io
import os
import queue
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.multiprocessing as mp

__all__ = ["run_multiprocess", "child_env", "MultiProcessError", "ROOT"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository's root."""


def child_env(**overrides: str) -> Dict[str, str]:
    """The environment of a process a test starts itself (torchrun, ``python -m neo.train``): this
    process's, the repository first on ``PYTHONPATH`` (what was there kept: ``pytest --seed-shift``
    puts its folder there), and ``overrides``."""
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **overrides)


class MultiProcessError(AssertionError):
    """One or more ranks failed; the message holds their tracebacks."""

    def __init__(self, message: str, failures: Dict[int, str]):
        super().__init__(message)
        self.failures = failures


SECONDARY = ("has probably failed or stalled", "Connection closed by peer", "Connection reset by peer",
             "did not finish in time")
"""Words of a rank's failure that only echo another's: a collective broken by a peer that exited."""


def _failure_report(world_size: int, failures: Dict[int, str], summaries: Dict[int, str]) -> str:
    """The failed ranks, causes first: ranks whose error does not only echo a peer's (SECONDARY),
    each group in the order the errors arrived; the header names the first cause's exception, so
    that it survives a log cut to its first lines."""
    order = list(failures)                       # arrival order (dicts keep insertion order)
    echo = [r for r in order if any(w in failures[r] for w in SECONDARY)]
    causes = [r for r in order if r not in echo]
    ranked = causes + echo
    lead = ranked[0]
    head = summaries.get(lead, failures[lead].strip().splitlines()[-1])
    return (f"{len(failures)} of {world_size} ranks failed: {sorted(failures)}; "
            f"{'first cause' if causes else 'first to fail'}: rank {lead}: {head}\n\n"
            + "\n\n".join(failures[r] for r in ranked))


def _host_store(timeout_s: float):
    """The ranks' rendezvous store, served from this process on a port it binds itself (port 0,
    the system's choice, read back), as torchrun's agent serves its workers'. The ranks used to
    find it on a port chosen here (a socket bound to port 0, read and closed) and bound later by
    rank 0: another socket could take the port in between, and rank 0's exit ended the store under
    its peers (tests/distributed/test_distributed_helper.py checks that it no longer does)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


# Modules every rank imports, loaded once into the fork server. Some are not imported with the
# trainer's module but when it is built or runs, in every rank: torch._dynamo (DDP's constructor
# imports it), torch.distributed.checkpoint (with DTensor and sympy; the checkpoint reader and
# writer import it when used), TensorBoard (the run log) and pandas (pyarrow's first to_numpy, where
# pandas is installed; the fork server skips a module that is not). On the 2-core Zen 3 VM these were
# 1.5-2 s of each rank's start, which builds a Trainer in most tests.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch._dynamo", "torch.utils.tensorboard",
           "pandas", "neo", "neo.train.trainer")

# Variables read when those modules (or the libraries under them) load, not when used.
IMPORT_TIME_ENV = ("NEO_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                   "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "KMP_AFFINITY")

_server_env: Optional[Dict[str, Optional[str]]] = None   # IMPORT_TIME_ENV as the fork server started with it


def _context(env: Dict[str, str]):
    """The fork server's context, or spawn's where ``env`` differs from the server's at import."""
    global _server_env
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    if _server_env is None:   # the server starts (at the first start()) in this process's environment
        mp.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
        _server_env = {k: os.environ.get(k) for k in IMPORT_TIME_ENV}
    same = all(env.get(k) == v for k, v in _server_env.items())
    return mp.get_context("forkserver" if same else "spawn")


def _wait_for_every_rank_set_up(store, rank: int, world_size: int, timeout_s: float) -> None:
    """Returns once every rank's ``init_process_group`` has returned. gloo connects a pair of ranks
    from both ends: a rank can return from its setup while a peer is still connecting its pairs, and
    a rank whose ``fn`` then ends at once (or leaves its group on purpose) closes them under that
    peer, which fails in its setup ("Gloo connectFullMesh failed ... Connection closed by peer";
    tests/distributed/test_distributed_helper.py at seed shift 461) instead of where the test looks.
    Over the ranks' store (the caller's, see _host_store), not a collective: a barrier could end the
    same way."""
    store.set(f"neo_test_set_up_{rank}", "1")
    try:
        store.wait([f"neo_test_set_up_{r}" for r in range(world_size)], datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:                             # DistStoreError: a peer's setup failed or hangs
        raise RuntimeError(f"rank {rank}: a peer rank's process group setup has probably failed or stalled "
                           f"(waited {timeout_s:.0f} s for every rank's): {e}") from e


def _worker(rank: int, world_size: int, local_world_size: int, port: int, fn: Callable, args, kwargs,
            results, collective_timeout_s: float, threads: int, env: Dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank % local_world_size), LOCAL_WORLD_SIZE=str(local_world_size))
    torch.set_num_threads(threads)
    import torch.distributed as dist

    try:
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout)   # a client of the caller's (_host_store)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        _wait_for_every_rank_set_up(store, rank, world_size, collective_timeout_s)
        out = fn(rank, world_size, *args, **kwargs)
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - report everything, including KeyboardInterrupt/SystemExit
        summary = "".join(traceback.format_exception_only(type(e), e)).strip()
        results.put((rank, False, (f"rank {rank} of {world_size} failed:\n{traceback.format_exc()}", summary)))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_multiprocess(fn: Callable, world_size: int, *args: Any, local_world_size: Optional[int] = None,
                     timeout_s: float = 240.0, collective_timeout_s: float = 60.0, grace_s: Optional[float] = None,
                     threads: int = 1, env: Optional[Dict[str, str]] = None, may_die: Sequence[int] = (),
                     **kwargs: Any) -> List[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` gloo ranks; results in rank order.

    Args:
        local_world_size: ranks per simulated node (sets LOCAL_RANK / LOCAL_WORLD_SIZE); default W.
        timeout_s: bound on the whole run.
        collective_timeout_s: timeout of every collective (``init_process_group(timeout=...)``).
        grace_s: after a rank fails, how long the others may still run (default: collective timeout + 15 s).
        threads: torch intra-op threads per process.
        env: extra environment variables for the processes.
        may_die: ranks the test itself kills (e.g. to check that the others notice): their
            missing result is None instead of a failure.
    """
    L = local_world_size or world_size
    if world_size % L:
        raise ValueError(f"world_size {world_size} is not a multiple of local_world_size {L}")
    full_env = {**os.environ, **(env or {})}
    ctx = _context(full_env)
    results = ctx.Queue()
    store = _host_store(collective_timeout_s)
    port = store.port
    procs = [ctx.Process(target=_worker, name=f"neo-rank{r}", daemon=True,
                         args=(r, world_size, L, port, fn, args, kwargs, results, collective_timeout_s, threads,
                               full_env))
             for r in range(world_size)]
    for p in procs:
        p.start()
    grace = collective_timeout_s + 15.0 if grace_s is None else grace_s
    deadline = time.monotonic() + timeout_s
    outputs: Dict[int, Any] = {}
    failures: Dict[int, str] = {}      # rank -> traceback, in the order they arrived
    summaries: Dict[int, str] = {}     # rank -> its exception's own lines
    try:
        while len(outputs) + len(failures) < world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                rank, ok, payload = results.get(timeout=min(1.0, deadline - now))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if not p.is_alive() and p.exitcode not in (0, None) and r not in outputs and r not in failures]
                for r in dead:  # died without reporting (killed, segfault)
                    time.sleep(0.5)
                    if r in may_die:
                        outputs[r] = None
                    elif results.empty():
                        failures[r] = f"rank {r} exited with code {procs[r].exitcode} without a result"
                if dead and failures:
                    deadline = min(deadline, time.monotonic() + grace)
                continue
            if ok:
                outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                failures[rank], summaries[rank] = payload
                deadline = min(deadline, time.monotonic() + grace)
    finally:
        for p in procs:
            p.join(timeout=5.0 if not failures else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        del store                        # the server stops with its last reference
    missing = [r for r in range(world_size) if r not in outputs and r not in failures]
    for r in missing:
        failures[r] = f"rank {r} did not finish in time (timeout {timeout_s:.0f} s or {grace:.0f} s after another rank failed)"
    if failures:
        raise MultiProcessError(_failure_report(world_size, failures, summaries), failures)
    return [outputs[r] for r in range(world_size)]
