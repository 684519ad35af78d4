"""Tests of the scripts in tools/, which run as scripts (not a package): :func:`load_tool` loads
one by path, with tools/ on ``sys.path`` for its ``bench_common``."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")


def load_tool(script: str) -> ModuleType:
    """The module of ``tools/<script>`` (e.g. ``"soak.py"``), loaded anew on each call."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    spec = importlib.util.spec_from_file_location(f"neo_tools_{script[:-3]}", os.path.join(TOOLS, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
