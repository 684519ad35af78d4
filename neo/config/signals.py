"""Names of the signals ``train.stop_signals`` may list (see neo/train/stop.py)."""

from __future__ import annotations

import signal
from typing import List, Sequence

from neo.config.embedding import ConfigError

__all__ = ["STOP_SIGNALS", "stop_signal_names"]

# The signals a job is asked to stop with: by torchrun and Kubernetes (SIGTERM), by SLURM's
# --signal and other schedulers (SIGUSR1, SIGUSR2), by a closed terminal (SIGHUP). SIGINT stays
# Python's KeyboardInterrupt; SIGKILL and SIGSTOP cannot be caught.
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")


def stop_signal_names(names: Sequence[str], where: str) -> List[str]:
    """``names`` as canonical signal names (``TERM``, ``sigterm`` -> ``SIGTERM``), each once, in
    order; a ConfigError naming the field for one that is not in STOP_SIGNALS."""
    if isinstance(names, str):
        raise ConfigError(f"{where}: must be a list of signal names, e.g. [SIGTERM], got {names!r}")
    out: List[str] = []
    for raw in names:
        name = str(raw).strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name not in STOP_SIGNALS:
            why = "cannot be caught" if name in ("SIGKILL", "SIGSTOP") else \
                "stays Python's KeyboardInterrupt" if name == "SIGINT" else "is not a stop signal"
            raise ConfigError(f"{where}: {raw!r} {why}; choose among {list(STOP_SIGNALS)}")
        if not hasattr(signal, name):
            raise ConfigError(f"{where}: {name} does not exist on this platform")
        if name not in out:
            out.append(name)
    return out
