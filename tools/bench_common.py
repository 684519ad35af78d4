"""Helpers shared by the benchmark scripts in tools/ (run as scripts: tools/ is on sys.path)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def quiet_peer_logs() -> None:
    """Silence TorchRec's planner warnings and torch.fx notices (they would bury the result tables)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("torchrec", "torch.fx", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)


def add_system_malloc_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc malloc at its defaults (by default every rank calls "
                             "neo.host_memory.retain_freed_memory(), as `neo train` does; it applies to both systems)")


def add_no_shm_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-shm", action="store_true",
                        help="Neo's embedding AlltoAlls through gloo, like its peers' (by default through shared "
                             "memory between the ranks of one host, as `neo train` does; see neo/distributed/shm.py)")


def start_rank(threads: int, system_malloc: bool) -> None:
    """Per benchmark rank, before any work: torch threads, the host-memory policy (process-wide:
    Neo and its peers alike), and quiet peer logs."""
    import torch

    torch.set_num_threads(threads)
    if not system_malloc:
        from neo.host_memory import retain_freed_memory
        retain_freed_memory()
    quiet_peer_logs()


def write_json(path: str, payload: Any) -> None:
    """Write the benchmark's records (creating the folder) and say where."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    n = len(payload) if isinstance(payload, list) else len(payload.get("records", []))
    print(f"wrote {n} records to {path}")
