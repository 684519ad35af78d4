"""Helpers shared by the benchmark scripts in tools/ (run as scripts: tools/ is on sys.path)."""

from __future__ import annotations


def quiet_peer_logs() -> None:
    """Silence TorchRec's planner warnings and torch.fx notices (they would bury the result tables)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("torchrec", "torch.fx", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)
