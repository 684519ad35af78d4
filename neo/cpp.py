"""The C++ extension ``neo._C`` (built from ``csrc/`` by setup.py), where it is built."""

from __future__ import annotations

from types import ModuleType
from typing import Optional

__all__ = ["cpu_kernels"]


def cpu_kernels(op: str) -> Optional[ModuleType]:
    """``neo._C`` if it is built and has ``op`` (a build of older sources may lack newer ops), else None."""
    try:
        from neo import _C
    except ImportError:
        return None
    return _C if hasattr(_C, op) else None
