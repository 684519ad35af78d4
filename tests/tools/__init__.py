"""Tests of the scripts in tools/, which run as scripts (not a package): :func:`load_tool` loads
one by path, with tools/ on ``sys.path`` for its ``bench_common``."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")


def load_tool(script: str) -> ModuleType:
    """The module of ``tools/<script>`` (e.g. ``"soak.py"``), loaded anew on each call, and
    registered in ``sys.modules`` as an import would be (dataclasses look their
    module up there)."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    name = f"neo_tools_{script[:-3]}"
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, script))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
